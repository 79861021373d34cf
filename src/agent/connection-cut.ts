// The opt-in cut of existing connections: the kernel keeps accepting a tracked connection
// whatever the rules say now, so after a write Weir deletes the tracked entries of the
// connections of opted-in pods (calc/cut-opt-in.ts) that their new rules drop as new ones, and
// only those. It runs beside the loop, as flow-cleanup.ts does: a round reads the whole
// conntrack table, which must not hold up the next write.

import type { Clock } from '../clock.ts';
import type { FlowTuple, TrackedFlow } from '../dataplane/conntrack.ts';
import type { FlowPacket, JudgedEnds } from '../explain/flow-judge.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { type Family, familyOf } from '../model/types.ts';
import { codeOf, round } from './log-fields.ts';

/** What the cut needs from the dataplane (DataplanePort). */
export interface FlowCutter {
  listFlows(family: Family): Promise<TrackedFlow[]>;
  /** Resolves with whether the entry was still there. */
  deleteFlow(flow: TrackedFlow): Promise<boolean>;
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

/** Connections named in one log line at most. */
const LOGGED_FLOWS = 10;

/** What the policy chains saw of a connection: its original source, and the reply's source
 *  and port (the real endpoint behind a Service's DNAT). */
export function flowPacket(f: TrackedFlow): FlowPacket {
  return { family: f.family, protocol: f.protocol, src: f.orig.src, dst: f.reply.src, dport: f.reply.sport };
}

const tupleText = (t: FlowTuple) => `${t.src}:${t.sport} -> ${t.dst}:${t.dport}`;

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
    const cut: TrackedFlow[] = [];
    for (const family of [...new Set(this.#o.targets().map(familyOf))].sort()) {
      const flows = await dataplane.listFlows(family);
      // Judged after the listing, all at once: by rules at least as new as the kernel's.
      const targets = new Set(this.#o.targets());
      const dropped = this.#o.judge();
      const denied = flows.filter((f) => {
        const p = flowPacket(f);
        const ends = { source: targets.has(p.src), destination: targets.has(p.dst) };
        if ((!ends.source && !ends.destination) || own.has(p.src) || own.has(p.dst)) return false;
        judged++;
        return dropped(p, ends);
      });
      for (const f of denied) if (await dataplane.deleteFlow(f)) cut.push(f);
    }
    if (cut.length > 0) {
      metrics.connectionsCut.inc(cut.length);
      log.info(
        { cut: cut.length, judged, ms: round(clock.now() - t0), connections: cut.slice(0, LOGGED_FLOWS).map((f) => `${f.protocol} ${tupleText(f.orig)}`) },
        'cut the tracked connections the rules now deny',
      );
    } else log.debug({ judged, ms: round(clock.now() - t0) }, 'no tracked connection to cut');
  }
}
