// The status writers' schedule: their retry bounds, and when the next write may run for a
// writer that keeps its own timer (the event recorder). The delays come from the one backoff
// (src/backoff.ts). Pure.

import { backoffMs } from '../backoff.ts';
import type { PacingOptions } from '../pacer.ts';

export const DEFAULT_RETRY_MIN_MS = 1_000;
export const DEFAULT_RETRY_MAX_MS = 60_000;

/** How long from `now` until the next pass may start, given when the last one started. */
export function delayUntilNext(lastStartMs: number | null, failures: number, nowMs: number, o: PacingOptions): number {
  if (lastStartMs === null) return 0;
  const gap = Math.max(o.minIntervalMs, backoffMs(failures, { initialMs: o.retryMinMs, maxMs: o.retryMaxMs }));
  return Math.max(0, lastStartMs + gap - nowMs);
}
