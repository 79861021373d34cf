// The model's view of the cluster: only the fields Weir needs, already normalised.
// Sources convert Kubernetes objects into these; nothing downstream sees raw API objects
// except the NetworkPolicy spec, which the model validates itself (see policy.ts).

export type Labels = Readonly<Record<string, string>>;

export type Protocol = 'TCP' | 'UDP' | 'SCTP';
export const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

export type Family = 4 | 6;
export const FAMILIES: readonly Family[] = [4, 6];

export interface ContainerPort {
  readonly name: string;
  readonly port: number;
  readonly protocol: Protocol;
}

export interface Pod {
  /** Unique identity: the UID from the API server, or namespace/name in manifest mode. */
  readonly uid: string;
  readonly namespace: string;
  readonly name: string;
  readonly labels: Labels;
  readonly nodeName: string;
  readonly hostNetwork: boolean;
  /** Pending | Running | Succeeded | Failed | Unknown */
  readonly phase: string;
  /** True once metadata.deletionTimestamp is set. */
  readonly terminating: boolean;
  /** status.podIPs (IPv4 and/or IPv6), canonical text form. */
  readonly ips: readonly string[];
  /** Named container ports, for named-port rules. */
  readonly ports: readonly ContainerPort[];
}

export interface Namespace {
  readonly name: string;
  readonly labels: Labels;
  /** The `weir.dev/audit` annotation as written (absent: none); see annotations.ts. */
  readonly audit?: string;
  /** The `weir.dev/cut-existing` annotation as written (absent: none). */
  readonly cutExisting?: string;
}

/** Where a local pod's address really lives: the node-side bridge port of its interface. */
export interface PodInterface {
  readonly ip: string;
  readonly port: string;
}

export interface Node {
  readonly name: string;
  readonly podCIDRs: readonly string[];
}

// ---- Raw NetworkPolicy (networking.k8s.io/v1), as untrusted input ------------------------
// Every field is optional/unknown here: policy.ts validates and reports precise paths.

export interface RawLabelSelectorRequirement {
  key?: unknown;
  operator?: unknown;
  values?: unknown;
}
export interface RawLabelSelector {
  matchLabels?: unknown;
  matchExpressions?: unknown;
}

/** What a source reads of a policy object, NetworkPolicy or ClusterNetworkPolicy, as untrusted
 *  input (sources/convert.ts reads both the same way). */
export interface RawPolicyObject {
  readonly name: string;
  readonly uid: string;
  readonly generation: number;
  /** The spec exactly as received; validated by compilePolicy or compileClusterNetworkPolicy. */
  readonly spec: unknown;
  /** Problems a source found outside the spec (metadata, apiVersion), each at its field path
   *  (`metadata.labels.version`, `apiVersion`). Any makes the policy invalid, like a bad spec. */
  readonly errors?: readonly PolicyError[];
  /** Its `weir.dev/*` annotations as written (the others are no concern of Weir's). */
  readonly annotations?: Labels;
}

export interface RawNetworkPolicy extends RawPolicyObject {
  readonly namespace: string;
}

export type ObjectKind = 'Pod' | 'Namespace' | 'Node' | 'NetworkPolicy' | 'ClusterNetworkPolicy';

/** One change delivered by a source. Both sources (manifests, kube) emit exactly these. */
export type ModelEvent =
  | { readonly kind: 'Pod'; readonly op: 'upsert'; readonly object: Pod }
  | { readonly kind: 'Pod'; readonly op: 'delete'; readonly uid: string }
  | { readonly kind: 'Namespace'; readonly op: 'upsert'; readonly object: Namespace }
  | { readonly kind: 'Namespace'; readonly op: 'delete'; readonly name: string }
  | { readonly kind: 'Node'; readonly op: 'upsert'; readonly object: Node }
  | { readonly kind: 'Node'; readonly op: 'delete'; readonly name: string }
  | { readonly kind: 'NetworkPolicy'; readonly op: 'upsert'; readonly object: RawNetworkPolicy }
  | { readonly kind: 'NetworkPolicy'; readonly op: 'delete'; readonly namespace: string; readonly name: string }
  | { readonly kind: 'ClusterNetworkPolicy'; readonly op: 'upsert'; readonly object: RawClusterNetworkPolicy }
  | { readonly kind: 'ClusterNetworkPolicy'; readonly op: 'delete'; readonly name: string };

