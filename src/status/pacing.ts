// The status writers' schedule: the options every writer takes, their retry bounds, and when
// the next write may run for a writer that keeps its own timer (the event recorder). The delays
// come from the one backoff (src/backoff.ts). Pure.

import type { KubeConfig } from '@kubernetes/client-node';
import { backoffMs } from '../backoff.ts';
import type { Clock } from '../clock.ts';
import type { RequestRecord } from '../kube/client.ts';
import type { Logger } from '../log.ts';
import type { PacingOptions, PassResult } from '../pacer.ts';

/** What every status writer is given. */
export interface StatusWriterOptions {
  readonly kubeConfig: KubeConfig;
  readonly log: Logger;
  readonly clock?: Clock;
  /** Sees every request the writer sends (e.g. to count them). */
  readonly onRequest?: (r: RequestRecord) => void;
}

/** What a writer paced by src/pacer.ts is given besides: the node reporter, the policy status
 *  aggregator. */
export interface PacedWriterOptions extends StatusWriterOptions {
  /** At most one pass per this many ms; the latest input wins. */
  readonly minIntervalMs?: number;
  /** The backoff of failed passes (and of the aggregator's failed lists and watches). */
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  /** Called after every pass: 'skipped' when there was nothing new to write. */
  readonly onWrite?: (result: PassResult) => void;
}

export const DEFAULT_RETRY_MIN_MS = 1_000;
export const DEFAULT_RETRY_MAX_MS = 60_000;

/** How long from `now` until the next pass may start, given when the last one started. */
export function delayUntilNext(lastStartMs: number | null, failures: number, nowMs: number, o: PacingOptions): number {
  if (lastStartMs === null) return 0;
  const gap = Math.max(o.minIntervalMs, backoffMs(failures, { initialMs: o.retryMinMs, maxMs: o.retryMaxMs }));
  return Math.max(0, lastStartMs + gap - nowMs);
}
