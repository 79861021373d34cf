// Which policies and rules stand behind a verdict. The chains say what happens to a packet; a
// merged rule or a tier chain says it for many policies at once. So each policy's own
// alternatives, as calc builds them (rules.ts allowAlternatives, tier-rules.ts tierSteps), are
// evaluated against the packet with the same evaluator, their sets filled from the model as
// calc fills them. Pure.

import type { ClusterState } from '../model/cluster.ts';
import { isPeerEligible } from '../model/cluster.ts';
import { selectorMatches } from '../model/selector.ts';
import type { CnpAction, CnpTier, CompiledClusterNetworkPolicy, CompiledPolicy, Family, Pod } from '../model/types.ts';
import { familyOf } from '../model/types.ts';
import type { DesiredSet } from '../calc/desired.ts';
import { netMember } from '../calc/desired.ts';
import type { AllowAlternative, Direction, SetSpec } from '../calc/rules.ts';
import { allowAlternatives, mergeable, resolveMatches, setKey } from '../calc/rules.ts';
import type { TierStep } from '../calc/tier-rules.ts';
import { tierSteps } from '../calc/tier-rules.ts';
import type { Packet, SetSource } from './evaluate.ts';
import { matchRule } from './evaluate.ts';

/** The policies selecting a pod in one direction, as calc's workloads sort them. */
export interface Selected {
  /** Enforced: they isolate the pod. */
  readonly enforced: readonly CompiledPolicy[];
  /** Audit-only: they never isolate, only log what they would drop. */
  readonly auditOnly: readonly CompiledPolicy[];
}

export function selectedPolicies(cluster: ClusterState, pod: Pod, dir: Direction): Selected {
  const enforced: CompiledPolicy[] = [];
  const auditOnly: CompiledPolicy[] = [];
  for (const p of cluster.policiesIn(pod.namespace)) {
    if (p.podSelector !== null && !selectorMatches(p.podSelector, pod.labels)) continue;
    if ((dir === 'ingress' ? p.ingress : p.egress) === null) continue;
    (p.enforcement === 'audit' ? auditOnly : enforced).push(p);
  }
  const byKey = (a: CompiledPolicy, b: CompiledPolicy) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
  return { enforced: enforced.sort(byKey), auditOnly: auditOnly.sort(byKey) };
}

/**
 * Sets named by their spec, filled from the model the way calc's registry fills them: a pods
 * peer holds the addresses of its peer-eligible pods (with the resolved port for a named
 * port), prefixes their kernel form, a union every member of its parts.
 */
export class ModelSets implements SetSource {
  readonly #cluster: ClusterState;
  readonly #byName = new Map<string, DesiredSet>();

  constructor(cluster: ClusterState) {
    this.#cluster = cluster;
  }

  get(name: string): DesiredSet | undefined {
    return this.#byName.get(name);
  }

