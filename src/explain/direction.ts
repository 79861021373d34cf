// One direction's outcome of a walk through a node's chains: the verdict, the rule that decided
// it and the policies behind that rule, and any disagreement between the kernel's chains and
// the policies calc built them from. Pure.

import type { Direction } from '../calc/rules.ts';
import type { Tier } from '../calc/tier-rules.ts';
import type { DirectionSelection } from '../calc/workloads.ts';
import type { CompiledPolicy, Family, Pod } from '../model/types.ts';
import type { PolicyRuleRef } from './attribute.ts';
import { allowingRules, CalcSets, sameSignature, tierDecision } from './attribute.ts';
import type { Hit, Packet, Walk } from './evaluate.ts';
import type { DirectionResult, ExplainConfig, NodeState, PathStep } from './explain.ts';
import { payloadLine } from './payload.ts';
import { podRef } from './resolve.ts';

/** The hits of one half of a walk: from the top chain's jump to `dispatch` up to its next rule. */
function half(w: Walk, top: string, dispatch: string): Hit[] {
  if (w.hits.length > 0 && w.hits[0].stack[0] !== top) return [...w.hits];
  const out: Hit[] = [];
  let inside = false;
  for (const h of w.hits) {
    if (h.stack.length === 1) inside = h.rule.action.kind === 'jump' && h.rule.action.chain === dispatch;
    if (inside) out.push(h);
  }
  return out;
}