/** A local pod address and the bridge port it lives behind: learned from the node's kernel,
 *  not from the cluster, so it is not a ModelEvent of the sources' object stream. */
export type PodInterfaceEvent = { readonly kind: 'PodInterface'; readonly op: 'upsert'; readonly object: PodInterface } | { readonly kind: 'PodInterface'; readonly op: 'delete'; readonly ip: string };

/** Everything calc consumes. */
export type CalcEvent = ModelEvent | PodInterfaceEvent;

export function policyKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

export function familyOf(ip: string): Family {
  return ip.includes(':') ? 6 : 4;
}

// ---- Compiled (validated, normalised) NetworkPolicy -----------------------------------------

export type SelectorOperator = 'In' | 'NotIn' | 'Exists' | 'DoesNotExist';

export interface Requirement {
  readonly key: string;
  readonly operator: SelectorOperator;
  /** Sorted, de-duplicated. matchLabels k: v becomes { key: k, operator: 'In', values: [v] }. */
  readonly values: readonly string[];
}

/** A parsed label selector. Two selectors with the same meaning have the same `key`. */
export interface Selector {
  /** Canonical text: requirements sorted by key, operator, values. '' for the empty selector. */
  readonly key: string;
  readonly requirements: readonly Requirement[];
}

/** Pods chosen by selectors. `namespace` set: only that namespace (podSelector alone).
 *  `namespaceSelector` set: every namespace whose labels match it. Exactly one of them is set. */
export interface PodsPeer {
  readonly kind: 'pods';
  readonly key: string;
  readonly namespace: string | null;
  readonly namespaceSelector: Selector | null;
  readonly podSelector: Selector;
}

/** Prefixes held together in one hash:net set: aggregated (sorted, disjoint, halves merged,
 *  see aggregateCidrs), so that equal unions have equal keys and share one set. */
export interface PrefixSet {
  readonly kind: 'prefixes';
  /** `net4|10.0.0.0/24,10.0.64.0/18`: the family and every prefix. */
  readonly key: string;
  readonly family: Family;
  readonly cidrs: readonly string[];
}

/** An ipBlock as written: its cidr and its excepts. It matches "inside cidr and not in the
 *  except set", so its cost is linear in its size: excepts are never subtracted into prefixes. */
export interface IpBlockPeer {
  readonly kind: 'ipBlock';
  readonly family: Family;
  /** Canonical network (host bits cleared); may be a /0. */
  readonly cidr: string;
  /** Every except (all strictly inside cidr, so never a /0) aggregated no wider than cidr's
   *  halves; null when there are none. When they cover the whole cidr the block matches nothing. */
  readonly except: PrefixSet | null;
}

export type Peer = PodsPeer | IpBlockPeer;

/** One entry of `ports`. Neither port nor name: every port of the protocol. */
export interface PortMatch {
  readonly protocol: Protocol;
  readonly port?: number;
  readonly endPort?: number;
  /** A named port, resolved against container ports of the receiving pod. */
  readonly name?: string;
}

export interface PolicyRule {
  /** null: any peer (from/to missing or empty), including outside the cluster. */
  readonly peers: readonly Peer[] | null;
  /** null: every port of every protocol. */
  readonly ports: readonly PortMatch[] | null;
}

export interface PolicyError {
  /** Field path, e.g. spec.ingress[0].from[1].ipBlock.except[0] */
  readonly path: string;
  readonly message: string;
}

