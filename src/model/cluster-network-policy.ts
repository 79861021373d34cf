// ClusterNetworkPolicy spec (policy.networking.k8s.io/v1beta1, network-policy-api v0.3.0) ->
// CompiledClusterNetworkPolicy. The spec is untrusted (manifest mode reads files directly, and
// a cluster may serve a newer CRD than this one), so every field is checked as the standard
// channel's CRD checks it, CEL rules included, and every error is reported with its path. An
// invalid policy keeps no rule of its own: in each direction it names it denies everything to
// its subjects at its tier and priority (fail closed; docs/design/model.md).

import { formatCidr, parseCidr, parseIp } from './cidr.ts';
import { readPolicyAnnotations, ENFORCEMENT_ANNOTATION } from './annotations.ts';
import { CNP_LIMITS, compileProtocols, EXPERIMENTAL_PEERS, exactlyOne, isInteger, readList } from './cnp-fields.ts';
import { compareStrings } from './order.ts';
import { capPolicyErrors } from './policy.ts';
import { checkKnownFields, describeValue, exact, isPlainObject, matchAllSelector, quote, selectorOrNull } from './selector.ts';
import type { CnpAction, CnpRule, CnpTier, CompiledClusterNetworkPolicy, IpBlockPeer, Peer, PodsPeer, PolicyError, RawClusterNetworkPolicy, Selector } from './types.ts';

const SPEC_FIELDS = ['tier', 'priority', 'subject', 'ingress', 'egress'] as const;
const SUBJECT_FIELDS = ['namespaces', 'pods'] as const;
const NAMESPACED_POD_FIELDS = ['namespaceSelector', 'podSelector'] as const;
const INGRESS_RULE_FIELDS = ['name', 'action', 'from', 'protocols'] as const;
const EGRESS_RULE_FIELDS = ['name', 'action', 'to', 'protocols'] as const;
const INGRESS_PEER_FIELDS = ['namespaces', 'pods'] as const;
/** nodes and domainNames are the experimental channel's: known, so refused by name. */
const EGRESS_PEER_FIELDS = ['namespaces', 'pods', 'networks', 'nodes', 'domainNames'] as const;
const TIERS: readonly CnpTier[] = ['Admin', 'Baseline'];
const ACTIONS: readonly CnpAction[] = ['Accept', 'Deny', 'Pass'];

/** What an invalid policy holds in each direction it names: deny every address, every port.
 *  Its index is -1, which no rule of a spec has, so audit and status can tell it apart. */
export const FAIL_CLOSED_CNP_RULE: CnpRule = Object.freeze({ name: '', index: -1, action: 'Deny', peers: null, ports: null });

const ALL_PODS: PodsPeer = subjectPeer(matchAllSelector(), matchAllSelector());

export function compileClusterNetworkPolicy(raw: RawClusterNetworkPolicy): CompiledClusterNetworkPolicy {
  // What the source found wrong outside the spec comes first: the policy is then invalid, yet
  // its spec is still read, so it fails closed exactly where it would have applied.
  const errors: PolicyError[] = [...(raw.errors ?? [])];
  const { [ENFORCEMENT_ANNOTATION]: enforcement, ...others } = raw.annotations ?? {};
  const { audit, cutExisting } = readPolicyAnnotations(others, errors);
  if (enforcement !== undefined) {
    errors.push({
      path: `metadata.annotations[${JSON.stringify(ENFORCEMENT_ANNOTATION)}]`,
      message: 'audit-only mode is for NetworkPolicies; a ClusterNetworkPolicy is always enforced (remove the annotation)',
    });
  }
  const meta = { key: raw.name, name: raw.name, uid: raw.uid, generation: raw.generation, audit, ...(cutExisting ? { cutExisting } : {}) };
  const spec = raw.spec;
  if (!isPlainObject(spec)) {
    errors.push({ path: 'spec', message: `must be an object, got ${describeValue(spec)}` });
    const deny = [FAIL_CLOSED_CNP_RULE];
    return { ...meta, tier: 'Admin', priority: 0, subject: ALL_PODS, ingress: deny, egress: deny, errors: capPolicyErrors(errors) };
  }
  checkKnownFields(spec, 'spec', SPEC_FIELDS, errors);
  const tier = readTier(spec.tier, errors);
  const priority = readPriority(spec.priority, errors);
  const subject = readSubject(spec.subject, errors);
  const ingress = compileRules(spec.ingress, 'spec.ingress', 'from', errors);
  const egress = compileRules(spec.egress, 'spec.egress', 'to', errors);

  if (errors.length > 0) {
    const named = (rules: unknown) => (rules === undefined || rules === null || (Array.isArray(rules) && rules.length === 0) ? [] : [FAIL_CLOSED_CNP_RULE]);
    return {
      ...meta,
      tier: tier ?? 'Admin',
      priority: priority ?? 0,
      subject: subject ?? ALL_PODS,
      ingress: named(spec.ingress),
      egress: named(spec.egress),
      errors: capPolicyErrors(errors),
    };
  }
  return { ...meta, tier: tier!, priority: priority!, subject: subject!, ingress, egress, errors: [] };
}