export function direction(dir: Direction, node: string, pod: Pod | null, w: Walk, reached: boolean, family: Family, packet: Packet, state: NodeState, cfg: ExplainConfig): DirectionResult {
  const n = cfg.names;
  const top = state.calc.desired.topChain;
  const hits = half(w, top, dir === 'egress' ? n.fromWorkloadDispatch : n.toWorkloadDispatch);
  const final = w.final !== undefined && hits.includes(w.final) ? w.final : undefined;
  const chains = state.calc.desired.chains[family];
  const stepOf = (h: Hit): PathStep => ({ chain: h.chain, position: payloadLine(chains.get(h.chain) ?? [h.rule], h.position - 1, packet.dport), rule: h.rule, lookups: h.lookups });
  const path = hits.map(stepOf);
  const logged = hits
    .filter((h) => h.rule.action.kind === 'nflog')
    .map((h) => {
      const prefix = (h.rule.action as { prefix: string }).prefix;
      return { prefix, meaning: state.calc.auditCatalog.lookup(prefix) ?? null };
    });
  const base = { direction: dir, node, pod: pod ? podRef(pod) : null, path, logged, reached };
  const decided = (h: Hit | undefined, merged = false) => (h ? { ...stepOf(h), merged } : null);

  if (pod === null) {
    if (final?.rule.action.kind === 'drop') return { ...base, verdict: 'denied', reason: 'fail-closed', rule: decided(final) };
    return { ...base, verdict: 'allowed', reason: 'other', rule: null, disagreement: `an address of ${node}'s pod CIDR that no pod holds was not dropped there` };
  }
  const wl = dir === 'egress' ? n.fromWorkload(pod.uid) : n.toWorkload(pod.uid);
  const inPod = hits.filter((h) => h.stack.includes(wl));
  if (inPod.length === 0) {
    if (final?.rule.action.kind === 'drop') return { ...base, verdict: 'denied', reason: 'fail-closed', rule: decided(final) };
    return { ...base, verdict: 'allowed', reason: 'other', rule: decided(final), disagreement: `the packet never reached ${wl}, the ${dir} chain of ${podRef(pod)}` };
  }
  const selection = state.calc.selection(pod.uid);
  if (!selection) {
    const verdict = final?.rule.action.kind === 'drop' ? 'denied' : 'allowed';
    return { ...base, verdict, reason: 'other', rule: decided(final), disagreement: `${wl} was walked, yet calc holds no local pod ${podRef(pod)} on ${node}` };
  }
  const sets = new CalcSets((spec) => state.calc.peekSet(spec));
  const selected = selection[dir];
  const tiers = selection.tiers;
  const tierChain = (tier: Tier) => n.tierChain(tier, dir, pod.uid);
  const decision = (tier: Tier) => tierDecision(tier === 'admin' ? tiers.admin : tiers.baseline, dir, family, packet, sets);
  const clusterRule = (tier: Tier) => {
    const d = decision(tier);
    return d ? { clusterRule: { ...d.first, alsoMatching: d.alsoMatching } } : {};
  };
  const mergedTierRule = (h: Hit) => h.rule.comment?.includes('merged peers') === true;

  // Admin tier: Accept ends it (to the tier-accept chain), Pass returns, Deny drops.
  const adminHit = inPod.find((h) => h.chain === tierChain('admin') && h.rule.action.kind !== 'nflog');
  const adminDecision = decision('admin');
  const kernelAdmin = adminHit === undefined ? null : adminHit.rule.action.kind === 'drop' ? 'Deny' : adminHit.rule.action.kind === 'goto' ? 'Accept' : 'Pass';
  const adminDisagrees = (kernelAdmin ?? null) !== (adminDecision?.first.action ?? null);
  const disagreement = adminDisagrees
    ? `the Admin tier chain did ${kernelAdmin ?? 'nothing'}, its policies' first matching rule is ${adminDecision ? `${adminDecision.first.action} (${adminDecision.first.name} rule ${adminDecision.first.rule})` : 'none'}`
    : undefined;
  const withAdmin = { ...(disagreement ? { disagreement } : {}) };
  if (kernelAdmin === 'Deny' || kernelAdmin === 'Accept') {
    return { ...base, ...withAdmin, verdict: kernelAdmin === 'Deny' ? 'denied' : 'allowed', reason: 'cluster-policy', ...clusterRule('admin'), rule: decided(adminHit, mergedTierRule(adminHit!)) };
  }
  const passedBy = kernelAdmin === 'Pass' && adminDecision ? { passedBy: adminDecision.first } : {};

  if (final?.rule.action.kind === 'accept' || (final === undefined && hits.some((h) => h.chain === wl && h.rule.comment?.endsWith(' to itself')))) {
    const self = inPod.find((h) => h.chain === wl && h.rule.comment?.endsWith(' to itself'));
    if (self) return { ...base, ...withAdmin, ...passedBy, verdict: 'allowed', reason: 'self', rule: decided(self) };
  }
  if (final?.rule.action.kind === 'drop' && final.stack.includes(wl)) {
    if (final.chain === tierChain('baseline')) {
      const kernelSays = 'Deny';
      const d = decision('baseline');
      const extra = d?.first.action === kernelSays ? {} : { disagreement: `the Baseline tier chain dropped it, its policies' first matching rule is ${d ? d.first.action : 'none'}` };
      return { ...base, ...withAdmin, ...extra, ...passedBy, verdict: 'denied', reason: 'cluster-policy', ...clusterRule('baseline'), rule: decided(final, mergedTierRule(final)) };
    }
    if (final.chain === wl) {
      const allowing = allowingRules(selected.enforced, dir, family, packet, sets);
      const extra =
        selected.enforced.length === 0
          ? { disagreement: `${wl} dropped it, yet no enforced policy isolates ${podRef(pod)}` }
          : allowing.length > 0
            ? { disagreement: `${wl} dropped it, yet ${allowing.map(ruleText(dir)).join(', ')} allow it` }
            : {};
      return { ...base, ...withAdmin, ...extra, ...passedBy, verdict: 'denied', reason: 'default-deny', isolatedBy: isolatedBy(selected), rule: decided(final) };
    }
    return { ...base, ...withAdmin, ...passedBy, verdict: 'denied', reason: 'other', rule: decided(final) };
  }
  if (final?.rule.action.kind === 'drop') {
    return { ...base, ...withAdmin, ...passedBy, verdict: 'denied', reason: 'fail-closed', rule: decided(final) };
  }

  // Allowed: by a NetworkPolicy rule (isolated), else by the Baseline tier or the default.
  const acceptBit = cfg.marks.accept;
  if (selected.enforced.length > 0) {
    const policyChains = new Map(selected.enforced.map((p) => [dir === 'ingress' ? n.policyIngress(p.key) : n.policyEgress(p.key), p]));
    const allowHit = inPod.find((h) => h.rule.action.kind === 'setMark' && (h.rule.action.value & acceptBit) !== 0 && (h.chain === wl || policyChains.has(h.chain)));
    const allowing = allowingRules(selected.enforced, dir, family, packet, sets);
    if (!allowHit) {
      return {
        ...base,
        ...withAdmin,
        ...passedBy,
        verdict: 'allowed',
        reason: 'other',
        allowedBy: allowing,
        rule: null,
        disagreement: `${podRef(pod)} is isolated and no rule of its chains set the accept bit, yet the packet passed`,
      };
    }
    const merged = allowHit.chain === wl;
    let allowedBy = allowing;
    if (merged) {
      // The merged rule's port signature: its matches other than the one peer set.
      const set = allowHit.rule.matches.find((m) => m.kind === 'set');
      const rest = allowHit.rule.matches.filter((m) => m.kind !== 'set');
      const peerDir = set && set.kind === 'set' && set.dir !== 'dst,dst' ? set.dir : null;
      allowedBy = allowingRules(selected.merged, dir, family, packet, sets, (alt) => sameSignature(alt, rest, peerDir));
    }
    const extra = allowedBy.length === 0 ? { disagreement: `${allowHit.chain} rule ${allowHit.position} allowed it, yet no policy rule it stands for matches` } : {};
    return { ...base, ...withAdmin, ...extra, ...passedBy, verdict: 'allowed', reason: 'network-policy', allowedBy, rule: decided(allowHit, merged) };
  }
  const auditOnly = selected.auditOnly.length > 0 ? { auditOnly: { policies: selected.auditOnly.map((p) => p.key), wouldAllowBy: allowingRules(selected.auditOnly, dir, family, packet, sets) } } : {};
  const baselineHit = inPod.find((h) => h.chain === tierChain('baseline') && h.rule.action.kind === 'return');
  const notIsolated = inPod.find((h) => h.chain === wl && h.rule.action.kind === 'setMark' && (h.rule.action.value & acceptBit) !== 0 && h.rule.comment?.includes('is not isolated'));
  if (baselineHit) {
    const d = decision('baseline');
    const extra =
      d && d.first.action !== 'Deny' ? {} : { disagreement: `the Baseline tier chain returned at rule ${baselineHit.position}, its policies' first matching rule is ${d ? d.first.action : 'none'}` };
    const accepted = d?.first.action === 'Accept';
    return {
      ...base,
      ...withAdmin,
      ...extra,
      ...passedBy,
      ...auditOnly,
      verdict: accepted ? 'allowed' : 'not isolated',
      reason: accepted ? 'cluster-policy' : 'not-isolated',
      ...clusterRule('baseline'),
      rule: decided(baselineHit, mergedTierRule(baselineHit)),
    };
  }
  const d = decision('baseline');
  const extra = d === null || d.first.action !== 'Deny' ? {} : { disagreement: `${d.first.name} rule ${d.first.rule} (Baseline Deny) matches, yet its chain let the packet pass` };
  return { ...base, ...withAdmin, ...extra, ...passedBy, ...auditOnly, verdict: 'not isolated', reason: 'not-isolated', rule: decided(notIsolated) };
}

function isolatedBy(s: DirectionSelection): NonNullable<DirectionResult['isolatedBy']> {
  return s.enforced.map((p: CompiledPolicy) => ({ namespace: p.namespace, name: p.name, invalid: p.errors.length > 0 }));
}

const ruleText = (dir: Direction) => (r: PolicyRuleRef) => `${r.namespace}/${r.name} ${dir} rule ${r.rule}`;