export interface CompiledPolicy {
  readonly key: string;
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  readonly generation: number;
  /** null only for an invalid policy whose podSelector could not be read: it then isolates
   *  every pod of its namespace, so that a broken policy never opens traffic. */
  readonly podSelector: Selector | null;
  /** null: the policy does not isolate that direction. [] isolates and allows nothing. */
  readonly ingress: readonly PolicyRule[] | null;
  readonly egress: readonly PolicyRule[] | null;
  /** Non-empty means invalid: then ingress/egress hold no rules ([] or null), so the pods it
   *  selects stay isolated in the directions it names (both if those are unreadable). */
  readonly errors: readonly PolicyError[];
  /** From `weir.dev/audit`: what its rules log; null: its namespace's level (or the agent's). */
  readonly audit: AuditLevel | null;
  /** From `weir.dev/enforcement`: 'audit' policies never isolate or change a verdict; they only
   *  log what they would drop. An invalid policy is enforced unless it asks for audit. */
  readonly enforcement: Enforcement;
  /** From `weir.dev/cut-existing: "true"`: the pods it selects have the connections their new
   *  rules deny cut after each write (absent: no opt-in). */
  readonly cutExisting?: true;
}

/** What the audit log records for a policy's connections: nothing, drops, or everything. */
export type AuditLevel = 'off' | 'deny' | 'all';
export type Enforcement = 'enforce' | 'audit';

// ---- ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1), raw and compiled ----------------
// sigs.k8s.io/network-policy-api v0.3.0; cluster-network-policy.ts validates and compiles it.

/** A ClusterNetworkPolicy as untrusted input: cluster-scoped, so its name is its identity. */
export type RawClusterNetworkPolicy = RawPolicyObject;

/** Admin is evaluated before every NetworkPolicy, Baseline after them. */
export type CnpTier = 'Admin' | 'Baseline';
export type CnpAction = 'Accept' | 'Deny' | 'Pass';

/** One ingress or egress rule, in spec order within its direction. */
export interface CnpRule {
  /** spec.ingress[i].name as written; '' when not given (the API makes it optional). */
  readonly name: string;
  /** Its position in spec.ingress or spec.egress; -1 for FAIL_CLOSED_CNP_RULE. */
  readonly index: number;
  readonly action: CnpAction;
  /** `namespaces` and `pods` peers as PodsPeer (namespace null, namespaceSelector set; keys as
   *  a NetworkPolicy's, so equal peers share a set), each `networks` CIDR as an IpBlockPeer
   *  without except (may be a /0). null: any address, only in FAIL_CLOSED_CNP_RULE. */
  readonly peers: readonly Peer[] | null;
  /** null: `protocols` not given, so every protocol and port (ICMP too). Otherwise never empty:
   *  numbers and ranges as { protocol, port, endPort? }; a destinationNamedPort as one entry
   *  per protocol { protocol, name }, since the API's named port names no protocol. */
  readonly ports: readonly PortMatch[] | null;
}

export interface CompiledClusterNetworkPolicy {
  /** The name: a cluster-scoped object's identity. Never equal to a NetworkPolicy's key
   *  (namespace/name), since a name holds no '/'. */
  readonly key: string;
  readonly name: string;
  readonly uid: string;
  readonly generation: number;
  /** An invalid policy whose tier cannot be read is Admin (no NetworkPolicy can loosen it). */
  readonly tier: CnpTier;
  /** 0..1000, lower first; an unreadable one is 0. Ties: see compareClusterNetworkPolicies. */
  readonly priority: number;
  /** The pods it applies to (host-networked ones never: the caller filters them), as a peer:
   *  namespace null, namespaceSelector and podSelector set (`{}` for a namespaces subject).
   *  An invalid policy whose subject cannot be read selects every pod of the cluster. */
  readonly subject: PodsPeer;
  /** [] when the spec has none: the policy then does not affect that direction. */
  readonly ingress: readonly CnpRule[];
  readonly egress: readonly CnpRule[];
  /** Non-empty means invalid: then each direction it names (spec.ingress or spec.egress given
   *  and not empty, or the spec unreadable) holds exactly [FAIL_CLOSED_CNP_RULE], and the other
   *  holds []. */
  readonly errors: readonly PolicyError[];
  /** From `weir.dev/audit`: what its rules log; null: the agent's default. */
  readonly audit: AuditLevel | null;
  /** From `weir.dev/cut-existing: "true"`, as on a NetworkPolicy. */
  readonly cutExisting?: true;
}