  /** The name the spec's set goes by here (its key), filled on first use. */
  readonly use = (spec: SetSpec): string => {
    const name = setKey(spec);
    if (!this.#byName.has(name)) this.#byName.set(name, { name, family: spec.family, type: spec.namedPort ? 'hash:ip,port' : 'hash:net', members: this.#members(spec) });
    return name;
  };

  #members(spec: SetSpec): Set<string> {
    const peer = spec.peer;
    if (peer.kind === 'prefixes') return new Set(peer.cidrs.map(netMember));
    if (peer.kind === 'union') return new Set(peer.parts.flatMap((part) => [...this.#members(part)]));
    const np = spec.namedPort;
    if (!np) return new Set(this.#cluster.peerAddresses(peer, spec.family));
    const out = new Set<string>();
    for (const pod of this.#cluster.podsMatching(peer)) {
      if (!isPeerEligible(pod)) continue;
      for (const cp of pod.ports) {
        if (cp.name !== np.name || cp.protocol !== np.protocol) continue;
        for (const ip of pod.ips) if (familyOf(ip) === spec.family) out.add(`${ip},${np.protocol.toLowerCase()}:${cp.port}`);
      }
    }
    return out;
  }
}

/** Whether one alternative (a policy rule's peer and port) matches the packet. */
export function alternativeMatches(alt: AllowAlternative, packet: Packet, sets: ModelSets): boolean {
  return matchRule({ matches: resolveMatches(alt.matches, sets.use), action: { kind: 'drop' } }, packet, sets, 0).matched;
}

export interface PolicyRuleRef {
  readonly namespace: string;
  readonly name: string;
  /** Its index in spec.ingress or spec.egress. */
  readonly rule: number;
}

/** Every rule of the given policies that allows the packet, in policy then rule order. `only`
 *  keeps the alternatives it accepts (a merged rule's port signature). */
export function allowingRules(
  policies: readonly CompiledPolicy[],
  dir: Direction,
  family: Family,
  packet: Packet,
  sets: ModelSets,
  only: (alt: AllowAlternative) => boolean = () => true,
): PolicyRuleRef[] {
  const out: PolicyRuleRef[] = [];
  for (const p of policies) {
    const seen = new Set<number>();
    for (const alt of allowAlternatives(p, dir, family)) {
      if (seen.has(alt.rule) || !only(alt) || !alternativeMatches(alt, packet, sets)) continue;
      seen.add(alt.rule);
      out.push({ namespace: p.namespace, name: p.name, rule: alt.rule });
    }
  }
  return out;
}

/** Whether an alternative is one a merged rule with these matches stands for: mergeable,
 *  with the same peer direction and the same protocol and port matches. */
export function sameSignature(alt: AllowAlternative, rest: readonly unknown[], peerDir: 'src' | 'dst' | null): boolean {
  const m = mergeable(alt);
  if (!m) return false;
  if (m.peer !== null && peerDir !== null && m.peer.dir !== peerDir) return false;
  return JSON.stringify(m.rest) === JSON.stringify(rest);
}

export interface ClusterRuleRef {
  readonly name: string;
  readonly tier: CnpTier;
  /** Its index in spec.ingress or spec.egress; -1: the deny-all of an invalid policy. */
  readonly rule: number;
  /** spec.ingress[i].name, '' when not given. */
  readonly ruleName: string;
  readonly action: CnpAction;
}

export interface TierDecision {
  /** The first rule in evaluation order that matches: the one that decides. */
  readonly first: ClusterRuleRef;
  /** Every rule of the same run of equal actions that matches (they merge into one kernel
   *  rule, in any order with the same outcome), the first included. */
  readonly alsoMatching: readonly ClusterRuleRef[];
}

/** The first matching rule of a tier's policies (in evaluation order), or null. */
export function tierDecision(policies: readonly CompiledClusterNetworkPolicy[], dir: Direction, family: Family, packet: Packet, sets: ModelSets): TierDecision | null {
  const steps = tierSteps(policies, dir, family);
  const ref = (s: TierStep): ClusterRuleRef => ({
    name: s.policy.name,
    tier: s.policy.tier,
    rule: s.rule,
    ruleName: s.rule >= 0 ? ((dir === 'ingress' ? s.policy.ingress : s.policy.egress).find((r) => r.index === s.rule)?.name ?? '') : '',
    action: s.action,
  });
  const i = steps.findIndex((s) => alternativeMatches(s.alt, packet, sets));
  if (i < 0) return null;
  let from = i;
  while (from > 0 && steps[from - 1].action === steps[i].action) from--;
  let to = i;
  while (to < steps.length && steps[to].action === steps[i].action) to++;
  const also: ClusterRuleRef[] = [];
  const seen = new Set<string>();
  for (const s of steps.slice(from, to)) {
    const key = `${s.policy.name}\n${s.rule}`;
    if (seen.has(key) || !alternativeMatches(s.alt, packet, sets)) continue;
    seen.add(key);
    also.push(ref(s));
  }
  return { first: ref(steps[i]), alsoMatching: also };
}
