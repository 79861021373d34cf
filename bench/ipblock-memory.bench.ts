// node bench/ipblock-memory.bench.ts: what large policies cost one agent (ipBlocks, and the
// most rules a policy may compile to). Prints
// measured figures; asserts nothing. Each case runs in a fresh child process, so its memory
// figures are its own: compile (model + calc) and the agent's first write rendered by the real
// dataplane against a recorder (no kernel), as `weir render` does.
//   policy bytes, accepted or the first error, compile ms, sets, set members, rules,
//   payload bytes, heap used and RSS after, peak RSS of the whole process.
// WEIR_BENCH_CASES=v6-15k,v4-1mb runs only the named cases.

import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Calculator, makeNames } from '../src/calc/index.ts';
import { NODE_FLAGS } from '../src/cli/node-flags.ts';
import { createDataplane, recordingRunner } from '../src/dataplane/index.ts';
import { silentLogger } from '../src/log.ts';
import type { ModelEvent } from '../src/model/types.ts';

const NODE = 'node-a';
const MB = 1 << 20;
const mb = (bytes: number) => (bytes / MB).toFixed(1);

// ---- scattered addresses, deterministic -------------------------------------------------

function* v6Hosts(): Generator<string> {
  // Spread over the whole space (one per 2^112 block), so no two share a long prefix.
  for (let i = 1; ; i++) {
    const h = (i * 2654435761) >>> 0;
    yield `${(h >>> 16).toString(16)}:${(h & 0xffff).toString(16)}:${i.toString(16)}::${(i & 0xfff).toString(16)}/128`;
  }
}

function* v4Hosts(): Generator<string> {
  for (let i = 1; ; i++) {
    const h = (i * 2654435761) >>> 0;
    yield `${(h >>> 24) & 255 || 1}.${(h >>> 16) & 255}.${(h >>> 8) & 255}.${h & 255}/32`;
  }
}

function take(gen: Generator<string>, n: number): string[] {
  const out = new Set<string>();
  while (out.size < n) out.add(gen.next().value as string);
  return [...out];
}

/** Excepts from `gen` until the policy's JSON reaches `bytes`. */
function fill(build: (except: string[]) => unknown, gen: Generator<string>, bytes: number): unknown {
  const except: string[] = [];
  const size = () => JSON.stringify(build(except)).length;
  // Grow in steps, then trim: JSON.stringify of the whole spec each time would be quadratic.
  let step = 4096;
  while (step >= 1) {
    const chunk = take(gen, step);
    except.push(...chunk);
    if (size() > bytes) {
      except.length -= step;
      step >>= 2;
    }
  }
  return build(except);
}

// ---- cases ------------------------------------------------------------------------------

/** The shape: the namespace's pods get no ingress but from this block (so none over
 *  the other family), with the block carved by scattered host excepts. */
const denyAllBut = (cidr: string) => (except: string[]) => ({ podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: [{ ipBlock: { cidr, except } }] }] });

/** Plain blocks, one per host: an allow-list as people write it. */
const allowList = (cidrs: string[]) => ({ podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: cidrs.map((cidr) => ({ ipBlock: { cidr } })), ports: [{ port: 443 }] }] });

const CASES: Record<string, () => unknown> = {
  baseline: () => denyAllBut('::/0')(take(v6Hosts(), 10)),
  'v6-15k': () => denyAllBut('::/0')(take(v6Hosts(), 15_000)),
  'v6-1mb': () => fill(denyAllBut('::/0'), v6Hosts(), MB),
  'v4-1mb': () => fill(denyAllBut('0.0.0.0/0'), v4Hosts(), MB),
  'v4-allowlist-1mb': () => fill(allowList, v4Hosts(), MB),
  // The most rules a policy may compile to: 100 peers times 100 named ports (each its own rule).
  'rules-at-limit': () => ({
    podSelector: {},
    policyTypes: ['Ingress'],
    ingress: [
      {
        from: Array.from({ length: 100 }, (_, i) => ({ podSelector: { matchLabels: { app: `a${i}` } } })),
        ports: Array.from({ length: 100 }, (_, i) => ({ port: `p${i}` })),
      },
    ],
  }),
};

