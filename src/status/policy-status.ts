// What a NetworkPolicyStatus says: is the policy accepted, and has every node that should
// enforce it realized its current generation (the realization comes from ./realization.ts). Pure.

import { conditionsKey, mergeConditions, parseConditions } from './conditions.ts';
import type { Condition, ConditionSpec } from './conditions.ts';
import { compareStrings } from '../model/order.ts';

/** One policy as the controller hands it to the aggregator (src/controller/policy-inputs.ts). */
export interface PolicyStatusInput {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  readonly generation: number;
  /** ok: spec valid and supported; otherwise message names every field path at fault. */
  readonly accepted: { readonly ok: boolean; readonly message: string };
  /** Nodes running a pod the policy selects: the nodes that must enforce it. Not changed once
   *  passed in: the realization tracker keeps a sorted list as it is, without a copy. */
  readonly desiredNodes: readonly string[];
  /** 'audit' (weir.dev/enforcement: audit): evaluated and logged, never enforced. Default enforce. */
  readonly mode?: 'enforce' | 'audit';
}

/** Where a policy's current generation stands across the nodes that must enforce it. */
export interface Realization {
  readonly desired: number;
  readonly realized: number;
  /** Desired nodes that have not realized the generation yet, sorted. */
  readonly pending: readonly string[];
}

/** The `status` of a NetworkPolicyStatus, key order as written. */
export interface PolicyStatus {
  readonly observedGeneration: number;
  readonly conditions: readonly Condition[];
  readonly nodesDesired: number;
  readonly nodesRealized: number;
  /** "realized/desired", for the printer column. */
  readonly realized: string;
  /** The first MAX_PENDING_LISTED pending nodes. */
  readonly nodesPending: readonly string[];
  /** enforce or audit (the printer column Mode): an audit-only policy enforces nothing. */
  readonly mode: 'enforce' | 'audit';
}

export const MAX_PENDING_LISTED = 10;

/** Accepted and Enforced, as NetworkPolicyStatus and a ClusterNetworkPolicy's own status say them. */
export function policyConditionSpecs(policy: Pick<PolicyStatusInput, 'generation' | 'accepted' | 'mode'>, r: Realization): ConditionSpec[] {
  const accepted: ConditionSpec = policy.accepted.ok
    ? { type: 'Accepted', status: 'True', reason: 'Valid', message: policy.accepted.message || 'the spec is valid and supported' }
    : { type: 'Accepted', status: 'False', reason: 'Invalid', message: policy.accepted.message || 'the spec is invalid' };
  // A rejected policy is still enforced: it isolates the pods it selects (fail closed), so
  // Enforced reports realization either way.
  const gen = `generation ${policy.generation}`;
  let enforced: ConditionSpec;
  if (policy.mode === 'audit') {
    // Never True: a security team reading Enforced must not take an audit-only policy as held.
    const where = r.desired === 0 ? 'no node runs a pod it selects' : `${r.realized}/${r.desired} nodes log what ${gen} would drop`;
    enforced = { type: 'Enforced', status: 'False', reason: 'AuditOnly', message: `audit-only (weir.dev/enforcement: audit), never enforced: ${where}` };
  } else if (r.desired === 0) {
    enforced = { type: 'Enforced', status: 'True', reason: 'NoPodsSelected', message: 'no node runs a pod this policy selects' };
  } else if (r.pending.length === 0) {
    enforced = { type: 'Enforced', status: 'True', reason: 'AllNodesRealized', message: `${r.realized}/${r.desired} nodes enforce ${gen}` };
  } else {
    const shown = r.pending.slice(0, MAX_PENDING_LISTED).join(', ');
    const more = r.pending.length > MAX_PENDING_LISTED ? ` and ${r.pending.length - MAX_PENDING_LISTED} more` : '';
    enforced = {
      type: 'Enforced',
      status: 'False',
      reason: 'NodesPending',
      message: `${r.pending.length} of ${r.desired} nodes have not realized ${gen}: ${shown}${more}`,
    };
  }
  return [accepted, enforced];
}

export function buildPolicyStatus(policy: PolicyStatusInput, r: Realization, previous: readonly Condition[] | undefined, nowMs: number): PolicyStatus {
  return {
    observedGeneration: policy.generation,
    conditions: mergeConditions(previous, policyConditionSpecs(policy, r), nowMs, policy.generation),
    nodesDesired: r.desired,
    nodesRealized: r.realized,
    realized: `${r.realized}/${r.desired}`,
    nodesPending: r.pending.slice(0, MAX_PENDING_LISTED),
    mode: policy.mode ?? 'enforce',
  };
}

export function parsePolicyStatus(raw: unknown): PolicyStatus | null {
  if (typeof raw !== 'object' || raw === null) return null;
  const s = raw as Record<string, unknown>;
  const num = (v: unknown) => (typeof v === 'number' ? v : 0);
  return {
    observedGeneration: num(s.observedGeneration),
    conditions: parseConditions(s.conditions),
    nodesDesired: num(s.nodesDesired),
    nodesRealized: num(s.nodesRealized),
    realized: typeof s.realized === 'string' ? s.realized : '',
    nodesPending: Array.isArray(s.nodesPending) ? (s.nodesPending as unknown[]).filter((n): n is string => typeof n === 'string') : [],
    mode: s.mode === 'audit' ? 'audit' : 'enforce',
  };
}

/** Whether two statuses have the same policyStatusKey, without building either key: a pass
 *  compares every policy's status with the stored one, a string of garbage per policy each time. */
export function samePolicyStatus(a: PolicyStatus, b: PolicyStatus): boolean {
  if (a.observedGeneration !== b.observedGeneration || a.nodesDesired !== b.nodesDesired || a.nodesRealized !== b.nodesRealized) return false;
  if (a.realized !== b.realized || a.mode !== b.mode || !sameStrings(a.nodesPending, b.nodesPending)) return false;
  const ca = byType(a.conditions);
  const cb = byType(b.conditions);
  if (ca.length !== cb.length) return false;
  for (let i = 0; i < ca.length; i++) {
    const x = ca[i];
    const y = cb[i];
    if (x.type !== y.type || x.status !== y.status || (x.observedGeneration ?? null) !== (y.observedGeneration ?? null)) return false;
    if (x.lastTransitionTime !== y.lastTransitionTime || x.reason !== y.reason || x.message !== y.message) return false;
  }
  return true;
}

export function sameStrings(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** The conditions in conditionsKey's order (stable, by type): the list itself when it already is. */
function byType(cs: readonly Condition[]): readonly Condition[] {
  for (let i = 1; i < cs.length; i++) if (cs[i].type < cs[i - 1].type) return [...cs].sort((x, y) => compareStrings(x.type, y.type));
  return cs;
}

export function policyStatusKey(s: PolicyStatus): string {
  return JSON.stringify([s.observedGeneration, conditionsKey(s.conditions), s.nodesDesired, s.nodesRealized, s.realized, s.nodesPending, s.mode]);
}
