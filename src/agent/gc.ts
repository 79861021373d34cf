// The agent's way to V8's collector, for the few moments of a cold start where a collection
// pays (agent/reconciler.ts, collectGarbage).

interface GcOptions {
  readonly type: 'major';
  readonly execution: 'sync';
  readonly flavor?: 'last-resort';
}

/**
 * V8's collector, exposed by --expose-gc (one of the image's Node flags, cli/node-flags.ts);
 * undefined without it. `compact` asks for the collection V8 runs on a low-memory
 * notification: old space compacted and its free pages given back to the system, which a
 * plain full collection leaves committed.
 */
export function v8Collector(): ((compact: boolean) => void) | undefined {
  const gc = (globalThis as { gc?: (options?: GcOptions) => void }).gc;
  if (gc === undefined) return undefined;
  return (compact) => gc({ type: 'major', execution: 'sync', ...(compact ? { flavor: 'last-resort' } : {}) });
}
