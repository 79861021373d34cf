// Which policies and rules stand behind a verdict. The chains say what happens to a packet; a
// merged rule or a tier chain says it for many policies at once. So each policy's own
// alternatives, as calc builds them (rules.ts allowAlternatives, tier-rules.ts tierSteps), are
// evaluated against the packet with the same evaluator, over calc's own sets. Pure.

import type { CnpAction, CnpTier, CompiledClusterNetworkPolicy, CompiledPolicy, Family } from '../model/types.ts';
import type { DesiredSet } from '../calc/desired.ts';
import type { AllowAlternative, Direction, SetSpec } from '../calc/rules.ts';
import { allowAlternatives, mergeable, resolveMatches, setKey } from '../calc/rules.ts';
import type { TierStep } from '../calc/tier-rules.ts';
import { tierSteps } from '../calc/tier-rules.ts';
import type { Packet, SetSource } from './evaluate.ts';
import { matchRule } from './evaluate.ts';

/**
 * The sets a policy's alternatives name, by spec, holding calc's members
 * (`Calculator.peekSet`): the set the node's rules hold when one does, else the one calc's
 * registry would fill. Named here by family and key.
 */
export class CalcSets implements SetSource {
  readonly #peek: (spec: SetSpec) => DesiredSet;
  readonly #byName = new Map<string, DesiredSet>();

  constructor(peek: (spec: SetSpec) => DesiredSet) {
    this.#peek = peek;
  }

  get(name: string): DesiredSet | undefined {
    return this.#byName.get(name);
  }

  /** The name the spec's set goes by here, looked up on first use. */
  readonly use = (spec: SetSpec): string => {
    const name = `${spec.family} ${setKey(spec)}`;
    if (!this.#byName.has(name)) this.#byName.set(name, this.#peek(spec));
    return name;
  };
}

/** Whether one alternative (a policy rule's peer and port) matches the packet. */
export function alternativeMatches(alt: AllowAlternative, packet: Packet, sets: CalcSets): boolean {
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
  sets: CalcSets,
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
export function tierDecision(policies: readonly CompiledClusterNetworkPolicy[], dir: Direction, family: Family, packet: Packet, sets: CalcSets): TierDecision | null {
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
