// What a NodePolicyStatus says, computed from what the agent knows. Bounded whatever the number
// of policies the node enforces: counts, the failing (invalid) policies up to a cap, the
// policies whose changes a failing apply carries (the controller makes Events of them), and the
// digests of every enforced (uid, generation) pair that the aggregator needs for Enforced
// (./realization.ts). Pure.

import { conditionsKey, mergeConditions, parseConditions, REASON_PATTERN, rfc3339, truncate } from './conditions.ts';
import type { Condition, ConditionSpec } from './conditions.ts';
import { decodeDigest, digestOf, encodeDigest } from './realization.ts';
import { compareStrings } from '../model/order.ts';

export interface PolicyRef {
  /** '' for a ClusterNetworkPolicy: cluster-scoped, named by its name alone. */
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
}

/** A policy the node enforces (it selects a local pod), at the generation the kernel holds: a
 *  NetworkPolicy, or a ClusterNetworkPolicy whose subject holds a local pod. */
export interface EnforcedPolicy extends PolicyRef {
  readonly generation: number;
  /** Set when the policy is invalid: the node then isolates its pods without allowing anything. */
  readonly error?: string;
}

export interface NodeCounts {
  readonly localPods: number;
  readonly policies: number;
  readonly sets: number;
  readonly chains: number;
  readonly rules: number;
}

/** Something wrong on the node that is not an apply failure, e.g. br_netfilter off. */
export interface NodeProblem {
  /** CamelCase, e.g. BrNetfilterDisabled. */
  readonly reason: string;
  readonly message: string;
}

export type ApplyOutcome = { readonly ok: true } | { readonly ok: false; readonly message: string };

/** What the agent hands the node reporter after each apply (or failed apply). */
export interface NodeStatusInput {
  /** The source has delivered its first complete view of the cluster. */
  readonly synced: boolean;
  /** The outcome of the latest apply; null before the first one. */
  readonly lastApply: ApplyOutcome | null;
  /** When the kernel was last made to match the desired state (epoch ms); null: never. */
  readonly lastSyncTime: number | null;
  readonly counts: NodeCounts;
  readonly policies: readonly EnforcedPolicy[];
  readonly problems?: readonly NodeProblem[];
  /** While applies fail: the policies whose changes could not be applied, each with the error. */
  readonly applyFailures?: readonly FailingPolicy[];
  /** Set once the agent removed all of Weir's rules for this uninstall (its token). */
  readonly removedFor?: string;
}

/** A failing policy as listed in the status; the error is cut to MAX_FAILING_ERROR characters. */
export interface FailingPolicy extends EnforcedPolicy {
  readonly error: string;
}

/** Digests of the enforced (uid, generation) pairs, by uid bucket (./realization.ts). */
export interface PolicyDigest {
  readonly buckets: number;
  /** 16 hex characters per bucket. */
  readonly digests: string;
}

/** The `status` of a NodePolicyStatus, key order as written. */
export interface NodeStatus {
  readonly conditions: readonly Condition[];
  readonly lastSyncTime?: string;
  readonly counts: NodeCounts & { readonly failingPolicies: number };
  /** The first MAX_LISTED_FAILING failing policies, sorted by namespace, name, uid. */
  readonly failingPolicies: readonly FailingPolicy[];
  /** Failing policies left out of the list. */
  readonly failingPoliciesOmitted: number;
  /** The first MAX_LISTED_FAILING policies the failing applies carried; empty once one succeeds. */
  readonly applyFailures: readonly FailingPolicy[];
  readonly removedFor?: string;
  readonly policyDigest: PolicyDigest;
}

/** How many invalid policies the Degraded message names before "and N more". */
export const MAX_NAMED_INVALID = 5;
/** How many failing policies the status lists (the CRD's maxItems). */
export const MAX_LISTED_FAILING = 20;
/** The longest error listed per failing policy (the CRD's maxLength). */
export const MAX_FAILING_ERROR = 1024;
/** The longest error text the Degraded message quotes per named policy. */
const MAX_NAMED_ERROR = 256;

