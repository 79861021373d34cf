// The one clock seam: timers and "now" for whoever paces work (the reconcile loop, the status
// writers, the audit pipeline), so tests can drive time by hand.

export interface Clock {
  /** Milliseconds: since the epoch (systemClock) or since start (monotonicClock). */
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  // Unref'd: a pending timer must never keep the process alive on shutdown.
  setTimeout: (fn, ms) => setTimeout(fn, ms).unref(),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** Monotonic time for the reconcile loop, whose intervals must not jump with the wall clock;
 *  its timers are ref'd, as they were when the loop kept its own clock. */
export const monotonicClock: Clock = {
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};