/**
 * The order of evaluation within a tier, and across tiers: Admin before Baseline, then lower
 * priority first. The API leaves the order of equal priorities to the implementation; Weir
 * orders them by name (code units), so every agent decides the same way.
 */
export function compareClusterNetworkPolicies(a: CompiledClusterNetworkPolicy, b: CompiledClusterNetworkPolicy): number {
  return TIERS.indexOf(a.tier) - TIERS.indexOf(b.tier) || a.priority - b.priority || compareStrings(a.name, b.name);
}

function readTier(raw: unknown, errors: PolicyError[]): CnpTier | null {
  if (raw === undefined || raw === null) {
    errors.push({ path: 'spec.tier', message: 'required; expected Admin or Baseline' });
    return null;
  }
  if (typeof raw === 'string' && (TIERS as readonly string[]).includes(raw)) return raw as CnpTier;
  errors.push({ path: 'spec.tier', message: `unsupported tier ${describeValue(raw)}; expected Admin or Baseline` });
  return null;
}

function readPriority(raw: unknown, errors: PolicyError[]): number | null {
  if (raw === undefined || raw === null) {
    errors.push({ path: 'spec.priority', message: `required; a number from 0 to ${CNP_LIMITS.priority}` });
    return null;
  }
  if (isInteger(raw) && raw >= 0 && raw <= CNP_LIMITS.priority) return raw;
  errors.push({ path: 'spec.priority', message: `must be an integer from 0 to ${CNP_LIMITS.priority}, got ${describeValue(raw)}` });
  return null;
}

function readSubject(raw: unknown, errors: PolicyError[]): PodsPeer | null {
  const path = 'spec.subject';
  if (raw === undefined || raw === null) {
    errors.push({ path, message: 'required; set namespaces or pods' });
    return null;
  }
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with namespaces or pods, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, SUBJECT_FIELDS, errors);
  const which = exactlyOne(raw, path, SUBJECT_FIELDS, errors);
  // Every part is read even when the combination is wrong, so that all errors are reported.
  const ns = raw.namespaces !== undefined && raw.namespaces !== null ? selectorOrNull(raw.namespaces, `${path}.namespaces`, errors) : null;
  const pods = raw.pods !== undefined && raw.pods !== null ? readNamespacedPod(raw.pods, `${path}.pods`, errors) : null;
  if (errors.length > before || which === null) return null;
  if (which === 'namespaces') return subjectPeer(ns!, matchAllSelector());
  return pods;
}

/** `pods: {namespaceSelector, podSelector}`: podSelector required, namespaceSelector optional
 *  (absent: every namespace). */
