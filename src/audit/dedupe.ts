// Identical audit lines (same verdict, policy, rule, source IP, destination IP and port,
// protocol): the first is written at once, and those of the next window (1 s) fold into one
// line with a count, released when the window closes. Pure: the caller passes the time.

import type { AuditTag } from '../calc/audit-tags.ts';
import type { NflogEvent } from './pcap.ts';

/** What makes two events one line: everything written but the time, the source port and the
 *  pod names (which follow from the addresses). Direction and the isolating policies are
 *  part of the verdict's meaning, so they are in it too. */
export function dedupeKey(tag: AuditTag, e: NflogEvent): string {
  const p = tag.policy;
  // JSON for the parts a name could make ambiguous; the rest are numbers, IPs and fixed words.
  const policy =
    p === null
      ? `-${tag.reason ?? ''}${tag.isolatedBy ? JSON.stringify(tag.isolatedBy.map((r) => [r.namespace, r.name])) : ''}`
      : JSON.stringify('kind' in p ? [p.kind, p.name, p.tier, p.rule] : [p.namespace, p.name, p.rule]);
  return `${tag.verdict} ${tag.direction} ${policy} ${e.protocol} ${e.srcIp} ${e.dstIp} ${e.dstPort}`;
}

export interface Folded<T> {
  /** What the first occurrence folded into this line made. */
  readonly value: T;
  readonly count: number;
}

/** new: the first of its key with no window open; the caller writes it at once, and a window
 *  opens. folded: counted into the open window's line. dropped: too many windows open.
 *  refused: a first occurrence the caller's `admit` refused; no window opens. */
export type AddResult = 'new' | 'folded' | 'dropped' | 'refused';

interface Window<T> {
  /** Built from the first occurrence folded in; undefined while none was. */
  value: T | undefined;
  count: number;
  closesAt: number;
}

/** A key's first occurrence is written at once (the caller does it) and opens a window of
 *  windowMs: the occurrences within it fold into one line, released when it closes. A window
 *  that held some opens the next at once, so a flow that goes on makes one line a window; a
 *  window that held none ends, and the key's next occurrence is written at once again. */
export class Deduper<T> {
  readonly #windowMs: number;
  readonly #maxPending: number;
  /** Insertion order is the order of closing (a window opens `windowMs` after the time of the
   *  call that opens it, never before an older one closes), so windows close from the front. */
  readonly #open = new Map<string, Window<T>>();
  /** Lines whose window closed, taken out by add, released first by due(). */
  #ready: Folded<T>[] = [];

  constructor(opts: { windowMs?: number; maxPending?: number } = {}) {
    this.#windowMs = opts.windowMs ?? 1000;
    this.#maxPending = opts.maxPending ?? 100_000;
  }

  /** Windows open and lines not yet released. */
  get size(): number {
    return this.#open.size + this.#ready.length;
  }

  /** One occurrence at `now`; `make` builds the line of a window from its first occurrence.
   *  A new key beyond maxPending open windows is dropped (the caller counts it). `admit` is
   *  asked only for a first occurrence that would open a window: refused, none opens, so the
   *  key's next occurrence is a first one again. */
  add(key: string, now: number, make: () => T, admit?: () => boolean): AddResult {
    this.#close(now);
    const open = this.#open.get(key);
    if (open !== undefined) {
      if (open.count === 0) open.value = make();
      open.count++;
      return 'folded';
    }
    if (this.#open.size >= this.#maxPending) return 'dropped';
    if (admit !== undefined && !admit()) return 'refused';
    this.#open.set(key, { value: undefined, count: 0, closesAt: now + this.#windowMs });
    return 'new';
  }

  /** When the oldest open window closes; undefined when none is open. */
  nextDue(): number | undefined {
    if (this.#ready.length > 0) return Number.NEGATIVE_INFINITY;
    for (const w of this.#open.values()) return w.closesAt;
    return undefined;
  }

  /** The lines of the windows closed by `now`, in the order they closed. */
  due(now: number): Folded<T>[] {
    this.#close(now);
    const out = this.#ready;
    this.#ready = [];
    return out;
  }

  /** Every waiting line, windows closed or not (on stop). */
  flush(): Folded<T>[] {
    const out = this.#ready;
    this.#ready = [];
    for (const w of this.#open.values()) if (w.value !== undefined) out.push({ value: w.value, count: w.count });
    this.#open.clear();
    return out;
  }

  /** Closes the windows whose end has come by `now`: a window that folded some releases its
   *  line and opens the next from `now` (at the back, keeping the order); an empty one ends. */
  #close(now: number): void {
    const again: string[] = [];
    for (const [key, w] of this.#open) {
      if (w.closesAt > now) break;
      this.#open.delete(key);
      if (w.value === undefined) continue;
      this.#ready.push({ value: w.value, count: w.count });
      again.push(key);
    }
    for (const key of again) this.#open.set(key, { value: undefined, count: 0, closesAt: now + this.#windowMs });
  }
}
