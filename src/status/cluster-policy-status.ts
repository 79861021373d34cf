// What the controller writes into a ClusterNetworkPolicy's own status.conditions
// (policy.networking.k8s.io/v1beta1, whose status holds nothing else): Accepted and Enforced,
// worded as a NetworkPolicyStatus words them (./policy-status.ts), each with the generation it
// describes. The list is shared with whatever else writes conditions there; Weir's are these two
// types only, and server-side apply leaves the others to their owners. Pure.

import { mergeConditions, parseConditions } from './conditions.ts';
import type { Condition } from './conditions.ts';
import { policyConditionSpecs } from './policy-status.ts';
import type { Realization } from './policy-status.ts';
import { compareStrings } from '../model/order.ts';

/** One ClusterNetworkPolicy as the controller hands it to the aggregator. */
export interface ClusterPolicyStatusInput {
  /** Its identity: the object is cluster-scoped. */
  readonly name: string;
  readonly uid: string;
  readonly generation: number;
  /** ok: spec valid and supported; otherwise message names every field path at fault. */
  readonly accepted: { readonly ok: boolean; readonly message: string };
  /** Nodes running a pod of its subject: the nodes that must enforce it. */
  readonly desiredNodes: readonly string[];
}

/** The condition types Weir writes on a ClusterNetworkPolicy. */
export const CLUSTER_POLICY_CONDITION_TYPES: ReadonlySet<string> = new Set(['Accepted', 'Enforced']);

/** Weir's conditions for the policy's current generation, transition times carried over from
 *  `previous` (what the object holds of Weir's, for this same uid). */
export function buildClusterPolicyConditions(policy: ClusterPolicyStatusInput, r: Realization, previous: readonly Condition[] | undefined, nowMs: number): Condition[] {
  return mergeConditions(previous, policyConditionSpecs(policy, r), nowMs, policy.generation);
}

/** Weir's conditions in a ClusterNetworkPolicy's raw status, by type; those of other writers
 *  and malformed ones are left out. */
export function ownClusterPolicyConditions(rawStatus: unknown): Condition[] {
  const conditions = typeof rawStatus === 'object' && rawStatus !== null ? (rawStatus as { conditions?: unknown }).conditions : undefined;
  return parseConditions(conditions)
    .filter((c) => CLUSTER_POLICY_CONDITION_TYPES.has(c.type))
    .sort((a, b) => compareStrings(a.type, b.type));
}

/** Whether two condition lists say the same, whatever their order. */
export function sameConditions(a: readonly Condition[], b: readonly Condition[]): boolean {
  if (a.length !== b.length) return false;
  const byType = new Map(b.map((c) => [c.type, c]));
  for (const x of a) {
    const y = byType.get(x.type);
    if (y === undefined || x.status !== y.status || (x.observedGeneration ?? null) !== (y.observedGeneration ?? null)) return false;
    if (x.lastTransitionTime !== y.lastTransitionTime || x.reason !== y.reason || x.message !== y.message) return false;
  }
  return true;
}
