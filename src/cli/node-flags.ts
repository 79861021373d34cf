// The V8 flags the agent's Node runs with (the image's entrypoint passes them; the benches too).
// A small young generation keeps the resident size of a large cluster's start-up burst down:
// at 100k pods / 20k policies (npm run bench) RSS after the cold start is about 295 MB with
// --max-semi-space-size=2 on the command line, against about 420 MB without. Set from inside
// the process (v8.setFlagsFromString) it changed nothing measurable: the heap is sized by then.
export const NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2'];

/**
 * Set once the agent's first full state is written: V8 then grows its heap less and gives
 * pages back sooner. From the start (on the command line) it held the agent of bench:agent
 * (100k pods) at 270 MB at rest instead of 322-366, but one of two cold starts took 15.5 s
 * instead of 8 (45 major GCs while the lists were read). Set after the start, the burst runs
 * as before and the rest is smaller (docs/performance.md).
 */
export const AFTER_START_V8_FLAGS = '--optimize-for-size';
