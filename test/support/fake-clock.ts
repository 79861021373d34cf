// The one fake clock: Clock (src/clock.ts) whose timers run only when a test moves time on.

import type { Clock } from '../../src/clock.ts';

/** A clock whose timers run only when the test advances it. Starts at `start` (0 unless given). */
export class FakeClock implements Clock {
  t: number;
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private seq = 0;
  constructor(start = 0) {
    this.t = start;
  }
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.seq;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers = this.timers.filter((x) => x.id !== h);
  }
  pending(): number {
    return this.timers.length;
  }
  /** Whether a timer is due at exactly `at`. */
  hasTimerAt(at: number): boolean {
    return this.timers.some((x) => x.at === at);
  }
  /** Moves time forward, running the timers that fall due, in order. */
  advance(ms: number): void {
    const end = this.t + ms;
    for (let next = this.#due(end); next !== undefined; next = this.#due(end)) next.fn();
    this.t = end;
  }
  /** Like advance, but lets pending promise callbacks run before the first timer and after each,
   *  so that async work a timer started can schedule the next timer before time moves on. */
  async advanceAsync(ms: number): Promise<void> {
    const end = this.t + ms;
    await settle();
    for (let next = this.#due(end); next !== undefined; next = this.#due(end)) {
      next.fn();
      await settle();
    }
    this.t = end;
  }
  /** Takes the earliest timer due by `end` (ties in the order they were set), moving time to it. */
  #due(end: number): { fn: () => void } | undefined {
    this.timers.sort((a, b) => a.at - b.at || a.id - b.id);
    const next = this.timers[0];
    if (next === undefined || next.at > end) return undefined;
    this.timers.shift();
    this.t = Math.max(this.t, next.at);
    return next;
  }
}

/** One turn of the event loop: every pending promise callback runs first. */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));
