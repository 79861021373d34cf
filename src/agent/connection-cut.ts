// The opt-in cut of existing connections: the kernel keeps accepting a tracked connection
// whatever the rules say now, so after a write Weir deletes the tracked entries of the
// connections of opted-in pods (calc/cut-opt-in.ts) that their new rules drop as new ones, and
// only those. It runs beside the loop, as flow-cleanup.ts does: a round reads the whole
// conntrack table, which must not hold up the next write.

import type { Clock } from '../clock.ts';
import { type ConnectionFilter, connectionKey, type TrackedFlow } from '../dataplane/conntrack.ts';
import type { FlowPacket, JudgedEnds } from '../explain/flow-judge.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { type Family, familyOf } from '../model/types.ts';
import { deletionFilters, filterText, type JudgedConnection } from './cut-filters.ts';
import { codeOf, round } from './log-fields.ts';

/** What the cut needs from the dataplane (DataplanePort). */
export interface FlowCutter {
  listFlows(family: Family): Promise<TrackedFlow[]>;
  /** Deletes every connection the filter takes (a walk of the table); resolves with how many went. */
  deleteConnections(filter: ConnectionFilter): Promise<number>;
  /** The node's own addresses: its connections cross INPUT or OUTPUT, never the policed FORWARD. */
  localAddresses(): Promise<ReadonlySet<string>>;
}

export interface ConnectionCutOptions {
  readonly dataplane: FlowCutter;
  /** Addresses of the local pods whose connections are judged (calc.cutTargets). */
  readonly targets: () => readonly string[];
  /** A judge by the rules as they are now: whether the rules of those ends drop this
   *  connection as a new one (flow-judge.ts). */
  readonly judge: () => (flow: FlowPacket, ends: JudgedEnds) => boolean;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly clock: Clock;
  /** A round has ended, whatever it did. */
  readonly onEnded: () => void;
}

/** Connections judged between two turns of the event loop. */
const JUDGED_PER_SLICE = 1_000;
/** Deletions named in one log line at most. */
const LOGGED_FILTERS = 10;

export class ConnectionCut {
  readonly #o: ConnectionCutOptions;
  #running: Promise<void> | null = null;
  /** A write came while a round ran: another follows it. */
  #again = false;
  #stopped = false;

  constructor(o: ConnectionCutOptions) {
    this.#o = o;
  }

  get running(): boolean {
    return this.#running !== null;
  }

  /** No round starts after this, and one running stops at its next deletion. */
  stop(): void {
    this.#stopped = true;
  }

  async whenDone(): Promise<void> {
    while (this.#running !== null) await this.#running;
  }

  /** A write has committed: judge the connections again, now or after the round under way. */
  request(): void {
    if (this.#stopped) return;
    if (this.#running !== null) {
      this.#again = true;
      return;
    }
    if (this.#o.targets().length === 0) return;
    this.#running = this.#round()
      .catch((err: unknown) => {
        // The next write tries again; a connection left running is what Weir does without the opt-in.
        const code = codeOf(err);
        this.#o.metrics.errors.inc({ reason: code });
        this.#o.log.warn({ err, code }, 'could not cut the connections the new rules deny; will try after the next write');
      })
      .finally(() => {
        this.#running = null;
        if (this.#again) {
          this.#again = false;
          this.request();
        }
        this.#o.onEnded();
      });
  }

  async #round(): Promise<void> {
    const { clock, dataplane, log, metrics } = this.#o;
    const t0 = clock.now();
    const own = await dataplane.localAddresses();
    let judged = 0;
    let cut = 0;
    const done: ConnectionFilter[] = [];
    for (const family of [...new Set(this.#o.targets().map(familyOf))].sort()) {
      const flows = await dataplane.listFlows(family);
      // Judged after the listing: by rules at least as new as the kernel's (a slice may see
      // rules computed since and not yet written; they are written next).
      const targets = new Set(this.#o.targets());
      const dropped = this.#o.judge();
      const verdicts = new Map<string, boolean>();
      const listing: JudgedConnection[] = [];
      for (const [i, f] of flows.entries()) {
        // The loop computes and writes between slices: a large table must not hold it up.
        if (i > 0 && i % JUDGED_PER_SLICE === 0) {
          await new Promise((resolve) => setImmediate(resolve));
          if (this.#stopped) return;
        }
        const key = connectionKey(f);
        const ends = { source: targets.has(key.src), destination: targets.has(key.dst) };
        let denied = false;
        if ((ends.source || ends.destination) && !own.has(key.src) && !own.has(key.dst)) {
          judged++;
          // Connections of one key are judged alike.
          const id = `${key.protocol} ${key.src} ${key.dst} ${key.dport} ${ends.source} ${ends.destination}`;
          denied = verdicts.get(id) ?? dropped(key, ends);
          verdicts.set(id, denied);
        }
        listing.push({ key, denied });
      }
      for (const filter of deletionFilters(listing)) {
        // A shutdown does not wait for a long round: what is left stays, as without the opt-in.
        if (this.#stopped) break;
        const n = await dataplane.deleteConnections(filter);
        if (n > 0) done.push(filter);
        cut += n;
      }
    }
    if (cut > 0) {
      metrics.connectionsCut.inc(cut);
      log.info({ cut, judged, ms: round(clock.now() - t0), deletions: done.length, connections: done.slice(0, LOGGED_FILTERS).map(filterText) }, 'cut the tracked connections the rules now deny');
    } else log.debug({ judged, ms: round(clock.now() - t0) }, 'no tracked connection to cut');
  }
}
