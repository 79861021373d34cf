// The agent's way to V8's collector, for the few moments of a cold start where a collection
// pays (agent/first-compute-collections.ts; the kube source's lists).

import v8 from 'node:v8';

interface GcOptions {
  readonly type: 'major';
  readonly execution: 'sync';
  readonly flavor?: 'last-resort';
}

const FULL: GcOptions = { type: 'major', execution: 'sync' };

/**
 * V8's collector, exposed by --expose-gc (one of the image's Node flags, cli/node-flags.ts);
 * undefined without it. `compact` asks for the collection V8 runs on a low-memory
 * notification: old space compacted and its free pages given back to the system, which a
 * plain full collection leaves committed. That one also leaves V8 a low limit for the heap's
 * next growth, which the changes right after it would pay for in full collections of their
 * own; a plain collection after it sets V8's usual limit again, keeping the pages given back
 * (docs/design/agent.md, "Figures behind the choices").
 */
export function v8Collector(): ((compact: boolean) => void) | undefined {
  const gc = (globalThis as { gc?: (options?: GcOptions) => void }).gc;
  if (gc === undefined) return undefined;
  return (compact) => {
    if (compact) gc({ ...FULL, flavor: 'last-resort' });
    gc(FULL);
  };
}

export interface ListHeapGuardOptions {
  /** Objects between two looks at the heap. */
  readonly every: number;
  /** Growth of V8's heap in use, since the lowest seen, that gets a full collection. */
  readonly growthBytes: number;
  /** V8's heap in use, in bytes. */
  readonly heapUsed: () => number;
  /** Told of each collection the guard ran: V8's heap in use before and after it, its ms. */
  readonly onCollect?: (beforeBytes: number, afterBytes: number, ms: number) => void;
}

/** A large cluster's first lists leave more than `growthBytes` live, and V8 normally collects
 *  on its own on the way (docs/design/agent.md, "Figures behind the choices"). */
const LIST_HEAP_GUARD: ListHeapGuardOptions = {
  every: 2_000,
  growthBytes: 64 * 2 ** 20,
  heapUsed: () => v8.getHeapStatistics().used_heap_size,
};

/**
 * Made as each list starts; what it returns is called after each object the list takes in:
 * every `every` objects, a full collection when V8's heap in use has grown by `growthBytes`
 * since the lowest this list saw it at (what V8's own collections bring it down to). Each list
 * starts afresh, so a relist at rest is measured from the heap it found, not from an empty
 * one. V8's own heuristics sometimes let its pages grow far past what the lists hold, for a
 * much higher peak (docs/design/agent.md, "Figures behind the choices").
 */
export function listHeapGuard(collect: (compact: boolean) => void, options: Partial<ListHeapGuardOptions> = {}): () => () => void {
  const opts = { ...LIST_HEAP_GUARD, ...options };
  return () => {
    let seen = 0;
    let low = Number.POSITIVE_INFINITY;
    return () => {
      if (++seen % opts.every !== 0) return;
      const used = opts.heapUsed();
      if (used < low) low = used;
      else if (used - low > opts.growthBytes) {
        const t0 = performance.now();
        collect(false);
        low = opts.heapUsed();
        opts.onCollect?.(used, low, performance.now() - t0);
      }
    };
  };
}
