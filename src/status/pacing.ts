// When the next write may run: at most one per interval, later after failures. Pure; the
// pacer and the event recorder apply it with their clock.

export interface PacingOptions {
  /** At least this long between two passes (the rate limit). */
  readonly minIntervalMs: number;
  /** The first retry delay after a failure; it doubles per consecutive failure... */
  readonly retryMinMs: number;
  /** ...up to this. */
  readonly retryMaxMs: number;
}

export const DEFAULT_RETRY_MIN_MS = 1_000;
export const DEFAULT_RETRY_MAX_MS = 60_000;

/** The delay a run of `failures` consecutive failures asks for (0 without failures). */
export function backoffMs(failures: number, o: Pick<PacingOptions, 'retryMinMs' | 'retryMaxMs'>): number {
  if (failures <= 0) return 0;
  // Capped exponent: 2 ** 1000 is Infinity, which min() handles, but stay in safe integers.
  return Math.min(o.retryMaxMs, o.retryMinMs * 2 ** Math.min(failures - 1, 40));
}

/** How long from `now` until the next pass may start, given when the last one started. */
export function delayUntilNext(lastStartMs: number | null, failures: number, nowMs: number, o: PacingOptions): number {
  if (lastStartMs === null) return 0;
  const gap = Math.max(o.minIntervalMs, backoffMs(failures, o));
  return Math.max(0, lastStartMs + gap - nowMs);
}
