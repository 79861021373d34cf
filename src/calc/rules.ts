// Pure rule builders: a compiled policy or a workload becomes structured Rule records.
// No iptables syntax here (that is dataplane/render.ts); only the shape of each chain.

import type { CompiledPolicy, Family, PodsPeer, PolicyRule, PortMatch, Protocol } from '../model/types.ts';
import { PROTOCOLS } from '../model/types.ts';
import type { Match, PortRange, Rule } from './desired.ts';

export interface MarkBits {
  /** Set by a policy rule that allows the packet; ACCEPTed at the end of the top chain. */
  readonly accept: number;
  /** Reserved next to accept (Calico's "pass"); cleared with it so neither leaks between hops. */
  readonly pass: number;
}

/** A peer set to use: one per family, canonical peer and (for named ports) protocol/name. */
export interface SetSpec {
  readonly family: Family;
  readonly peer: CompiledPolicyPeer;
  readonly namedPort?: { readonly protocol: Protocol; readonly name: string };
}
export type CompiledPolicyPeer = NonNullable<PolicyRule['peers']>[number];

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
    const ranges: PortRange[] = mine
      .map((p) => ({ from: p.port!, to: p.endPort ?? p.port! }))
      .sort((a, b) => a.from - b.from || a.to - b.to);
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

/**
 * The rules of one policy chain (cali-pi-* or cali-po-*) for one family. Each allowing rule
 * sets the accept bit; the workload chain returns once the bit is set. `useSet` returns the
 * name of the set for a spec (the caller acquires it); it is called in rule order.
 */
export function policyChainRules(
  policy: CompiledPolicy,
  direction: Direction,
  family: Family,
  marks: MarkBits,
  useSet: (spec: SetSpec) => string,
): Rule[] {
  const rules = (direction === 'ingress' ? policy.ingress : policy.egress) ?? [];
  const peerDir = direction === 'ingress' ? 'src' : 'dst';
  const allow = { kind: 'setMark', value: marks.accept, mask: marks.accept } as const;
  const out: Rule[] = [];
  rules.forEach((rule, i) => {
    const comment = `${policy.key} ${direction} rule ${i}`;
    const push = (matches: Match[]) => out.push({ matches, action: allow, comment });

    // Peer alternatives (OR): none means any address; an ipBlock of the other family is absent.
    const peerAlts: Match[][] = [];
    if (rule.peers === null) peerAlts.push([]);
    else {
      for (const peer of rule.peers) {
        if (peer.kind === 'ipBlock' && peer.family !== family) continue;
        peerAlts.push([{ kind: 'set', set: useSet({ family, peer }), dir: peerDir }]);
      }
    }
    if (rule.ports === null) {
      for (const p of peerAlts) push(p);
      return;
    }
    for (const portMatch of numericPortMatches(rule.ports)) for (const p of peerAlts) push([...p, portMatch]);

    for (const port of rule.ports) {
      if (port.name === undefined) continue;
      const namedPort = { protocol: port.protocol, name: port.name };
      const proto: Match = { kind: 'proto', protocol: port.protocol };
      if (direction === 'ingress') {
        // Resolved against the receiving pod: the selected pods' own container ports.
        const target = targetPeer(policy);
        if (!target) continue;
        const dstPort: Match = { kind: 'set', set: useSet({ family, peer: target, namedPort }), dir: 'dst,dst' };
        for (const p of peerAlts) push([...p, proto, dstPort]);
      } else {
        // Resolved against each destination pod; an ipBlock destination cannot resolve it.
        const dests = rule.peers === null ? [ALL_PODS] : rule.peers.filter((p) => p.kind === 'pods');
        for (const peer of dests) push([proto, { kind: 'set', set: useSet({ family, peer, namedPort }), dir: 'dst,dst' }]);
      }
    }
  });
  return out;
}

export interface WorkloadChainInput {
  readonly direction: Direction;
  /** Human reference for comments: namespace/name. */
  readonly podRef: string;
  /** The pod's own address in this family, for the hairpin rule. */
  readonly podIp: string;
  /** Policy chains in order, or null when no policy isolates the pod in this direction. */
  readonly policyChains: readonly string[] | null;
  readonly marks: MarkBits;
  /** The shared first part of every workload chain (workloadCommonRules). */
  readonly commonChain: string;
}

/** ICMPv6 router solicitation/advertisement, neighbour solicitation/advertisement. */
export const NEIGHBOUR_DISCOVERY: readonly number[] = [133, 134, 135, 136];

/** cali-tw-* (ingress to the pod) or cali-fw-* (egress from it). */
export function workloadChainRules(w: WorkloadChainInput): Rule[] {
  const { accept } = w.marks;
  const rules: Rule[] = [{ matches: [], action: { kind: 'jump', chain: w.commonChain } }];
  if (w.direction === 'egress') {
    // A pod can never block itself (hairpin through a service comes back over the bridge).
    rules.push({
      matches: [{ kind: 'addr', dir: 'dst', cidr: hostCidr(w.podIp) }],
      action: { kind: 'accept' },
      comment: `${w.podRef} to itself`,
    });
  }
  if (w.policyChains === null) {
    rules.push({
      matches: [],
      action: { kind: 'setMark', value: accept, mask: accept },
      comment: `${w.podRef} is not isolated for ${w.direction}`,
    });
    return rules;
  }
  for (const chain of w.policyChains) {
    rules.push({ matches: [], action: { kind: 'jump', chain } });
    rules.push({ matches: [{ kind: 'mark', value: accept, mask: accept }], action: { kind: 'return' } });
  }
  rules.push({ matches: [], action: { kind: 'drop' }, comment: `no policy allows ${w.direction} ${w.direction === 'ingress' ? 'to' : 'from'} ${w.podRef}` });
  return rules;
}

/**
 * What every workload chain does first, shared in one chain per family so that each pod's
 * chains stay short (the kernel's table, and so every iptables-restore, grows with rules):
 * replies pass, IPv6 neighbour discovery passes, INVALID drops, and our mark bits are cleared.
 */
export function workloadCommonRules(family: Family, marks: MarkBits): Rule[] {
  const rules: Rule[] = [{ matches: [{ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }], action: { kind: 'accept' } }];
  if (family === 6) {
    // Neighbour discovery is how IPv6 resolves addresses on the bridge; conntrack does not
    // track it (so it would look INVALID), and blocking it would block allowed traffic too.
    for (const type of NEIGHBOUR_DISCOVERY) rules.push({ matches: [{ kind: 'icmp6', type }], action: { kind: 'accept' } });
  }
  rules.push({ matches: [{ kind: 'ctstate', states: ['INVALID'] }], action: { kind: 'drop' } });
  rules.push({ matches: [], action: { kind: 'setMark', value: 0, mask: marks.accept | marks.pass } });
  return rules;
}

export function hostCidr(ip: string): string {
  return ip.includes(':') ? `${ip}/128` : `${ip}/32`;
}

/** The chain FORWARD jumps to: clear our bits, police both ends, accept what both allowed. */
export function topChainRules(fromDispatch: string, toDispatch: string, marks: MarkBits): Rule[] {
  return [
    { matches: [], action: { kind: 'setMark', value: 0, mask: marks.accept | marks.pass } },
    { matches: [], action: { kind: 'jump', chain: fromDispatch } },
    { matches: [], action: { kind: 'jump', chain: toDispatch } },
    {
      matches: [{ kind: 'mark', value: marks.accept, mask: marks.accept }],
      action: { kind: 'accept' },
      comment: 'allowed by policy',
    },
  ];
}