// ---- one case, in this process ----------------------------------------------------------

async function runCase(name: string): Promise<void> {
  const spec = CASES[name]();
  const bytes = JSON.stringify(spec).length;
  const events: ModelEvent[] = [
    { kind: 'Namespace', op: 'upsert', object: { name: 'big', labels: {} } },
    {
      kind: 'Pod',
      op: 'upsert',
      object: { uid: 'p1', namespace: 'big', name: 'p1', labels: {}, nodeName: NODE, hostNetwork: false, phase: 'Running', terminating: false, ips: ['10.244.1.5', 'fd00:10:244:1::5'], ports: [] },
    },
    { kind: 'NetworkPolicy', op: 'upsert', object: { namespace: 'big', name: 'huge', uid: 'u1', generation: 1, spec } },
  ];
  (globalThis as { gc?: () => void }).gc?.();
  const heap0 = process.memoryUsage().heapUsed;
  const names = makeNames('cali');
  const calc = new Calculator({ nodeName: NODE, names, families: [4, 6], marks: { accept: 0x10000, pass: 0x20000 } });
  let t0 = performance.now();
  const dirty = calc.applyEvents(events);
  const compileMs = performance.now() - t0;
  const report = calc.policyReports()[0];
  let members = 0;
  for (const s of calc.desired.sets.values()) members += s.members.size;
  const rules = ([4, 6] as const).reduce((n, f) => n + [...calc.desired.chains[f].values()].reduce((m, r) => m + r.length, 0), 0);

  const recorder = recordingRunner();
  const dataplane = createDataplane({ runner: recorder, names, families: [4, 6], backend: 'nft', log: silentLogger() });
  dataplane.markDirty(dirty);
  t0 = performance.now();
  await dataplane.resync(calc.desired);
  const renderMs = performance.now() - t0;
  const payload = recorder.calls.reduce((n, c) => n + (c.input?.length ?? 0), 0);
  (globalThis as { gc?: () => void }).gc?.();
  const heap = process.memoryUsage().heapUsed - heap0;
  const verdict = report.errors.length === 0 ? 'accepted' : `rejected (${report.errors.length} errors): ${report.errors[0].path}: ${report.errors[0].message}`;
  console.log(
    `${name.padEnd(18)} ${String(Math.round(bytes / 1024)).padStart(5)} KB  compile ${compileMs.toFixed(0).padStart(6)} ms  write ${renderMs.toFixed(0).padStart(6)} ms  ` +
      `sets ${String(calc.desired.sets.size).padStart(6)}  members ${String(members).padStart(8)}  rules ${String(rules).padStart(6)}  payload ${mb(payload).padStart(6)} MB  ` +
      `heap +${mb(heap).padStart(6)} MB  rss ${mb(process.memoryUsage().rss).padStart(6)} MB  peak rss ${mb(process.resourceUsage().maxRSS * 1024).padStart(6)} MB\n    ${verdict.slice(0, 240)}`,
  );
  // Keep everything alive until measured.
  void calc;
  void dataplane;
}

// ---- driver -----------------------------------------------------------------------------

const only = process.argv[2];
if (only !== undefined) {
  await runCase(only);
} else {
  const wanted = process.env.WEIR_BENCH_CASES?.split(',') ?? Object.keys(CASES);
  console.log('large ipBlock policies, one agent compiling and rendering its first write (fresh process each; --expose-gc)');
  for (const name of wanted) {
    const r = spawnSync(process.execPath, [...NODE_FLAGS, '--expose-gc', fileURLToPath(import.meta.url), name], { stdio: 'inherit', timeout: 600_000 });
    if (r.status !== 0) console.log(`${name.padEnd(18)} failed: exit ${r.status ?? r.signal}`);
  }
}
