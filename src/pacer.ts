// Runs a pass when poked: never on the caller's stack, one pass at a time, no sooner than it
// was asked for, at most one per interval, and again with backoff after a failure. It owns
// the only timer of whoever uses it (the reconcile loop, every status writer), so no second
// timer can start a pass early or outlive stop().

import { backoffMs } from './backoff.ts';
import type { Clock } from './clock.ts';

/** 'skipped': the pass found nothing to do. */
export type PassResult = 'ok' | 'error' | 'skipped';

export interface PacingOptions {
  /** At least this long between the starts of two passes (the rate limit). */
  readonly minIntervalMs: number;
  /** After a failed pass, the next waits this long from its end; doubling per consecutive
   *  failure... */
  readonly retryMinMs: number;
  /** ...up to this. */
  readonly retryMaxMs: number;
}

export interface PacerOptions extends PacingOptions {
  readonly clock: Clock;
  /** One pass; resolves to what it did, rejects to ask for a retry. */
  readonly run: () => Promise<'ok' | 'skipped'>;
  readonly onResult: (result: PassResult, err?: unknown) => void;
}

export interface Pacer {
  /** Asks for a pass `delayMs` from now (default: at once, within the limits); returns at
   *  once. Of several requests the earliest wins. */
  poke(delayMs?: number): void;
  /** Consecutive failed passes. */
  failures(): number;
  /** A pass is running. */
  busy(): boolean;
  /** Cancels the pending pass and waits for a running one; nothing is scheduled after. */
  stop(): Promise<void>;
}

export function createPacer(o: PacerOptions): Pacer {
  const { clock } = o;
  const retry = { initialMs: o.retryMinMs, maxMs: o.retryMaxMs };
  /** The earliest time a pass was asked for since the last one started; null: none asked. */
  let wantAt: number | null = null;
  let failures = 0;
  let lastStart: number | null = null;
  let lastEnd: number | null = null;
  let timer: unknown = null;
  let timerAt = 0;
  let running: Promise<void> | null = null;
  let stopped = false;

  const dueAt = (want: number): number => {
    let at = want;
    if (lastStart !== null) at = Math.max(at, lastStart + o.minIntervalMs);
    if (lastEnd !== null) at = Math.max(at, lastEnd + backoffMs(failures, retry));
    return at;
  };

  const schedule = (): void => {
    if (stopped || wantAt === null || running !== null) return;
    const at = dueAt(wantAt);
    if (timer !== null) {
      if (timerAt <= at) return;
      clock.clearTimeout(timer);
    }
    timerAt = at;
    timer = clock.setTimeout(fire, Math.max(0, at - clock.now()));
  };

  const fire = (): void => {
    timer = null;
    wantAt = null;
    lastStart = clock.now();
    running = pass().then(([result, error]) => {
      lastEnd = clock.now();
      running = null;
      // The next pass is scheduled before anybody hears about this one, so that a poke from
      // onResult (or from whoever it wakes) finds the pacer idle.
      schedule();
      try {
        o.onResult(result, error);
      } catch {
        // A faulty callback must not stop the passes.
      }
    });
  };

  const pass = async (): Promise<[PassResult, unknown]> => {
    try {
      const result = await o.run();
      failures = 0;
      return [result, undefined];
    } catch (err) {
      // The work did not land: keep asking until it does.
      failures++;
      const now = clock.now();
      wantAt = wantAt === null ? now : Math.min(wantAt, now);
      return ['error', err];
    }
  };

  return {
    poke(delayMs = 0) {
      const at = clock.now() + Math.max(0, delayMs);
      wantAt = wantAt === null ? at : Math.min(wantAt, at);
      schedule();
    },
    failures: () => failures,
    busy: () => running !== null,
    async stop() {
      stopped = true;
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      await running;
    },
  };
}
