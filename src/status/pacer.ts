// Runs a write pass when poked: never on the caller's stack, at most one pass at a time and
// one per interval, with the latest state (the pass reads it when it starts), and again with
// backoff after a failure. Every status writer runs its passes through one of these.

import type { Clock } from './clock.ts';
import { delayUntilNext } from './pacing.ts';
import type { PacingOptions } from './pacing.ts';

/** 'skipped': the pass found nothing to write. */
export type PassResult = 'ok' | 'error' | 'skipped';

export interface PacerOptions extends PacingOptions {
  readonly clock: Clock;
  /** One pass; resolves to what it did, rejects to ask for a retry. */
  readonly run: () => Promise<'ok' | 'skipped'>;
  readonly onResult: (result: PassResult, err?: unknown) => void;
}

export interface Pacer {
  /** Asks for a pass; returns at once. */
  poke(): void;
  /** Consecutive failed passes. */
  failures(): number;
  /** Cancels the pending pass and waits for a running one. */
  stop(): Promise<void>;
}

export function createPacer(o: PacerOptions): Pacer {
  const { clock } = o;
  let dirty = false;
  let failures = 0;
  let lastStart: number | null = null;
  let timer: unknown = null;
  let running: Promise<void> | null = null;
  let stopped = false;

  const schedule = (): void => {
    if (stopped || !dirty || timer !== null || running !== null) return;
    const delay = delayUntilNext(lastStart, failures, clock.now(), o);
    timer = clock.setTimeout(() => {
      timer = null;
      running = pass().then(([result, error]) => {
        running = null;
        // The next pass is scheduled before anybody hears about this one, so that a poke from
        // onResult (or from whoever it wakes) finds the pacer idle.
        schedule();
        try {
          o.onResult(result, error);
        } catch {
          // A faulty callback must not stop the writer.
        }
      });
    }, delay);
  };

  const pass = async (): Promise<[PassResult, unknown]> => {
    dirty = false;
    lastStart = clock.now();
    try {
      const result = await o.run();
      failures = 0;
      return [result, undefined];
    } catch (err) {
      // The state did not land: keep asking until it does.
      failures++;
      dirty = true;
      return ['error', err];
    }
  };

  return {
    poke() {
      dirty = true;
      schedule();
    },
    failures: () => failures,
    async stop() {
      stopped = true;
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      await running;
    },
  };
}
