// `weir explain`: why a new connection from SRC to DST passes or is dropped. The nodes' desired
// dataplane is computed by calc from the same events the agent gets (one Calculator per node
// that polices an end), a new packet is walked through it (evaluate.ts), and each direction's
// outcome is told with the rule that decided it and the policies behind that rule
// (direction.ts, attribute.ts). Pure: no I/O, no clock.

import { Calculator } from '../calc/index.ts';
import type { AuditTag } from '../calc/audit-tags.ts';
import type { CalcConfig } from '../calc/config.ts';
import type { DesiredDataplane, Rule } from '../calc/desired.ts';
import type { Direction } from '../calc/rules.ts';
import type { CalcEvent, Family, ModelEvent, Pod, Protocol } from '../model/types.ts';
import type { ClusterRuleRef, PolicyRuleRef } from './attribute.ts';
import type { Packet, SetLookup, Walk } from './evaluate.ts';
import { walk } from './evaluate.ts';
import { direction } from './direction.ts';
import type { Endpoint, World } from './resolve.ts';
import { addressesOf, ExplainInputError, podRef, resolveEndpoint, worldOf } from './resolve.ts';

/** What the agent's Calculator is built with, but for its node: explain builds one per node. */
export type ExplainConfig = Omit<CalcConfig, 'nodeName'>;

export interface ExplainRequest {
  readonly source: string;
  readonly destination: string;
  readonly protocol: Protocol;
  readonly port: number;
  /** Only this family (default: every family both ends have). */
  readonly family?: Family;
}

export interface EndpointView {
  /** As given on the command line. */
  readonly given: string;
  readonly kind: 'pod' | 'host' | 'address';
  /** namespace/name of a pod (a host-networked one too). */
  readonly pod?: string;
  readonly node?: string;
  readonly ips: readonly string[];
  /** What an address is, in words. */
  readonly note?: string;
}

/** One rule on the packet's way: where it is and what it is. */
export interface PathStep {
  readonly chain: string;
  /** 1-based, as iptables numbers the rules of a chain: the line of the payload (a rule with
   *  a long port list is written as several lines; this is the one the packet matches). */
  readonly position: number;
  readonly rule: Rule;
  readonly lookups: readonly SetLookup[];
}

export type DirectionVerdict = 'allowed' | 'denied' | 'not isolated';

export type Reason =
  /** A NetworkPolicy rule allows it. */
  | 'network-policy'
  /** A ClusterNetworkPolicy rule decided (Admin Accept or Deny, Baseline Accept or Deny). */
  | 'cluster-policy'
  /** Policies isolate the pod and none of their rules allows it. */
  | 'default-deny'
  /** No NetworkPolicy isolates the pod that way (and no tier rule decided). */
  | 'not-isolated'
  /** A pod reaching itself through the bridge (a Service hairpin) is always allowed. */
  | 'self'
  /** The address is no pod this node knows: dropped (fail closed). */
  | 'fail-closed'
  /** Something the chains did that explain has no words for: see `rule`. */
  | 'other';

export interface DirectionResult {
  readonly direction: Direction;
  /** The node whose chains decide this direction. */
  readonly node: string;
  /** namespace/name of the pod policed; null for an address of the node's pod CIDR no pod holds. */
  readonly pod: string | null;
  readonly verdict: DirectionVerdict;
  readonly reason: Reason;
  /** NetworkPolicy rules that allow it (every one, in policy then rule order). */
  readonly allowedBy?: readonly PolicyRuleRef[];
  /** The ClusterNetworkPolicy rule that decided (the first match in evaluation order), and the
   *  other rules of its run that match too. */
  readonly clusterRule?: ClusterRuleRef & { readonly alsoMatching: readonly ClusterRuleRef[] };
  /** An Admin Pass that handed the packet on to NetworkPolicy (or the Baseline tier). */
  readonly passedBy?: ClusterRuleRef;
  /** For a default deny: the policies isolating the pod that way. */
  readonly isolatedBy?: readonly { readonly namespace: string; readonly name: string; readonly invalid: boolean }[];
  /** Audit-only policies selecting the pod (they never decide): would they drop it? */
  readonly auditOnly?: { readonly policies: readonly string[]; readonly wouldAllowBy: readonly PolicyRuleRef[] };
  /** The kernel rule that decided, and whether it stands for several policies' peers. */
  readonly rule: (PathStep & { readonly merged: boolean }) | null;
  /** Every rule that matched on the way, from the top chain. */
  readonly path: readonly PathStep[];
  /** Audit log prefixes the packet is copied with, and what the agent reads them as. */
  readonly logged: readonly { readonly prefix: string; readonly meaning: AuditTag | null }[];
  /** False when the packet never gets here: the other direction dropped it first, on this
   *  same node; the result says what this direction alone would do. */
  readonly reached: boolean;
  /** Where the chains and the policies' own rules disagree (a bug to report). */
  readonly disagreement?: string;
}

