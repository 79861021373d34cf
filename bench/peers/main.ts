// npm run bench:peers: Weir and kube-router side by side, with no enforcer as the baseline, in
// the same simulated cluster against the same real kube-apiserver with the same objects. Prints
// one table (p50 / p99 and kube-router ÷ Weir for every figure); asserts nothing.
// docs/performance.md says what each figure means and how it was taken.
//
//   --only=connect,connect-cnp,latency,resources,faults,conformance   sections to run (default all)
//   --enforcers=none,kube-router,weir                      who takes turns (default all three)
//   --policies=1,100,1000     connect: policies selecting the policed pod
//   --cnps=0,1000             connect-cnp: Admin ClusterNetworkPolicies selecting it, beside one
//                             policy (Weir and none only: kube-router has no ClusterNetworkPolicy)
//   --connects=2000           connect, connect-cnp: sequential connects per latency figure
//   --rate-ms=3000            connect, connect-cnp: length of each new-connections-per-second run
//   --inflight=4              connect, connect-cnp: connects in flight during that run
//   --rounds=2                connect, connect-cnp: turns of each enforcer per policy count (alternating order; pooled)
//   --replay-rounds=8         connect: rounds of each enforcer's rules replayed in a fresh cluster
//                             with no agent running, next to a conntrack-only baseline (0: skip)
//   --replay-policies=1       connect: the policy counts whose rules are replayed
//   --pods=100,1000,10000     latency: cluster sizes; resources and faults run at the largest
//                             (from 5,000 pods, where kube-router's changes are slow: a third of --changes)
//   --changes=30              latency: changes of each kind per size
//   --churn-seconds=60        resources: length of the churn (100 pod changes/s)
//   --churn-rate=100          resources: pod changes per second
//   --conformance=FILES       conformance: test/conformance files (default the ones that run
//                             through an API server, see conformance.ts)
//   --weir-dist=DIR           run this build of Weir (e.g. dist) instead of building src/ afresh
//   --json=FILE               also write every row as JSON
//   --quick                   --policies=1,100 --connects=500 --rate-ms=1000 --rounds=1 --replay-rounds=2 --pods=100
//                             --changes=10 --churn-seconds=10

import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { benchConformance } from './conformance.ts';
import { benchConnect } from './connect.ts';
import { benchConnectCnp } from './connect-cnp.ts';
import { benchFaults } from './faults.ts';
import { benchLatency } from './latency.ts';
import { benchResources } from './resources.ts';
import { Ctx, type Flags } from './context.ts';
import { ENFORCERS, type EnforcerName, prepareEnforcers } from './enforcers.ts';
import { BenchEnv, machine } from './env.ts';
import { renderTable } from './table.ts';

const SECTIONS = ['connect', 'connect-cnp', 'latency', 'resources', 'faults', 'conformance'] as const;
type Section = (typeof SECTIONS)[number];

