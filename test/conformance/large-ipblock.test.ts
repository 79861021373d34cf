// Conformance with real packets for policies as large as the API server takes (about 1 MB):
// a namespace denying all ingress but from a huge ipBlock stays isolated on IPv4 and IPv6,
// later changes to any policy still apply, a policy over Weir's limits fails closed with its
// reason, and each agent's memory stays within its budget (read from /proc, printed).
// Every predicate is written by hand from docs/semantics (never derived from Weir's code), in
// explain-scenarios.ts with the policies.

import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { applyStep, LARGE_IPBLOCK_SCENARIOS, probeStep, type Step } from './explain-scenarios.ts';
import { Conformance } from './harness.ts';

/** Peak resident memory one agent may reach while it holds a 1 MB policy (docs/behaviour.md). */
const AGENT_RSS_BUDGET_MB = 512;
const MB = 1 << 20;
const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

interface AgentMemory {
  readonly node: string;
  readonly rssMb: number;
  readonly peakMb: number;
}

/** Each `weir agent` of this cluster, found by its manifests directory, with VmRSS and VmHWM. */
function agentMemory(dir: string): AgentMemory[] {
  const out: AgentMemory[] = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let argv: string[];
    let status: string;
    try {
      argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      if (!argv.includes('agent') || !argv.includes(dir)) continue;
      status = readFileSync(`/proc/${pid}/status`, 'utf8');
    } catch {
      continue; // gone meanwhile
    }
    const kb = (field: string) => Number(/^(\w+):\s+(\d+) kB$/m.exec(status.split('\n').find((l) => l.startsWith(`${field}:`)) ?? '')?.[2] ?? NaN);
    out.push({ node: argv[argv.indexOf('--node-name') + 1], rssMb: kb('VmRSS') / 1024, peakMb: kb('VmHWM') / 1024 });
  }
  return out.sort((a, b) => (a.node < b.node ? -1 : 1));
}

function checkMemory(c: Conformance, what: string): void {
  const mem = agentMemory(c.dir);
  if (mem.length !== 2) throw new Error(`found ${mem.length} agents of ${c.dir}, expected 2`);
  console.log(`agent memory ${what}: ${mem.map((m) => `${m.node} rss ${m.rssMb.toFixed(0)} MB, peak ${m.peakMb.toFixed(0)} MB`).join('; ')}`);
  for (const m of mem) {
    if (!(m.peakMb < AGENT_RSS_BUDGET_MB)) throw new Error(`agent on ${m.node} peaked at ${m.peakMb.toFixed(0)} MB, over its ${AGENT_RSS_BUDGET_MB} MB budget (${what})`);
  }
}

describe('conformance: policies as large as the API server takes', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wlib');
    checkMemory(c, 'at start');
  });
  after(async () => {
    await c?.stop();
  });

  // The policies and their tables live in explain-scenarios.ts; memory and weir render here.
  const [large, within, over] = LARGE_IPBLOCK_SCENARIOS;
  const play = async (step: Step) => {
    await applyStep(c, step);
    await probeStep(c, step);
  };
  const spec = (step: Step) => (step.policies![0] as { spec: { ingress: { from: { ipBlock: { except: string[] } }[] }[] } }).spec;

  test(large.name, async () => {
    await c.reset();
    const [huge, ...changes] = large.steps;
    console.log(`policy: ${spec(huge).ingress[0].from[0].ipBlock.except.length} excepts, ${(JSON.stringify(huge.policies![0]).length / 1024).toFixed(0)} KB`);
    await play(huge);
    checkMemory(c, 'with the 400 KB policy');
    // A small change to another policy still applies, and so does an edit of the huge one.
    for (const step of changes) await play(step);
  });

  test(within.name, async () => {
    await c.reset();
    const [policy, plus] = within.steps;
    const size = JSON.stringify(policy.policies![0]).length;
    console.log(`policy: ${spec(policy).ingress[0].from[0].ipBlock.except.length} excepts, ${(size / 1024).toFixed(0)} KB`);
    if (size < MB * 0.95) throw new Error(`the policy is only ${size} bytes`);
    await play(policy);
    checkMemory(c, 'with the 1 MB policy');
    await play(plus);
  });

  test(over.name, async () => {
    await c.reset();
    const [rejected, ...later] = over.steps;
    await play(rejected);
    checkMemory(c, 'with the rejected 1 MB policy');
    const render = spawnSync(process.execPath, [MAIN, 'render', '--node-name', 'node-a', '--manifests', c.dir], { encoding: 'utf8', maxBuffer: 64 * MB });
    if (!/alpha\/huge is invalid[\s\S]*spec\.ingress\[0\]\.from\[0\]\.ipBlock\.except\[\d+\]: the policy's ipBlocks hold more than \d+ prefixes/.test(render.stdout)) {
      throw new Error(`weir render does not give the reason:\n${render.stdout.slice(-2000)}\n${render.stderr.slice(-2000)}`);
    }
    for (const step of later) await play(step);
  });
});