export function nodeConditionSpecs(input: NodeStatusInput): ConditionSpec[] {
  const { synced, lastApply } = input;
  if (input.removedFor !== undefined) {
    const message = `uninstall ${input.removedFor}: every chain, hook rule and ipset of Weir's was removed; this node enforces no policy`;
    return [
      { type: 'Ready', status: 'False', reason: 'Removed', message },
      { type: 'Programmed', status: 'False', reason: 'Removed', message },
      { type: 'Degraded', status: 'False', reason: 'AsExpected', message: 'no problems' },
    ];
  }
  const ready: ConditionSpec = !synced
    ? { type: 'Ready', status: 'False', reason: 'WaitingForSync', message: 'waiting for the first complete view of the cluster' }
    : lastApply === null
      ? { type: 'Ready', status: 'False', reason: 'NotYetApplied', message: 'synced, but nothing has been applied to the kernel yet' }
      : !lastApply.ok
        ? { type: 'Ready', status: 'False', reason: 'ApplyFailed', message: `the kernel may not hold the latest policy state: ${lastApply.message}` }
        : { type: 'Ready', status: 'True', reason: 'Synced', message: 'synced with the cluster; the kernel holds the latest policy state' };
  const programmed: ConditionSpec =
    lastApply === null
      ? { type: 'Programmed', status: 'Unknown', reason: 'NotYetApplied', message: 'no apply has run yet' }
      : lastApply.ok
        ? { type: 'Programmed', status: 'True', reason: 'Applied', message: 'the last apply succeeded' }
        : { type: 'Programmed', status: 'False', reason: 'ApplyFailed', message: lastApply.message };

  const problems: NodeProblem[] = [];
  if (lastApply !== null && !lastApply.ok) problems.push({ reason: 'ApplyFailed', message: `apply failed: ${lastApply.message}` });
  const invalid = sortPolicies(input.policies.filter((p) => p.error !== undefined));
  if (invalid.length > 0) {
    const named = invalid.slice(0, MAX_NAMED_INVALID).map((p) => `${policyName(p)} (${truncate(p.error ?? '', MAX_NAMED_ERROR)})`);
    const more = invalid.length > MAX_NAMED_INVALID ? ` and ${invalid.length - MAX_NAMED_INVALID} more` : '';
    problems.push({
      reason: 'InvalidPolicies',
      message: `${invalid.length} invalid ${invalid.length === 1 ? 'policy isolates its' : 'policies isolate their'} pods: ${named.join(', ')}${more}`,
    });
  }
  for (const p of input.problems ?? []) problems.push({ reason: REASON_PATTERN.test(p.reason) ? p.reason : 'NodeProblem', message: p.message });
  const degraded: ConditionSpec =
    problems.length === 0
      ? { type: 'Degraded', status: 'False', reason: 'AsExpected', message: 'no problems' }
      : { type: 'Degraded', status: 'True', reason: problems[0].reason, message: problems.map((p) => p.message).join('; ') };
  return [ready, programmed, degraded];
}

export function buildNodeStatus(input: NodeStatusInput, previous: readonly Condition[] | undefined, nowMs: number): NodeStatus {
  const c = input.counts;
  const failing = input.policies.filter((p) => p.error !== undefined);
  const digest = digestOf(input.policies);
  return {
    conditions: mergeConditions(previous, nodeConditionSpecs(input), nowMs),
    ...(input.lastSyncTime === null ? {} : { lastSyncTime: rfc3339(input.lastSyncTime) }),
    counts: { localPods: c.localPods, policies: c.policies, sets: c.sets, chains: c.chains, rules: c.rules, failingPolicies: failing.length },
    failingPolicies: listed(failing),
    failingPoliciesOmitted: Math.max(0, failing.length - MAX_LISTED_FAILING),
    applyFailures: input.lastApply === null || input.lastApply.ok ? [] : listed(input.applyFailures ?? []),
    ...(input.removedFor === undefined ? {} : { removedFor: input.removedFor }),
    policyDigest: { buckets: digest.buckets, digests: encodeDigest(digest) },
  };
}

/** namespace/name, or the kind and name of a ClusterNetworkPolicy. */
function policyName(p: PolicyRef): string {
  return p.namespace === '' ? `ClusterNetworkPolicy ${p.name}` : `${p.namespace}/${p.name}`;
}

/** The first MAX_LISTED_FAILING, sorted, errors cut to the CRD's bound. */
function listed(ps: readonly EnforcedPolicy[]): FailingPolicy[] {
  return sortPolicies(ps)
    .slice(0, MAX_LISTED_FAILING)
    .map((p) => ({ namespace: p.namespace, name: p.name, uid: p.uid, generation: p.generation, error: truncate(p.error ?? '', MAX_FAILING_ERROR) }));
}

