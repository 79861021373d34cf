// The one percentile of every bench: nearest rank, so a "p99" of 100 samples is the 99th
// smallest, not the largest (it is the largest only below 100 samples).

/** The nearest-rank p-th percentile (0 < p <= 100): the smallest sample with at least p% of
 *  the samples at or below it. NaN for no samples. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? Number.NaN;
}
