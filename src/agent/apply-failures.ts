// Which policies the failing applies carried, for the node's status (status.applyFailures): a
// retry carries no change of its own, yet the changes before it are still not applied, so they
// are remembered until an apply succeeds. Pure.

import type { FailingPolicy } from '../status/node-status.ts';
import type { PassOutcome } from './reconciler.ts';

/** Policies remembered while applies fail; the status lists the first 20 of them. */
export const MAX_REMEMBERED_FAILURES = 1_000;

export class ApplyFailures {
  /** By `namespace/name`: a policy deleted while failing is forgotten, not reported. */
  readonly #byKey = new Map<string, FailingPolicy>();

  /** Takes one pass's outcome; returns what the status should list now. */
  record(outcome: Pick<PassOutcome, 'ok' | 'error' | 'policyChanges'>): FailingPolicy[] {
    if (outcome.ok) {
      this.#byKey.clear();
      return [];
    }
    for (const { key, policy } of outcome.policyChanges) {
      if (policy === null) {
        this.#byKey.delete(key);
        continue;
      }
      if (this.#byKey.size >= MAX_REMEMBERED_FAILURES && !this.#byKey.has(key)) continue;
      const error = `could not apply generation ${policy.generation} (will retry): ${outcome.error ?? 'unknown error'}`;
      this.#byKey.set(key, { namespace: policy.namespace, name: policy.name, uid: policy.uid, generation: policy.generation, error });
    }
    return [...this.#byKey.values()];
  }
}
