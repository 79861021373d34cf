// Pure rule builders: a compiled policy or a workload becomes structured Rule records.
// No iptables syntax here (that is dataplane/render.ts); only the shape of each chain.

import { aggregateCidrs, parseCidr, prefixSet } from '../model/cidr.ts';
import type { Cidr } from '../model/cidr.ts';
import type { CompiledPolicy, Family, IpBlockPeer, PodsPeer, PolicyRule, PortMatch, PrefixSet, Protocol } from '../model/types.ts';
import { PROTOCOLS } from '../model/types.ts';
import type { Action, Match, PortRange, Rule } from './desired.ts';

export interface MarkBits {
  /** Set by a policy rule that allows the packet; ACCEPTed at the end of the top chain. */
  readonly accept: number;
  /** Reserved next to accept (Calico's "pass"); cleared with it so neither leaks between hops. */
  readonly pass: number;
}

/** A set to use: one per family and canonical content: the pods of a peer (for named ports,
 *  with their resolved ports), a list of prefixes (ipBlocks), or the union of such sets. */
export interface SetSpec {
  readonly family: Family;
  readonly peer: PodsPeer | PrefixSet | UnionPeer;
  readonly namedPort?: { readonly protocol: Protocol; readonly name: string };
}

/** Every member of its parts (hash:net sets of one family): the peers of several policies'
 *  rules that match the same ports, tested with one lookup (see mergePeers). */
export interface UnionPeer {
  readonly kind: 'union';
  /** `union|` and the parts' keys, sorted. */
  readonly key: string;
  readonly parts: readonly SetSpec[];
}

/** The key a set is shared by: equal keys, equal members. */
export function setKey(spec: SetSpec): string {
  return spec.peer.key + (spec.namedPort ? `|port=${spec.namedPort.protocol}/${spec.namedPort.name}` : '');
}

/** A set match before the set has a name: calc acquires the set and names it (resolveMatches). */
export interface SetRef {
  readonly kind: 'setRef';
  readonly spec: SetSpec;
  readonly dir: 'src' | 'dst' | 'dst,dst';
  readonly negate?: boolean;
}

export type SpecMatch = Match | SetRef;

/** One way a policy rule allows a packet: all its matches together. */
export interface AllowAlternative {
  /** The index of the policy rule (in ingress or egress) it comes from. */
  readonly rule: number;
  readonly matches: readonly SpecMatch[];
}

export function resolveMatches(matches: readonly SpecMatch[], useSet: (spec: SetSpec) => string): Match[] {
  return matches.map((m) => (m.kind === 'setRef' ? { kind: 'set', set: useSet(m.spec), dir: m.dir, ...(m.negate ? { negate: true } : {}) } : m));
}

export type Direction = 'ingress' | 'egress';

/** Every pod of the cluster: the destination of an egress named port with no `to`. */
export const ALL_PODS: PodsPeer = {
  kind: 'pods',
  key: 'pods|nssel=|',
  namespace: null,
  namespaceSelector: { key: '', requirements: [] },
  podSelector: { key: '', requirements: [] },
};

/** The pods a policy selects, as a peer: where an ingress named port is resolved. */
export function targetPeer(policy: CompiledPolicy): PodsPeer | null {
  if (!policy.podSelector) return null;
  return {
    kind: 'pods',
    key: `pods|ns=${policy.namespace}|${policy.podSelector.key}`,
    namespace: policy.namespace,
    namespaceSelector: null,
    podSelector: policy.podSelector,
  };
}

/** Numeric ports grouped by protocol; a protocol with no port at all means every port. */
function numericPortMatches(ports: readonly PortMatch[]): Match[] {
  const out: Match[] = [];
  for (const protocol of PROTOCOLS) {
    const mine = ports.filter((p) => p.protocol === protocol && p.name === undefined);
    if (mine.length === 0) continue;
    if (mine.some((p) => p.port === undefined)) {
      out.push({ kind: 'proto', protocol });
      continue;
    }
    const ranges: PortRange[] = mine.map((p) => ({ from: p.port!, to: p.endPort ?? p.port! })).sort((a, b) => a.from - b.from || a.to - b.to);
    out.push({ kind: 'proto', protocol, dports: mergeRanges(ranges) });
  }
  return out;
}

