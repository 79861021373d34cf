// The V8 flags the agent's Node runs with (the image's entrypoint passes them; the benches too).
// A small young generation keeps the resident size of a large cluster's start-up burst down:
// at 100k pods / 20k policies (npm run bench) RSS after the cold start is about 295 MB with
// --max-semi-space-size=2 on the command line, against about 420 MB without. Set from inside
// the process (v8.setFlagsFromString) it changed nothing measurable: the heap is sized by then.
// --expose-gc lets the agent ask for a full collection at the moments of a cold start where one
// pays (agent/reconciler.ts, collectGarbage): before the first compute, between its slices and
// after the first write. Peak RSS 278-282 MB instead of 301-304 with the first and the last;
// 252-257 MB with the slices too, 284-290 in two starts of sixteen (instead of 282-289, and
// 311-317 in some starts). The one after the first write compacts (agent/gc.ts): 199-205 MB
// at rest instead of 233-236. While lists arrive, one whenever the heap has grown by 64 MB.
export const NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2', '--expose-gc'];

/**
 * With --favour-memory, set once the agent's first full state is written: V8 then grows its
 * heap less and gives pages back sooner. At 100k pods (bench:agent, two runs) the agent rested
 * at 273 and 276 MB instead of 322-366, for 3-4 major GCs of 11-14 ms during 240 changes
 * (one-pod p99 49.4 and 59.8 ms against 35.8-49.6) and 1-2% more of a core at rest. On the
 * command line instead, one of two cold starts took 15.5 s instead of 8 (45 major GCs while
 * the lists were read). After the memory cuts of commits eaf3654-5c717ce (one run) it rested
 * at 223 MB against 261-268 by default, with no cost in p99 or CPU at rest in that run.
 * docs/performance.md has the figures.
 */
export const AFTER_START_V8_FLAGS = '--optimize-for-size';
