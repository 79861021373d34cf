// The V8 flags the agent's Node runs with (the image's entrypoint passes them; the benches too).
// A small young generation keeps the resident size of a large cluster's start-up burst down; it
// must be given on the command line, since set from inside the process the heap is sized by
// then. --expose-gc lets the agent ask for a full collection at the moments of a cold start
// where one pays (agent/first-compute-collections.ts, agent/gc.ts): before the first compute,
// between its slices, after the first write (compacting), and while lists arrive whenever the
// heap has grown past a bound. The figures are in docs/design/agent.md, "Figures behind the
// choices".
export const NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2', '--expose-gc'];

/**
 * With --favour-memory, set once the agent's first full state is written: V8 then grows its
 * heap less and gives pages back sooner, for less memory at rest on a very large cluster, at
 * the cost of more major GCs during changes and a little more CPU at rest. Set after the start,
 * not on the command line, because there it slows the cold start's lists down (docs/design/agent.md,
 * "Figures behind the choices").
 */
export const AFTER_START_V8_FLAGS = '--optimize-for-size';