/** Merges overlapping or adjacent sorted ranges, so equal meanings render the same bytes. */
function mergeRanges(sorted: readonly PortRange[]): PortRange[] {
  const out: PortRange[] = [];
  for (const r of sorted) {
    const last = out[out.length - 1];
    if (last && r.from <= last.to + 1) out[out.length - 1] = { from: last.from, to: Math.max(last.to, r.to) };
    else out.push(r);
  }
  return out;
}

/** An ipBlock with excepts: inside its cidr (any address of the family for a /0, which ipset
 *  cannot hold anyway) and not in its except set. Each such block is its own alternative, so
 *  its excepts never remove what another block of the rule allows. */
function blockMatches(peer: IpBlockPeer, dir: 'src' | 'dst'): SpecMatch[] {
  const out: SpecMatch[] = [];
  if (!peer.cidr.endsWith('/0')) out.push({ kind: 'addr', dir, cidr: peer.cidr });
  if (peer.except !== null) out.push({ kind: 'setRef', spec: { family: peer.family, peer: peer.except }, dir, negate: true });
  return out;
}

/** The ipBlocks without except of one rule: their union is one set (one rule, however many
 *  blocks); a union that is the whole family needs no match at all. */
function plainBlocksMatches(family: Family, cidrs: readonly string[], dir: 'src' | 'dst'): SpecMatch[] {
  const union = aggregateCidrs(cidrs.map((c) => parseCidr(c) as Cidr));
  if (union.length === 1 && union[0].prefix === 0) return [];
  return [{ kind: 'setRef', spec: { family, peer: prefixSet(family, union) }, dir }];
}

/** How audit rules log: the kernel-side rate limit every NFLOG rule ends with. */
export interface AuditRules {
  readonly limit: Match & { readonly kind: 'limit' };
}

/**
 * An NFLOG rule in front of a verdict: new connections only (each logs once, not each packet),
 * the rate limit last (a limit match spends a token on every packet that reaches it).
 */
export function auditRule(audit: AuditRules, matches: readonly Match[], log: Action, comment: string): Rule {
  return { matches: [{ kind: 'ctstate', states: ['NEW'] }, ...matches, audit.limit], action: log, comment };
}

/**
 * Every way a policy allows a packet in one direction and family, in rule order: the peer
 * alternatives of each rule (OR) with its port alternatives (OR). No peers means any address;
 * an ipBlock of the other family is absent.
 */
export function allowAlternatives(policy: CompiledPolicy, direction: Direction, family: Family): AllowAlternative[] {
  const rules = (direction === 'ingress' ? policy.ingress : policy.egress) ?? [];
  const target = direction === 'ingress' ? targetPeer(policy) : null;
  return rules.flatMap((rule, i) => ruleAlternatives(rule, i, direction, family, target));
}

/**
 * The alternatives of one rule: its peer alternatives (OR) with its port alternatives (OR).
 * `target`: the pods the rule protects, where an ingress named port is resolved (null: none).
 */
