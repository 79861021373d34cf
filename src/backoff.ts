// The one retry schedule: every retry in Weir (the reconcile loop, the status writers, the
// kube watches, the xtables lock) waits backoffMs(attempt) between tries. Pure.

export interface Backoff {
  /** The delay before the first retry... */
  readonly initialMs: number;
  /** ...doubling per consecutive failure up to this. */
  readonly maxMs: number;
}

/**
 * The delay before retry number `attempt` (1 = the first retry; 0 or less: no failure, no
 * delay). With `random` (returning [0, 1) like Math.random) the delay gets "equal jitter":
 * between half and all of the step, so a crowd of agents spreads out while each still waits
 * at least half the step.
 */
export function backoffMs(attempt: number, b: Backoff, random?: () => number): number {
  if (attempt <= 0) return 0;
  // A capped exponent: 2 ** 1000 is Infinity, which min() handles, but stay in safe integers.
  const step = Math.min(b.maxMs, b.initialMs * 2 ** Math.min(attempt - 1, 40));
  return random ? step / 2 + (step / 2) * random() : step;
}