function readNamespacedPod(raw: unknown, path: string, errors: PolicyError[]): PodsPeer | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with namespaceSelector and podSelector, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, NAMESPACED_POD_FIELDS, errors);
  const nsRaw = raw.namespaceSelector;
  const ns = nsRaw === undefined || nsRaw === null ? matchAllSelector() : selectorOrNull(nsRaw, `${path}.namespaceSelector`, errors);
  let podSel: Selector | null = null;
  if (raw.podSelector === undefined || raw.podSelector === null) {
    errors.push({ path: `${path}.podSelector`, message: 'required; use {} to select every pod of the selected namespaces' });
  } else {
    podSel = selectorOrNull(raw.podSelector, `${path}.podSelector`, errors);
  }
  if (errors.length > before || ns === null || podSel === null) return null;
  return subjectPeer(ns, podSel);
}

/** Pods of the namespaces `ns` selects whose labels match `pods`, keyed as a NetworkPolicy's
 *  namespaceSelector peer, so that equal peers of both APIs share one set. */
function subjectPeer(ns: Selector, pods: Selector): PodsPeer {
  return { kind: 'pods', key: `pods|nssel=${ns.key}|${pods.key}`, namespace: null, namespaceSelector: ns, podSelector: pods };
}

// ---- Rules -----------------------------------------------------------------------------

function compileRules(raw: unknown, path: string, peerField: 'from' | 'to', errors: PolicyError[]): CnpRule[] {
  const list = readList(raw, path, 'rules', CNP_LIMITS.rules, errors);
  if (list === null) return [];
  const rules: CnpRule[] = [];
  for (let i = 0; i < list.length; i++) {
    const rule = compileRule(list[i], `${path}[${i}]`, i, peerField, errors);
    if (rule !== null) rules.push(rule);
  }
  return exact(rules);
}

function compileRule(raw: unknown, path: string, index: number, peerField: 'from' | 'to', errors: PolicyError[]): CnpRule | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with action, ${peerField} and protocols, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, peerField === 'from' ? INGRESS_RULE_FIELDS : EGRESS_RULE_FIELDS, errors);

  let name = '';
  if (raw.name !== undefined && raw.name !== null) {
    if (typeof raw.name !== 'string') errors.push({ path: `${path}.name`, message: `must be a string, got ${describeValue(raw.name)}` });
    else if (raw.name.length > CNP_LIMITS.ruleName) errors.push({ path: `${path}.name`, message: `must be at most ${CNP_LIMITS.ruleName} characters, got ${raw.name.length}` });
    else name = raw.name;
  }

  let action: CnpAction | null = null;
  if (raw.action === undefined || raw.action === null) errors.push({ path: `${path}.action`, message: 'required; expected Accept, Deny or Pass' });
  else if (typeof raw.action === 'string' && (ACTIONS as readonly string[]).includes(raw.action)) action = raw.action as CnpAction;
  else errors.push({ path: `${path}.action`, message: `unsupported action ${describeValue(raw.action)}; expected Accept, Deny or Pass` });

  const peers = compilePeers(raw[peerField], `${path}.${peerField}`, peerField, errors);
  const ports = compileProtocols(raw.protocols, `${path}.protocols`, errors);

  // The API's rule (experimental CRD, CEL): a network has no named ports.
  if (peerField === 'to' && Array.isArray(raw.to) && Array.isArray(raw.protocols)) {
    const network = raw.to.findIndex((p) => isPlainObject(p) && p.networks !== undefined && p.networks !== null);
    if (network >= 0) {
      raw.protocols.forEach((p: unknown, k: number) => {
        if (isPlainObject(p) && p.destinationNamedPort !== undefined && p.destinationNamedPort !== null) {
          errors.push({
            path: `${path}.protocols[${k}].destinationNamedPort`,
            message: `cannot be used in a rule with a networks peer (${path}.to[${network}]): a network has no named ports`,
          });
        }
      });
    }
  }
  if (errors.length > before || action === null || peers === null) return null;
  return { name, index, action, peers, ports };
}

// ---- Peers -----------------------------------------------------------------------------

