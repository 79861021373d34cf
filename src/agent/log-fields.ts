// Fields the loop and its side jobs put in their logs and metrics, worded alike.

/** An error's `code` (WeirError's, or a system error's), else UNKNOWN: the label of the errors
 *  counter and the code the probes report. */
export function codeOf(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : 'UNKNOWN';
}

/** Milliseconds to two decimals, for log lines. */
export function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