export function ruleAlternatives(rule: PolicyRule, index: number, direction: Direction, family: Family, target: PodsPeer | null): AllowAlternative[] {
  const peerDir = direction === 'ingress' ? 'src' : 'dst';
  const out: AllowAlternative[] = [];
  const push = (matches: SpecMatch[]) => out.push({ rule: index, matches });
  const peerAlts: SpecMatch[][] = [];
  if (rule.peers === null) peerAlts.push([]);
  else {
    const plain: string[] = [];
    for (const peer of rule.peers) {
      if (peer.kind === 'pods') peerAlts.push([{ kind: 'setRef', spec: { family, peer }, dir: peerDir }]);
      else if (peer.family !== family) continue;
      else if (peer.except === null) plain.push(peer.cidr);
      else peerAlts.push(blockMatches(peer, peerDir));
    }
    if (plain.length > 0) peerAlts.push(plainBlocksMatches(family, plain, peerDir));
  }
  if (rule.ports === null) {
    for (const p of peerAlts) push(p);
    return out;
  }
  for (const portMatch of numericPortMatches(rule.ports)) for (const p of peerAlts) push([...p, portMatch]);

  for (const port of rule.ports) {
    if (port.name === undefined) continue;
    const namedPort = { protocol: port.protocol, name: port.name };
    const proto: Match = { kind: 'proto', protocol: port.protocol };
    if (direction === 'ingress') {
      // Resolved against the receiving pod: the selected pods' own container ports.
      if (!target) continue;
      const dstPort: SetRef = { kind: 'setRef', spec: { family, peer: target, namedPort }, dir: 'dst,dst' };
      for (const p of peerAlts) push([...p, proto, dstPort]);
    } else {
      // Resolved against each destination pod; an ipBlock destination cannot resolve it.
      const dests = rule.peers === null ? [ALL_PODS] : rule.peers.filter((p) => p.kind === 'pods');
      for (const peer of dests) push([proto, { kind: 'setRef', spec: { family, peer, namedPort }, dir: 'dst,dst' }]);
    }
  }
  return out;
}

/** A peer set tested by address alone, which a union can stand for. */
export type MergeablePeer = SetRef & { readonly dir: 'src' | 'dst' };

/**
 * An alternative that is at most one peer set (pods or plain prefixes, by address) plus
 * protocol and port matches: alternatives with the same `rest` can share one union set of
 * their peers, one lookup for all of them. null peer: any address. null: not mergeable
 * (ipBlock excepts, named ports).
 */
export function mergeable(alt: AllowAlternative): { readonly peer: MergeablePeer | null; readonly rest: readonly Match[] } | null {
  let peer: MergeablePeer | null = null;
  const rest: Match[] = [];
  for (const m of alt.matches) {
    if (m.kind === 'setRef' && peer === null && !m.negate && m.dir !== 'dst,dst') peer = { kind: 'setRef', spec: m.spec, dir: m.dir };
    else if (m.kind === 'proto') rest.push(m);
    else return null;
  }
  return { peer, rest };
}

/**
 * The rules of one policy chain (cali-pi-* or cali-po-*) for one family, from its
 * alternatives. Each allowing rule sets the accept bit; the workload chain returns once the
 * bit is set. `useSet` returns the name of the set for a spec (the caller acquires it); it is
 * called in rule order. `logAllow`, for a policy audited at level `all`: the NFLOG action of
 * rule i, put in front of each of its allowing rules; only the first rule that allows a packet
 * logs it.
 */
export function policyChainRules(
  policy: CompiledPolicy,
  direction: Direction,
  alternatives: readonly AllowAlternative[],
  marks: MarkBits,
  useSet: (spec: SetSpec) => string,
  audit?: AuditRules & { readonly logAllow: (rule: number) => Action },
): Rule[] {
  const allow = { kind: 'setMark', value: marks.accept, mask: marks.accept } as const;
  const notYetAllowed: Match = { kind: 'mark', value: 0, mask: marks.accept };
  const out: Rule[] = [];
  for (const alt of alternatives) {
    const comment = `${policy.key} ${direction} rule ${alt.rule}`;
    const matches = resolveMatches(alt.matches, useSet);
    const log = audit?.logAllow(alt.rule);
    if (audit && log) out.push(auditRule(audit, [notYetAllowed, ...matches], log, `${comment} audit`));
    out.push({ matches, action: allow, comment });
  }
  return out;
}

