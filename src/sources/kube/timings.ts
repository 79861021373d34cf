// The kube source's schedule in one place: watch lifetimes, the watchdog, the periodic relist,
// the retry backoff and the batching window. Ranges are picked at random per use so that the
// agents of a cluster do not reconnect or relist in step.

import { backoffMs } from '../../backoff.ts';
import { DEFAULT_LIST_WATCH_TIMINGS, type ListWatchTimings } from '../../kube/reflector.ts';

/** The list+watch schedule of every kind, plus the retry backoff and the batching window. */
export interface KubeTimings extends ListWatchTimings {
  /** Retry delay after the first failure; it doubles per consecutive failure up to backoffMaxMs. */
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  /** Changes arriving within this window from the first one go out as one batch. */
  readonly coalesceMs: number;
}

export const DEFAULT_KUBE_TIMINGS: KubeTimings = {
  ...DEFAULT_LIST_WATCH_TIMINGS,
  backoffInitialMs: 500,
  backoffMaxMs: 30_000,
  coalesceMs: 5,
};

/** A value in [min, max]; `random` returns [0, 1) like Math.random. */
export function pickBetween(range: readonly [number, number], random: () => number): number {
  const [min, max] = range;
  return min + (max - min) * random();
}

/** Delay before retry number `attempt` (1 = the first retry; 0 counts as the first): the one
 *  backoff (src/backoff.ts) with equal jitter, so a crowd of agents spreads out while each still
 *  waits at least half the step. */
export function backoffDelay(attempt: number, t: Pick<KubeTimings, 'backoffInitialMs' | 'backoffMaxMs'>, random: () => number): number {
  return Math.round(backoffMs(Math.max(1, attempt), { initialMs: t.backoffInitialMs, maxMs: t.backoffMaxMs }, random));
}