export interface FamilyResult {
  readonly family: Family;
  readonly src: string;
  readonly dst: string;
  /** Allowed only when every direction that applies allows it. */
  readonly verdict: 'allowed' | 'denied';
  readonly directions: readonly DirectionResult[];
  /** Why no node polices this packet at all, when none does. */
  readonly unpoliced?: string;
}

export interface Explanation {
  readonly source: EndpointView;
  readonly destination: EndpointView;
  readonly protocol: Protocol;
  readonly port: number;
  readonly families: readonly FamilyResult[];
}

/** The bridge port explain binds each local pod's address to when it does not know the real
 *  one (the agent learns it from the node's kernel; any name gives the same rules at the same
 *  positions, only the port named differs). */
export const bridgePortOf = (pod: Pod): string => `port-of:${podRef(pod)}`;

export interface ExplainerOptions {
  /** A node's real bridge ports (address -> port), as the agent scans them on that node
   *  (--node-check): its chains then name the ports the kernel's do. */
  readonly bridgePorts?: { readonly node: string; readonly ports: ReadonlyMap<string, string> };
}

export interface NodeState {
  readonly calc: Calculator;
  /** Local pod address -> the bridge port its chains bind it to. */
  readonly ports: ReadonlyMap<string, string>;
}

/** Explains one request over the events of a full view of the cluster. */
export function explain(events: readonly ModelEvent[], req: ExplainRequest, cfg: ExplainConfig): Explanation {
  return explainer(events, cfg)(req);
}

/** Explains requests over one view of the cluster; each node's chains are computed once, on
 *  the first request that needs them. */
export interface Explainer {
  (req: ExplainRequest): Explanation;
  /** The desired dataplane explain computed for a node (what --node-check compares). */
  desired(node: string): DesiredDataplane;
}

export function explainer(events: readonly ModelEvent[], cfg: ExplainConfig, opts: ExplainerOptions = {}): Explainer {
  const world = worldOf(events);
  const nodes = new Map<string, NodeState>();
  const nodeState = (name: string): NodeState => {
    let s = nodes.get(name);
    if (!s) nodes.set(name, (s = compileNode(events, world, name, cfg, opts.bridgePorts?.node === name ? opts.bridgePorts.ports : undefined)));
    return s;
  };
  const ex = (req: ExplainRequest): Explanation => {
    if (!Number.isInteger(req.port) || req.port < 1 || req.port > 65535) throw new ExplainInputError(`port ${req.port} is not a port number from 1 to 65535`);
    const src = resolveEndpoint(world, req.source, 'source');
    const dst = resolveEndpoint(world, req.destination, 'destination');
    const policed = (e: Endpoint) => e.kind === 'pod' || (e.kind === 'address' && e.podCidrOf !== undefined);
    if (!policed(src) && !policed(dst)) {
      const what = (e: Endpoint) =>
        e.kind === 'host' ? `${e.text} is node ${e.pod.nodeName}'s own address` : `${e.text} is outside every known range (no pod holds it, and it is in no node's pod CIDR)`;
      throw new ExplainInputError(`neither end is a pod: ${what(src)}, and ${what(dst)}; Weir polices only traffic to and from pods`);
    }
    const families = familiesOf(src, dst, req.family);
    const results = families.map((family) => explainFamily(src, dst, family, req, cfg, nodeState));
    return { source: viewOf(src), destination: viewOf(dst), protocol: req.protocol, port: req.port, families: results };
  };
  return Object.assign(ex, { desired: (node: string) => nodeState(node).calc.desired });
}

function familiesOf(src: Endpoint, dst: Endpoint, only: Family | undefined): Family[] {
  const both = ([4, 6] as const).filter((f) => addressesOf(src, f) !== undefined && addressesOf(dst, f) !== undefined);
  const stack = (e: Endpoint) => {
    const fs = ([4, 6] as const).filter((f) => addressesOf(e, f) !== undefined);
    return fs.length === 2 ? 'both IPv4 and IPv6' : `only IPv${fs[0]}`;
  };
  if (both.length === 0) throw new ExplainInputError(`${src.text} has ${stack(src)} and ${dst.text} ${stack(dst)}: no packet can go between them`);
  if (only === undefined) return both;
  if (!both.includes(only)) throw new ExplainInputError(`IPv${only} was asked for, but ${addressesOf(src, only) === undefined ? src.text : dst.text} has no IPv${only} address`);
  return [only];
}

function compileNode(events: readonly ModelEvent[], world: World, nodeName: string, cfg: ExplainConfig, known: ReadonlyMap<string, string> | undefined): NodeState {
  const calc = new Calculator({ ...cfg, nodeName });
  const all: CalcEvent[] = [...events];
  let ports: ReadonlyMap<string, string> = new Map();
  if (cfg.sourceBinding) {
    ports = known ?? new Map(world.pods.filter((p) => p.nodeName === nodeName && !p.hostNetwork).flatMap((p) => p.ips.map((ip) => [ip, bridgePortOf(p)] as const)));
    for (const [ip, port] of ports) all.push({ kind: 'PodInterface', op: 'upsert', object: { ip, port } });
  }
  calc.applyEvents(all);
  return { calc, ports };
}