/** What the top chain does with a packet policy allows. ACCEPT ends FORWARD there; RETURN
 *  hands it back to FORWARD, so that the administrator's own later rules still apply. */
export type AllowAction = 'ACCEPT' | 'RETURN';

/**
 * Weir's chains live in the mangle table, where ACCEPT ends only mangle: the packet goes on
 * through filter FORWARD, whose hook accepts what carries the accept bit. So every ACCEPT of
 * Weir's sets the bit first: it goes to this chain (ACCEPT mode only).
 */
export function acceptChainRules(marks: MarkBits): Rule[] {
  return [
    { matches: [], action: { kind: 'setMark', value: marks.accept, mask: marks.accept } },
    { matches: [], action: { kind: 'accept' }, comment: 'filter FORWARD accepts it by the mark' },
  ];
}

const allowActionOf = (a: AllowAction, acceptChain: string): Rule['action'] => (a === 'ACCEPT' ? { kind: 'goto', chain: acceptChain } : { kind: 'return' });

export interface WorkloadChainInput {
  readonly direction: Direction;
  /** Human reference for comments: namespace/name. */
  readonly podRef: string;
  /** The pod's own address in this family, for the hairpin rule. */
  readonly podIp: string;
  /** What to consult in order: a policy chain to jump to, or allowing rules written inline
   *  (merged peers); null when no policy isolates the pod in this direction. */
  readonly policyChains: readonly (string | readonly Rule[])[] | null;
  readonly marks: MarkBits;
  /** The shared first part of every workload chain (workloadCommonRules). */
  readonly commonChain: string;
  readonly allowAction: AllowAction;
  /** The chain that accepts with the mark (acceptChainRules). */
  readonly acceptChain: string;
  /** Audit-only policy chains, when no enforced policy isolates the pod in this direction:
   *  they decide nothing; what none of them allows is logged with `logWouldDeny`. */
  readonly auditOnlyChains?: readonly string[];
  /** The pod's ClusterNetworkPolicy chains for this direction (tier-rules.ts), if any: Admin
   *  before every NetworkPolicy, Baseline only when none isolates the pod. */
  readonly adminChain?: string | null;
  readonly baselineChain?: string | null;
  readonly audit?: AuditRules & {
    /** NFLOG for the default drop of an isolated pod (its isolating policies are audited). */
    readonly logDeny?: Action;
    /** NFLOG for what the audit-only policies would drop. */
    readonly logWouldDeny?: Action;
  };
}

/** ICMPv6 router solicitation/advertisement, neighbour solicitation/advertisement. */
export const NEIGHBOUR_DISCOVERY: readonly number[] = [133, 134, 135, 136];

