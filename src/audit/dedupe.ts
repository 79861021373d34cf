// Folds identical audit lines (same verdict, policy, rule, source IP, destination IP and port,
// protocol) seen within one window (1 s) of the first into one line with a count. A line is
// released when its window closes. Pure: the caller passes the time of each call.

import type { AuditTag } from '../calc/audit-tags.ts';
import type { NflogEvent } from './pcap.ts';

/** What makes two events one line: everything written but the time, the source port and the
 *  pod names (which follow from the addresses). Direction and the isolating policies are
 *  part of the verdict's meaning, so they are in it too. */
export function dedupeKey(tag: AuditTag, e: NflogEvent): string {
  const p = tag.policy;
  // JSON for the parts a name could make ambiguous; the rest are numbers, IPs and fixed words.
  const policy = p === null ? `-${tag.reason ?? ''}${tag.isolatedBy ? JSON.stringify(tag.isolatedBy.map((r) => [r.namespace, r.name])) : ''}` : JSON.stringify([p.namespace, p.name, p.rule]);
  return `${tag.verdict} ${tag.direction} ${policy} ${e.protocol} ${e.srcIp} ${e.dstIp} ${e.dstPort}`;
}

export interface Folded<T> {
  /** What the first occurrence made. */
  readonly value: T;
  readonly count: number;
}

export type AddResult = 'new' | 'folded' | 'dropped';

interface Entry<T> {
  value: T;
  count: number;
  closesAt: number;
}

export class Deduper<T> {
  readonly #windowMs: number;
  readonly #maxPending: number;
  /** Insertion order is the order of first occurrence, so windows close from the front. */
  readonly #open = new Map<string, Entry<T>>();
  /** Lines whose window closed, taken out early (see add), released first by due(). */
  #ready: Folded<T>[] = [];

  constructor(opts: { windowMs?: number; maxPending?: number } = {}) {
    this.#windowMs = opts.windowMs ?? 1000;
    this.#maxPending = opts.maxPending ?? 100_000;
  }

  /** Lines not yet released. */
  get size(): number {
    return this.#open.size + this.#ready.length;
  }

  /** One occurrence at `now`; `make` builds the line only for a new one. A new line beyond
   *  maxPending is dropped (the caller counts it). */
  add(key: string, now: number, make: () => T): AddResult {
    const open = this.#open.get(key);
    if (open !== undefined && now < open.closesAt) {
      open.count++;
      return 'folded';
    }
    // Its window is over but the line not yet released: release it, and every older one
    // (first-seen order), before the key is reused.
    if (open !== undefined) {
      this.#ready.push(...this.#take(now));
      // Behind a younger window only when the clock went backwards: never overwrite it.
      if (this.#open.get(key) === open) {
        this.#open.delete(key);
        this.#ready.push({ value: open.value, count: open.count });
      }
    }
    if (this.#open.size >= this.#maxPending) return 'dropped';
    this.#open.set(key, { value: make(), count: 1, closesAt: now + this.#windowMs });
    return 'new';
  }

  /** When the oldest open window closes; undefined when nothing waits. */
  nextDue(): number | undefined {
    if (this.#ready.length > 0) return Number.NEGATIVE_INFINITY;
    for (const e of this.#open.values()) return e.closesAt;
    return undefined;
  }

  /** The lines whose window has closed by `now`, in first-seen order. */
  due(now: number): Folded<T>[] {
    const out = this.#ready;
    this.#ready = [];
    out.push(...this.#take(now));
    return out;
  }

  /** Every waiting line, windows closed or not (on stop). */
  flush(): Folded<T>[] {
    const out = this.#ready;
    this.#ready = [];
    for (const e of this.#open.values()) out.push({ value: e.value, count: e.count });
    this.#open.clear();
    return out;
  }

  #take(now: number): Folded<T>[] {
    const out: Folded<T>[] = [];
    for (const [key, e] of this.#open) {
      if (e.closesAt > now) break;
      this.#open.delete(key);
      out.push({ value: e.value, count: e.count });
    }
    return out;
  }
}
