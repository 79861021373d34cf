// The kube source's schedule in one place: watch lifetimes, the watchdog, the periodic relist,
// the retry backoff and the batching window. Ranges are picked at random per use, and retries
// are jittered, so that the agents of a cluster do not reconnect or relist in step
// (src/kube/reflector.ts).

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