/** cali-tw-* (ingress to the pod) or cali-fw-* (egress from it). */
export function workloadChainRules(w: WorkloadChainInput): Rule[] {
  const { accept } = w.marks;
  const rules: Rule[] = [];
  // With RETURN a reply must leave the pod's chain itself (a RETURN in the shared chain would
  // only come back here), and only once dispatch has checked its addresses, as with ACCEPT.
  if (w.allowAction === 'RETURN') rules.push({ matches: [{ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }], action: { kind: 'return' } });
  rules.push({ matches: [], action: { kind: 'jump', chain: w.commonChain } });
  // A pod can never block itself (a hairpin through a Service comes back over the bridge).
  // With ACCEPT the egress side ends it; with RETURN both sides must let it pass.
  if (w.direction === 'egress' || w.allowAction === 'RETURN') {
    rules.push({
      matches: [{ kind: 'addr', dir: w.direction === 'egress' ? 'dst' : 'src', cidr: hostCidr(w.podIp) }],
      action: allowActionOf(w.allowAction, w.acceptChain),
      comment: `${w.podRef} to itself`,
    });
  }
  const consult = (chains: readonly (string | readonly Rule[])[]) => {
    for (const chain of chains) {
      if (typeof chain === 'string') rules.push({ matches: [], action: { kind: 'jump', chain } });
      else rules.push(...chain);
      rules.push({ matches: [{ kind: 'mark', value: accept, mask: accept }], action: { kind: 'return' } });
    }
  };
  const preposition = w.direction === 'ingress' ? 'to' : 'from';
  if (w.adminChain) consult([w.adminChain]);
  if (w.policyChains === null) {
    if (w.baselineChain) rules.push({ matches: [], action: { kind: 'jump', chain: w.baselineChain } });
    // Audit-only policies: a packet none of them allows would be dropped if they were enforced.
    if (w.audit?.logWouldDeny && w.auditOnlyChains && w.auditOnlyChains.length > 0) {
      consult(w.auditOnlyChains);
      rules.push(auditRule(w.audit, [], w.audit.logWouldDeny, `audit-only policies would drop ${w.direction} ${preposition} ${w.podRef}`));
    }
    rules.push({
      matches: [],
      action: { kind: 'setMark', value: accept, mask: accept },
      comment: `${w.podRef} is not isolated for ${w.direction}`,
    });
    return rules;
  }
  consult(w.policyChains);
  if (w.audit?.logDeny) rules.push(auditRule(w.audit, [], w.audit.logDeny, `audit the default drop ${preposition} ${w.podRef}`));
  rules.push({ matches: [], action: { kind: 'drop' }, comment: `no policy allows ${w.direction} ${preposition} ${w.podRef}` });
  return rules;
}

/**
 * What every workload chain does first, shared in one chain per family so that each pod's
 * chains stay short (the kernel's table, and so every iptables-restore, grows with rules):
 * replies pass (with RETURN each workload chain returns them first), INVALID drops, and our
 * mark bits are cleared.
 */
export function workloadCommonRules(marks: MarkBits, allowAction: AllowAction, acceptChain: string): Rule[] {
  const rules: Rule[] = [];
  if (allowAction === 'ACCEPT') rules.push({ matches: [{ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }], action: { kind: 'goto', chain: acceptChain } });
  rules.push({ matches: [{ kind: 'ctstate', states: ['INVALID'] }], action: { kind: 'drop' } });
  rules.push({ matches: [], action: { kind: 'setMark', value: 0, mask: marks.accept | marks.pass } });
  return rules;
}

export function hostCidr(ip: string): string {
  return ip.includes(':') ? `${ip}/128` : `${ip}/32`;
}

export interface TopChainInput {
  readonly family: Family;
  readonly fromDispatch: string;
  readonly toDispatch: string;
  readonly marks: MarkBits;
  readonly allowAction: AllowAction;
  readonly acceptChain: string;
}

/** The chain mangle FORWARD jumps to: clear our bits, police both ends, let through what both
 *  allowed (ACCEPT mode: with the accept bit still set, which filter FORWARD's hook accepts). */
export function topChainRules(t: TopChainInput): Rule[] {
  const allow = allowActionOf(t.allowAction, t.acceptChain);
  const rules: Rule[] = [];
  if (t.family === 6) {
    // Neighbour discovery is how IPv6 resolves addresses on the bridge. Its sources are
    // link-local (or ::), never a pod address, and conntrack does not track it: it passes
    // before dispatch, or the unknown-address drops would cut allowed traffic too.
    for (const type of NEIGHBOUR_DISCOVERY) rules.push({ matches: [{ kind: 'icmp6', type }], action: allow });
  }
  rules.push(
    { matches: [], action: { kind: 'setMark', value: 0, mask: t.marks.accept | t.marks.pass } },
    { matches: [], action: { kind: 'jump', chain: t.fromDispatch } },
    { matches: [], action: { kind: 'jump', chain: t.toDispatch } },
  );
  if (t.allowAction === 'ACCEPT') {
    rules.push({ matches: [{ kind: 'mark', value: t.marks.accept, mask: t.marks.accept }], action: { kind: 'accept' }, comment: 'allowed by policy' });
  }
  return rules;
}
