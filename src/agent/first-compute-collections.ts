// Full garbage collections around a cold start's first compute. V8 collects the lists' garbage,
// and what the first compute promotes, only as its heap grows further, and never shrinks its
// heap by itself at rest: collected at these moments instead, the start's peak memory and the
// memory at rest are lower, for a little more time before enforcement (docs/design/agent.md,
// "Figures behind the choices").

import type { Clock } from '../clock.ts';
import type { Logger } from '../log.ts';
import { round } from './log-fields.ts';

/** Events a first full state needs for the collections, unless it is computed in slices: each
 *  collection costs tens of ms even on a small heap, which a small cluster's start-up would
 *  wait for to free a few MB. */
export const COLLECT_GARBAGE_FROM = 10_000;

export interface FirstComputeCollectionsOptions {
  /** A full collection, compacting with `compact` (agent/gc.ts); absent: none runs. */
  readonly collectGarbage?: (compact: boolean) => void;
  /** Events per compute of the first full state (absent: one compute). */
  readonly firstComputeSlice?: number;
  /** Default COLLECT_GARBAGE_FROM. */
  readonly collectGarbageFrom?: number;
  readonly log: Logger;
  readonly clock: Clock;
}

export class FirstComputeCollections {
  readonly #o: FirstComputeCollectionsOptions;
  /** The first full state was large enough to collect after: once its write succeeds. */
  #afterWrite = false;

  constructor(o: FirstComputeCollectionsOptions) {
    this.#o = o;
  }

  /**
   * Called once, before the first full state of `events` events is computed. When it is large,
   * or is to be computed in slices, collects the lists' garbage first, so the compute fills the
   * space it leaves instead of new pages; returns how many events to compute at a time
   * (Infinity: all at once, with no collection).
   */
  beforeFirstCompute(events: number): number {
    const { collectGarbage, collectGarbageFrom = COLLECT_GARBAGE_FROM } = this.#o;
    const sliceSize = Math.max(1, this.#o.firstComputeSlice ?? Number.POSITIVE_INFINITY);
    if (collectGarbage === undefined || (events < collectGarbageFrom && events <= sliceSize)) return Number.POSITIVE_INFINITY;
    this.#collect('before the first compute', false);
    this.#afterWrite = true;
    return sliceSize;
  }

  /** Each slice's garbage is collected before the next slice is computed. */
  betweenSlices(): void {
    this.#collect('between slices of the first compute', false);
  }

  /** After a successful write: once, a compacting collection, if the first compute earned one. */
  afterWrite(): void {
    if (!this.#afterWrite) return;
    this.#afterWrite = false;
    this.#collect('after the first write', true);
  }

  #collect(when: string, compact: boolean): void {
    const { clock, collectGarbage, log } = this.#o;
    if (collectGarbage === undefined) return;
    const t0 = clock.now();
    collectGarbage(compact);
    log.debug({ ms: round(clock.now() - t0) }, `collected garbage ${when}`);
  }
}
