// The hook check between resyncs. Another program may delete or move Weir's hook at any time;
// a cheap read of the hooked chains finds it long before the next resync would. The check runs
// beside the loop, so a change that arrives meanwhile is written without waiting for it; damage
// found, or a check that fails, owes a full resync at once.

import type { Clock } from '../clock.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { codeOf, round } from './log-fields.ts';

/** What the check needs from the dataplane (DataplanePort.hookIntact). */
export interface HookReader {
  hookIntact(): Promise<boolean>;
}

export interface HookWatchOptions {
  readonly dataplane: HookReader;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly clock: Clock;
  /** How often the hook is checked once a resync has written it; 0 turns the check off. */
  readonly intervalMs: number;
  /** The hook is missing or moved, or could not be checked: a full resync is owed from `now`. */
  readonly onDamage: (now: number) => void;
  /** A check has ended, whatever it found. */
  readonly onEnded: () => void;
}

export class HookWatch {
  readonly #o: HookWatchOptions;
  #dueAt: number | null = null;
  /** The check under way, if any. */
  #running: Promise<void> | null = null;

  constructor(o: HookWatchOptions) {
    this.#o = o;
  }

  /** When the next check is due (null: none is, before the first resync or while one runs). */
  get dueAt(): number | null {
    return this.#dueAt;
  }

  get running(): boolean {
    return this.#running !== null;
  }

  /** Resolves when the check under way, if any, has ended. */
  async whenDone(): Promise<void> {
    await this.#running;
  }

  /** A resync has just put the hook back, so the next check is an interval away. */
  rearm(now: number): void {
    this.#dueAt = this.#o.intervalMs > 0 ? now + this.#o.intervalMs : null;
  }

  /** Starts a check if one is due. In a pass that writes a change it waits for the next pass,
   *  so the two do not share the cores, unless a steady stream of changes has put it off by a
   *  whole interval. */
  startIfDue(now: number, writesChanges: boolean): void {
    const dueAt = this.#dueAt;
    if (this.#running !== null || dueAt === null || now < dueAt) return;
    if (writesChanges && now < dueAt + this.#o.intervalMs) return;
    this.#dueAt = null;
    this.#running = this.#check().finally(() => {
      this.#running = null;
      this.#o.onEnded();
    });
  }

  async #check(): Promise<void> {
    const { clock, dataplane, log, metrics } = this.#o;
    const t0 = clock.now();
    let intact: boolean;
    try {
      intact = await dataplane.hookIntact();
      // What the check costs beside the writes (bench:agent lists it next to slow changes).
      log.debug({ intact, ms: round(clock.now() - t0) }, 'hook checked');
      if (!intact) {
        metrics.driftRepairs.inc({ what: 'hook' });
        log.warn({ what: 'hook' }, "Weir's hook was removed or moved by another program; resyncing now");
      }
    } catch (err) {
      const code = codeOf(err);
      metrics.errors.inc({ reason: code });
      log.warn({ err, code }, "could not check Weir's FORWARD hook; resyncing to be sure");
      intact = false;
    }
    const now = clock.now();
    // Damage is repaired by the resync it owes, whose success schedules the next check.
    if (intact) this.#dueAt = now + this.#o.intervalMs;
    else this.#o.onDamage(now);
  }
}
