// Time for the status side channel. Wall-clock, unlike the reconciler's monotonic clock:
// every timestamp written here is read by people and by other nodes' agents.

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  // Unref'd: a pending status write must never keep the process alive on shutdown.
  setTimeout: (fn, ms) => setTimeout(fn, ms).unref(),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};
