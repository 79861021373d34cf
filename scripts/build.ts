// Builds the weir command as one bundled ES module: dist/cli/main.js (and the simulated pods'
// server beside it, which the demo runs as its own process). `node scripts/build.ts [OUTDIR]`.
//
// Why a bundle: loading @kubernetes/client-node module by module (its index pulls in some
// 3,000 generated files) took 0.5-1 s and 90 MB before the agent did anything. The bundle
// keeps only what Weir reaches and is read as one file. Type checking stays with tsc
// (`npm run typecheck`); esbuild only strips the types.

import { build } from 'esbuild';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = fileURLToPath(new URL('..', import.meta.url));
const outdir = resolve(process.argv[2] ?? `${repo}/dist`);

await build({
  absWorkingDir: repo,
  // src/sim/servers.ts starts the pod server from beside the file that imports it.
  entryPoints: { 'cli/main': 'src/cli/main.ts', 'cli/podserver': 'src/sim/podserver.ts' },
  outdir,
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node24',
  // Dependencies written as CommonJS call require() for Node's built-ins.
  banner: { js: "import { createRequire as weirCreateRequire } from 'node:module'; const require = weirCreateRequire(import.meta.url);" },
  // Without whitespace and comments the bundle is plain ASCII (some dependencies' comments are
  // not), so V8 holds its source as one byte per character: 2.9 MB instead of 8.5 MB of UTF-16,
  // and `weir --help` peaks at 91 MB instead of 109 MB. Names are kept, so stack traces still
  // name functions; their licence comments go to main.js.LEGAL.txt beside it.
  minifyWhitespace: true,
  legalComments: 'external',
  logLevel: 'warning',
});