function compilePeers(raw: unknown, path: string, peerField: 'from' | 'to', errors: PolicyError[]): Peer[] | null {
  if (raw === undefined || raw === null) {
    errors.push({ path, message: 'required; a list of at least one peer' });
    return null;
  }
  const list = readList(raw, path, 'peers', CNP_LIMITS.peers, errors);
  if (list === null) return null;
  if (list.length === 0) {
    errors.push({ path, message: 'must hold at least one peer' });
    return null;
  }
  const fields = peerField === 'from' ? INGRESS_PEER_FIELDS : EGRESS_PEER_FIELDS;
  const peers: Peer[] = [];
  const before = errors.length;
  for (let i = 0; i < list.length; i++) peers.push(...compilePeer(list[i], `${path}[${i}]`, fields, errors));
  return errors.length > before ? null : exact(peers);
}

/** One peer: a PodsPeer, or one IpBlockPeer per networks CIDR. */
function compilePeer(raw: unknown, path: string, fields: readonly string[], errors: PolicyError[]): Peer[] {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with one of ${fields.filter((f) => !EXPERIMENTAL_PEERS.has(f)).join(', ')}, got ${describeValue(raw)}` });
    return [];
  }
  const before = errors.length;
  checkKnownFields(raw, path, fields, errors);
  for (const f of EXPERIMENTAL_PEERS) {
    if (fields.includes(f) && raw[f] !== undefined && raw[f] !== null) {
      errors.push({ path: `${path}.${f}`, message: `not supported by Weir: ${f} peers are in network-policy-api's experimental channel, and Weir enforces the standard one` });
    }
  }
  const which = exactlyOne(raw, path, fields, errors);
  const ns = raw.namespaces !== undefined && raw.namespaces !== null ? selectorOrNull(raw.namespaces, `${path}.namespaces`, errors) : null;
  const pods = raw.pods !== undefined && raw.pods !== null ? readNamespacedPod(raw.pods, `${path}.pods`, errors) : null;
  const networks = fields.includes('networks') && raw.networks !== undefined && raw.networks !== null ? readNetworks(raw.networks, `${path}.networks`, errors) : [];
  if (errors.length > before || which === null) return [];
  if (which === 'namespaces') return [subjectPeer(ns!, matchAllSelector())];
  if (which === 'pods') return [pods!];
  return networks;
}

/** networks: 1 to 25 distinct CIDRs with no host bits set (the CRD's CEL rule
 *  `cidr(self) == cidr(self).masked()`), each an ipBlock without except. */
function readNetworks(raw: unknown, path: string, errors: PolicyError[]): IpBlockPeer[] {
  const list = readList(raw, path, 'CIDRs', CNP_LIMITS.networks, errors);
  if (list === null) return [];
  if (list.length === 0) {
    errors.push({ path, message: 'must hold at least one CIDR' });
    return [];
  }
  const out: IpBlockPeer[] = [];
  const seen = new Set<string>();
  for (let i = 0; i < list.length; i++) {
    const text: unknown = list[i];
    const p = `${path}[${i}]`;
    if (typeof text !== 'string') {
      errors.push({ path: p, message: `must be a CIDR string, got ${describeValue(text)}` });
      continue;
    }
    if (text.length > CNP_LIMITS.cidr) {
      errors.push({ path: p, message: `must be at most ${CNP_LIMITS.cidr} characters, got ${text.length}` });
      continue;
    }
    const c = parseCidr(text);
    if ('error' in c) {
      errors.push({ path: p, message: c.error });
      continue;
    }
    const address = parseIp(text.slice(0, text.indexOf('/')));
    const canonical = formatCidr(c);
    if (!('error' in address) && address.value !== c.base) {
      errors.push({ path: p, message: `${quote(text)} has host bits set; write ${canonical}` });
      continue;
    }
    // The API keeps networks as a set (listType=set): it refuses a value written twice.
    if (seen.has(text)) {
      errors.push({ path: p, message: `duplicate CIDR ${quote(text)}` });
      continue;
    }
    seen.add(text);
    out.push({ kind: 'ipBlock', family: c.family, cidr: canonical, except: null });
  }
  return out;
}