function parseFlags(argv: string[]): Flags {
  const { values } = parseArgs({
    args: argv,
    options: {
      only: { type: 'string' },
      enforcers: { type: 'string' },
      policies: { type: 'string' },
      cnps: { type: 'string' },
      connects: { type: 'string' },
      'rate-ms': { type: 'string' },
      inflight: { type: 'string' },
      rounds: { type: 'string' },
      'replay-rounds': { type: 'string' },
      'replay-policies': { type: 'string' },
      pods: { type: 'string' },
      changes: { type: 'string' },
      'churn-seconds': { type: 'string' },
      'churn-rate': { type: 'string' },
      conformance: { type: 'string' },
      'weir-dist': { type: 'string' },
      json: { type: 'string' },
      quick: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(`${readHeader()}\n`);
    process.exit(0);
  }
  const q = values.quick;
  const list = (v: string | undefined, dflt: string) => (v ?? dflt).split(',').filter(Boolean);
  const ints = (v: string | undefined, dflt: string) => list(v, dflt).map((x) => positive(x, 'list entry'));
  const counts = (v: string | undefined, dflt: string, what: string) =>
    list(v, dflt).map((x) => {
      const n = Number(x);
      if (!Number.isInteger(n) || n < 0) problems.push(`${what}: "${x}" is not a whole number`);
      return n;
    });
  const problems: string[] = [];
  const positive = (x: string, what: string) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n <= 0) problems.push(`${what}: "${x}" is not a positive integer`);
    return n;
  };
  const only = list(values.only, SECTIONS.join(','));
  for (const s of only) if (!SECTIONS.includes(s as Section)) problems.push(`--only: unknown section "${s}" (${SECTIONS.join(', ')})`);
  const enforcers = list(values.enforcers, ENFORCERS.join(','));
  for (const e of enforcers) if (!ENFORCERS.includes(e as EnforcerName)) problems.push(`--enforcers: unknown enforcer "${e}" (${ENFORCERS.join(', ')})`);
  const flags: Flags = {
    only: new Set(only),
    enforcers: ENFORCERS.filter((e) => enforcers.includes(e)),
    policies: ints(values.policies, q ? '1,100' : '1,100,1000'),
    cnps: counts(values.cnps, '0,1000', '--cnps'),
    connects: positive(values.connects ?? (q ? '500' : '2000'), '--connects'),
    rateMs: positive(values['rate-ms'] ?? (q ? '1000' : '3000'), '--rate-ms'),
    inflight: positive(values.inflight ?? '4', '--inflight'),
    rounds: positive(values.rounds ?? (q ? '1' : '2'), '--rounds'),
    replayRounds: values['replay-rounds'] === '0' ? 0 : positive(values['replay-rounds'] ?? (q ? '2' : '8'), '--replay-rounds'),
    replayPolicies: ints(values['replay-policies'], '1'),
    pods: ints(values.pods, q ? '100' : '100,1000,10000'),
    changes: positive(values.changes ?? (q ? '10' : '30'), '--changes'),
    churnSeconds: positive(values['churn-seconds'] ?? (q ? '10' : '60'), '--churn-seconds'),
    churnRate: positive(values['churn-rate'] ?? '100', '--churn-rate'),
    conformanceFiles: list(values.conformance, ''),
    weirDist: values['weir-dist'],
    json: values.json,
  };
  if (problems.length) {
    process.stderr.write(`bench:peers: ${problems.join('\n  ')}\n`);
    process.exit(2);
  }
  return flags;
}

function readHeader(): string {
  return 'npm run bench:peers -- [--only=connect,connect-cnp,latency,resources,faults,conformance] [--enforcers=none,kube-router,weir] [--policies=1,100,1000] [--cnps=0,1000] [--pods=100,1000] [--quick] ... (see bench/peers/main.ts)';
}

async function main(): Promise<void> {
  const flags = parseFlags(process.argv.slice(2));
  const log = (s: string) => process.stdout.write(`${s}\n`);
  log(`machine: ${machine()}`);
  log(`sections: ${[...flags.only].join(', ')}; enforcers: ${flags.enforcers.join(', ')}`);
  const specs = await prepareEnforcers({ weirDist: flags.weirDist, log });
  const env = await BenchEnv.start(log);
  const ctx = new Ctx(env, specs, flags);
  const started = performance.now();
  try {
    if (flags.only.has('connect')) {
      log('\n== 1. new-connection cost through a policed pod');
      await benchConnect(ctx);
    }
    if (flags.only.has('connect-cnp')) {
      log('\n== 1b. new-connection cost through a pod that Admin ClusterNetworkPolicies select');
      await benchConnectCnp(ctx);
    }
    if (flags.only.has('latency')) {
      log('\n== 2. API write -> enforced, seen with real packets');
      await benchLatency(ctx);
    }
    if (flags.only.has('resources')) {
      log(`\n== 3. memory and CPU, at rest and during churn (${flags.churnRate} pod changes/s for ${flags.churnSeconds} s)`);
      await benchResources(ctx);
    }
    if (flags.only.has('faults')) {
      log('\n== 4. faults');
      await benchFaults(ctx);
    }
    if (flags.only.has('conformance')) {
      log("\n== 5. Weir's conformance scenarios through the API server");
      await benchConformance(ctx);
    }
  } finally {
    await env.stop();
    const loads = ctx.loads;
    log(`\n== side by side (${((performance.now() - started) / 60_000).toFixed(1)} min)`);
    log(`machine: ${machine()}`);
    if (loads.length) {
      const max = Math.max(...loads);
      log(
        `1-minute load average before each measurement: ${Math.min(...loads).toFixed(2)}–${max.toFixed(2)}${max > 1 ? ' (the machine was loaded by other work: figures were taken under load)' : ''}`,
      );
    }
    log('ratios are kube-router ÷ Weir: for times, memory and CPU above 1 means Weir is better; for connections/s below 1 means Weir is better');
    log(renderTable(ctx.rows));
    for (const r of ctx.rows) if (r.note) log(`note (${r.section}, ${r.figure}): ${r.note}`);
    for (const n of ctx.notes) log(`note: ${n}`);
    if (flags.json) writeFileSync(flags.json, JSON.stringify({ machine: machine(), loads, rows: ctx.rows, notes: ctx.notes }, null, 1));
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