function sortPolicies<T extends PolicyRef>(ps: readonly T[]): T[] {
  const key = (p: PolicyRef) => `${p.namespace}\0${p.name}\0${p.uid}`;
  return [...ps].sort((a, b) => compareStrings(key(a), key(b)));
}

/** Reads the status of a NodePolicyStatus back; malformed parts are left out. */
export function parseNodeStatus(raw: unknown): NodeStatus | null {
  if (typeof raw !== 'object' || raw === null) return null;
  const s = raw as Record<string, unknown>;
  const counts = (typeof s.counts === 'object' && s.counts !== null ? s.counts : {}) as Record<string, unknown>;
  const num = (v: unknown) => (typeof v === 'number' ? v : 0);
  const digest = (typeof s.policyDigest === 'object' && s.policyDigest !== null ? s.policyDigest : {}) as Record<string, unknown>;
  return {
    conditions: parseConditions(s.conditions),
    ...(typeof s.lastSyncTime === 'string' ? { lastSyncTime: s.lastSyncTime } : {}),
    counts: {
      localPods: num(counts.localPods),
      policies: num(counts.policies),
      sets: num(counts.sets),
      chains: num(counts.chains),
      rules: num(counts.rules),
      failingPolicies: num(counts.failingPolicies),
    },
    failingPolicies: parseFailing(s.failingPolicies),
    failingPoliciesOmitted: num(s.failingPoliciesOmitted),
    applyFailures: parseFailing(s.applyFailures),
    ...(typeof s.removedFor === 'string' ? { removedFor: s.removedFor } : {}),
    policyDigest: { buckets: num(digest.buckets), digests: typeof digest.digests === 'string' ? digest.digests : '' },
  };
}

export function parseFailing(raw: unknown): FailingPolicy[] {
  if (!Array.isArray(raw)) return [];
  const out: FailingPolicy[] = [];
  for (const p of raw as unknown[]) {
    if (typeof p !== 'object' || p === null) continue;
    const { namespace, name, uid, generation, error } = p as Record<string, unknown>;
    if (typeof namespace !== 'string' || typeof name !== 'string' || typeof uid !== 'string' || typeof generation !== 'number' || typeof error !== 'string') continue;
    out.push({ namespace, name, uid, generation, error });
  }
  return out;
}

/** The digests a NodePolicyStatus carries, or null when it has none readable (an object written
 *  by an older agent, or no status yet): such a node proves nothing. */
export function nodeDigestOf(rawStatus: unknown): ReturnType<typeof decodeDigest> {
  if (typeof rawStatus !== 'object' || rawStatus === null) return null;
  const d = (rawStatus as { policyDigest?: unknown }).policyDigest;
  if (typeof d !== 'object' || d === null) return null;
  const { buckets, digests } = d as Record<string, unknown>;
  return decodeDigest(buckets, digests);
}

/** Canonical text of everything but lastSyncTime, for "is a write needed". */
export function nodeStatusKey(s: NodeStatus): string {
  const c = s.counts;
  return JSON.stringify([
    conditionsKey(s.conditions),
    [c.localPods, c.policies, c.sets, c.chains, c.rules, c.failingPolicies],
    s.failingPolicies.map((p) => [p.namespace, p.name, p.uid, p.generation, p.error]),
    s.failingPoliciesOmitted,
    s.applyFailures.map((p) => [p.namespace, p.name, p.uid, p.generation, p.error]),
    s.removedFor ?? null,
    [s.policyDigest.buckets, s.policyDigest.digests],
  ]);
}

/** A write is needed when anything but lastSyncTime changed, or when lastSyncTime moved and the
 *  stored one is at least `heartbeatMs` old: a resync every 30 s should not mean a write every 30 s. */
export function nodeStatusNeedsWrite(stored: NodeStatus | null, next: NodeStatus, heartbeatMs: number): boolean {
  if (stored === null || nodeStatusKey(stored) !== nodeStatusKey(next)) return true;
  if (next.lastSyncTime === undefined || next.lastSyncTime === stored.lastSyncTime) return false;
  if (stored.lastSyncTime === undefined) return true;
  return Date.parse(next.lastSyncTime) - Date.parse(stored.lastSyncTime) >= heartbeatMs;
}
