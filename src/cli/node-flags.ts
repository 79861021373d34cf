// The V8 flags the agent's Node runs with (the image's entrypoint passes them; the benches too).
// A small young generation keeps the resident size of a large cluster's start-up burst down:
// at 100k pods / 20k policies (npm run bench) RSS after the cold start is about 295 MB with
// --max-semi-space-size=2 on the command line, against about 420 MB without. Set from inside
// the process (v8.setFlagsFromString) it changed nothing measurable: the heap is sized by then.
export const NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2'];
