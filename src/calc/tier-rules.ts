// Pure builders for the ClusterNetworkPolicy tiers: the rules of one local pod's Admin or
// Baseline chain for one direction, in evaluation order (docs/design/calc.md, "Tiers").
//
// The first rule that matches decides. Consecutive rules with the same action may match in
// any order without changing the outcome, so each such run merges its peers by port
// signature (merge.ts): the per-packet cost follows the runs and signatures, not the number
// of policies.

import type { CnpAction, CompiledClusterNetworkPolicy, Family } from '../model/types.ts';
import type { Action, Rule } from './desired.ts';
import { mergedRules } from './merge.ts';
import type { AllowAlternative, AuditRules, Direction, SetSpec } from './rules.ts';
import { auditRule, mergeable, resolveMatches, ruleAlternatives } from './rules.ts';

export type Tier = 'admin' | 'baseline';

/** One way a rule of a policy matches a packet, with what the rule then does. */
export interface TierStep {
  readonly action: CnpAction;
  readonly policy: CompiledClusterNetworkPolicy;
  readonly rule: number;
  readonly alt: AllowAlternative;
}

/** Audit rules for a tier chain: `logOf` gives the NFLOG action of a step whose policy is
 *  audited for its action (never for Pass: it decides nothing), else undefined. */
export interface TierAudit extends AuditRules {
  readonly logOf: (step: TierStep) => Action | undefined;
}

/** The steps of the policies given (already in evaluation order) for one direction and family.
 *  An ingress named port is resolved against the policy's subjects, the receiving pods. */
export function tierSteps(policies: readonly CompiledClusterNetworkPolicy[], dir: Direction, family: Family): TierStep[] {
  const out: TierStep[] = [];
  for (const p of policies) {
    for (const rule of dir === 'ingress' ? p.ingress : p.egress) {
      for (const alt of ruleAlternatives(rule, rule.index, dir, family, dir === 'ingress' ? p.subject : null)) {
        out.push({ action: rule.action, policy: p, rule: rule.index, alt });
      }
    }
  }
  return out;
}

/**
 * What each action does in a tier chain. Admin: Accept goes to the tier-accept chain, which
 * sets the accept bit and, ending, returns to the workload chain; Deny drops; Pass returns,
 * skipping the rest of the tier. Baseline runs only when no NetworkPolicy isolates the pod,
 * before the default allow: Accept (and Pass, which has nothing left to hand to) returns.
 */
export function tierAction(tier: Tier, action: CnpAction, tierAccept: string): Action {
  if (action === 'Deny') return { kind: 'drop' };
  if (tier === 'admin' && action === 'Accept') return { kind: 'goto', chain: tierAccept };
  return { kind: 'return' };
}

/**
 * The chain of one tier and direction for one pod. `useSet` names (and acquires) each set.
 * Within a run, audited steps come first, each alone behind its NFLOG rule, so a line names
 * the policy and rule that decided; the others merge.
 */
export function tierChainRules(tier: Tier, steps: readonly TierStep[], family: Family, tierAccept: string, useSet: (spec: SetSpec) => string, audit?: TierAudit): Rule[] {
  const out: Rule[] = [];
  for (let i = 0; i < steps.length; ) {
    let j = i;
    while (j < steps.length && steps[j].action === steps[i].action) j++;
    const run = steps.slice(i, j);
    i = j;
    const action = tierAction(tier, run[0].action, tierAccept);
    const verb = run[0].action.toLowerCase();
    const comment = (s: TierStep) => `${tier} ${verb}: ${s.policy.name} rule ${s.rule}`;
    const rest: TierStep[] = [];
    for (const s of run) {
      const log = audit?.logOf(s);
      if (!audit || !log) {
        rest.push(s);
        continue;
      }
      const matches = resolveMatches(s.alt.matches, useSet);
      out.push(auditRule(audit, matches, log, `${comment(s)} audit`), { matches, action, comment: comment(s) });
    }
    // A merged rule names the policy and rule it stands for when it stands for one.
    const merged = rest.length === 1 ? comment(rest[0]) : `${tier} ${verb}: merged peers of ${new Set(rest.map((s) => s.policy.name)).size} policies`;
    out.push(
      ...mergedRules(
        rest.map((s) => s.alt),
        family,
        action,
        merged,
        useSet,
      ),
    );
    for (const s of rest) if (!mergeable(s.alt)) out.push({ matches: resolveMatches(s.alt.matches, useSet), action, comment: comment(s) });
  }
  return out;
}

/** The chain an Admin Accept goes to: set the accept bit; its end returns to the workload chain. */
export function tierAcceptRules(acceptBit: number): Rule[] {
  return [{ matches: [], action: { kind: 'setMark', value: acceptBit, mask: acceptBit }, comment: 'admin tier accepts' }];
}
