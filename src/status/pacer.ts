// The status writers run their passes through the one pacer Weir has (src/pacer.ts): poked,
// at most one pass at a time and one per interval, retried with backoff after a failure.

export { createPacer, type Pacer, type PacerOptions, type PassResult } from '../pacer.ts';