function viewOf(e: Endpoint): EndpointView {
  if (e.kind === 'address') {
    const note = e.podCidrOf
      ? e.claimedBy
        ? `host-networked pod ${podRef(e.claimedBy)} claims it, yet it is in node ${e.podCidrOf.node}'s pod CIDR ${e.podCidrOf.cidr}, where the node polices pods only: no pod it knows holds it`
        : `no pod holds it; it is in node ${e.podCidrOf.node}'s pod CIDR ${e.podCidrOf.cidr}`
      : "no pod holds it, and it is in no node's pod CIDR: an address outside the cluster's pods";
    return { given: e.text, kind: 'address', ...(e.podCidrOf ? { node: e.podCidrOf.node } : {}), ips: [e.ip], note };
  }
  return { given: e.text, kind: e.kind, pod: podRef(e.pod), node: e.pod.nodeName, ips: e.pod.ips, ...(e.kind === 'host' ? { note: "a host-networked pod: its node's own address" } : {}) };
}

/** The node whose chains police an end, if any. */
function nodeOf(e: Endpoint): string | undefined {
  if (e.kind === 'pod') return e.pod.nodeName || undefined;
  if (e.kind === 'address') return e.podCidrOf?.node;
  return undefined;
}

function explainFamily(src: Endpoint, dst: Endpoint, family: Family, req: ExplainRequest, cfg: ExplainConfig, nodeState: (n: string) => NodeState): FamilyResult {
  const s = addressesOf(src, family)!;
  const d = addressesOf(dst, family)!;
  const base = { family, src: s, dst: d };
  if (!cfg.families.includes(family)) return { ...base, verdict: 'allowed', directions: [], unpoliced: `IPv${family} is not policed (families ${cfg.families.join(',')})` };
  // The kernel delivers them locally, whoever holds the address (a pod, or none any more).
  if (s === d) return { ...base, verdict: 'allowed', directions: [], unpoliced: 'packets to their own source address never leave its network namespace' };
  const srcNode = nodeOf(src);
  const dstNode = nodeOf(dst);
  // A pod and the host-networked end on its own node talk through INPUT or OUTPUT, which Weir
  // does not police.
  const hostOf = (e: Endpoint) => (e.kind === 'host' ? e.pod.nodeName : undefined);
  const egressAt = srcNode !== undefined && hostOf(dst) !== srcNode ? srcNode : undefined;
  const ingressAt = dstNode !== undefined && hostOf(src) !== dstNode ? dstNode : undefined;
  if (egressAt === undefined && ingressAt === undefined) {
    return { ...base, verdict: 'allowed', directions: [], unpoliced: `traffic between a pod and its own node (${srcNode ?? dstNode}) never crosses FORWARD, where Weir polices` };
  }
  const local = (e: Endpoint, node: string) => nodeOf(e) === node;
  const packetAt = (node: string): Packet => ({
    family,
    src: s,
    dst: d,
    protocol: req.protocol,
    dport: req.port,
    ctstate: 'NEW',
    mark: 0,
    ...(local(src, node) && cfg.podBridge ? { inIface: cfg.podBridge } : {}),
    ...(local(dst, node) && cfg.podBridge ? { outIface: cfg.podBridge } : {}),
    ...(src.kind === 'pod' && local(src, node) && nodeState(node).ports.has(s) ? { bridgePortIn: nodeState(node).ports.get(s) } : {}),
  });
  const walks = new Map<string, Walk>();
  const walkAt = (node: string): Walk => {
    let w = walks.get(node);
    if (!w) {
      const { calc } = nodeState(node);
      const desired = calc.desired;
      walks.set(node, (w = walk(desired.chains[family], desired.topChain, packetAt(node), desired.sets)));
    }
    return w;
  };
  const directions: DirectionResult[] = [];
  let egressDropped = false;
  if (egressAt !== undefined) {
    const w = walkAt(egressAt);
    const r = direction('egress', egressAt, src.kind === 'pod' ? src.pod : null, w, true, family, packetAt(egressAt), nodeState(egressAt), cfg);
    egressDropped = r.verdict === 'denied';
    directions.push(r);
  }
  if (ingressAt !== undefined) {
    const { calc } = nodeState(ingressAt);
    let w = walkAt(ingressAt);
    let reached = true;
    if (egressDropped && ingressAt === egressAt) {
      // The packet went no further on this node: walk the ingress half alone.
      const desired = calc.desired;
      w = walk(desired.chains[family], cfg.names.toWorkloadDispatch, packetAt(ingressAt), desired.sets);
      reached = false;
    }
    directions.push(direction('ingress', ingressAt, dst.kind === 'pod' ? dst.pod : null, w, reached, family, packetAt(ingressAt), nodeState(ingressAt), cfg));
  }
  const verdict = directions.every((r) => r.verdict !== 'denied') ? 'allowed' : 'denied';
  return { ...base, verdict, directions };
}

export { ExplainInputError };
