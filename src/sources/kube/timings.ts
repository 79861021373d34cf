// The kube source's schedule in one place: watch lifetimes, the watchdog, the periodic relist,
// the retry backoff and the batching window. Ranges are picked at random per use so that the
// agents of a cluster do not reconnect or relist in step.

import { backoffMs } from '../../backoff.ts';

export interface KubeTimings {
  /** timeoutSeconds asked of the server per watch, picked from [min, max]. */
  readonly watchTimeoutSeconds: readonly [number, number];
  /** A watch that receives nothing, not even a bookmark, for this long is restarted. The API
   *  server bookmarks idle watches about once a minute, so three minutes means it is stuck. */
  readonly watchdogMs: number;
  /** Interval of the full relist that repairs missed events, picked from [min, max]. */
  readonly relistMs: readonly [number, number];
  /** Retry delay after the first failure; it doubles per consecutive failure up to backoffMaxMs. */
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  /** A watch that ran this long counts as healthy: the next failure starts the backoff afresh. */
  readonly healthyWatchMs: number;
  /** Limit on one list page request (a list call hanging forever has no watchdog otherwise). */
  readonly listTimeoutMs: number;
  /** Objects per list page (limit/continue). */
  readonly pageSize: number;
  /** Changes arriving within this window from the first one go out as one batch. */
  readonly coalesceMs: number;
}

export const DEFAULT_KUBE_TIMINGS: KubeTimings = {
  watchTimeoutSeconds: [300, 600],
  watchdogMs: 180_000,
  relistMs: [300_000, 600_000],
  backoffInitialMs: 500,
  backoffMaxMs: 30_000,
  healthyWatchMs: 30_000,
  listTimeoutMs: 60_000,
  pageSize: 500,
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
