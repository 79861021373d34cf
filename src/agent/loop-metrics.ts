// What the loop counts and measures: source events, compute and write durations, the written
// state's sizes, and the time from a batch's arrival to the write that enforces it
// (weir_event_to_enforced_seconds).

import type { Metrics } from '../metrics/index.ts';
import type { CalcEvent } from '../model/types.ts';

/** Arrival times kept for the event-to-enforced histogram while writes fail: the oldest ones
 *  (the longest waits); later batches of the same write are not observed. */
export const MAX_UNAPPLIED = 1_000;

/** What a successful write leaves, for the gauges. */
export interface WrittenState {
  readonly sets: number;
  readonly chains: number;
  readonly rules: number;
  readonly localPods: number;
  readonly policies: { readonly valid: number; readonly invalid: number };
}

export class LoopMetrics {
  readonly #m: Metrics;
  /** Arrival times of queued batches, then of batches taken into calc but not yet in the
   *  kernel; both bounded by MAX_UNAPPLIED. */
  readonly #arrivals: number[] = [];
  readonly #unapplied: number[] = [];

  constructor(metrics: Metrics) {
    this.#m = metrics;
  }

  /** A source batch was queued at `now`. */
  arrived(now: number): void {
    if (this.#arrivals.length < MAX_UNAPPLIED) this.#arrivals.push(now);
  }

  /** The queued batches were taken into calc: the next successful write enforces them. */
  taken(): void {
    for (const at of this.#arrivals.splice(0)) if (this.#unapplied.length < MAX_UNAPPLIED) this.#unapplied.push(at);
  }

  sourceEvents(events: readonly CalcEvent[]): void {
    for (const e of events) this.#m.sourceEvents.inc({ kind: e.kind });
  }

  invalidPolicy(): void {
    this.#m.errors.inc({ reason: 'WEIR_POLICY_INVALID' });
  }

  computed(ms: number): void {
    this.#m.calcDuration.observe(ms / 1000);
  }

  writeFailed(code: string): void {
    this.#m.errors.inc({ reason: code });
    this.#m.applies.inc({ result: 'error' });
  }

  /** A write of `step` succeeded at `now` after `ms`: every batch taken before it is enforced. */
  written(now: number, step: 'resync' | 'tidy' | 'total', ms: number, state: WrittenState): void {
    const m = this.#m;
    for (const at of this.#unapplied.splice(0)) m.enforceLatency.observe((now - at) / 1000);
    m.applyDuration.observe({ step }, ms / 1000);
    m.applies.inc({ result: 'ok' });
    m.sets.set(state.sets);
    m.chains.set(state.chains);
    m.rules.set(state.rules);
    m.localPods.set(state.localPods);
    m.policies.set({ state: 'valid' }, state.policies.valid);
    m.policies.set({ state: 'invalid' }, state.policies.invalid);
  }
}
