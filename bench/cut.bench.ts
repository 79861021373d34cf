// npm run bench:cut: the opt-in cut of established connections (agent/connection-cut.ts) at
// cluster scale. Prints measured figures; asserts nothing.
//   - judging: conntrack -L text parsed and every connection of the node's pods walked
//     through calc's chains, for the engine bench's synthetic cluster;
//   - the kernel: conntrack -L and a single-flow -D against a table of inserted entries, in a
//     network namespace this script creates (and always deletes).
// Size: WEIR_BENCH_SCALE=0.1 runs a tenth of the default 100k pods / 10k ns / 20k policies;
// WEIR_BENCH_FLOWS sets the tracked connections (default 20,000).

import { Calculator, makeNames } from '../src/calc/index.ts';
import { connectionKey, deleteConnections, listFlows, parseFlows } from '../src/dataplane/conntrack.ts';
import { netnsRunner, processRunner } from '../src/exec/runner.ts';
import { droppedByRulesOf } from '../src/explain/flow-judge.ts';
import type { CalcEvent } from '../src/model/types.ts';
import { createNs, deleteNs, uniquePrefix } from '../src/sim/netns.ts';
import { percentile } from './stats.ts';
import { initialEvents, makePod, NODE, type SyntheticSize } from './synthetic.ts';

const scale = Number(process.env.WEIR_BENCH_SCALE ?? 1);
const size: SyntheticSize = { pods: Math.round(100_000 * scale), namespaces: Math.round(10_000 * scale), policies: Math.round(20_000 * scale), localPods: 110 };
const FLOWS = Number(process.env.WEIR_BENCH_FLOWS ?? 20_000);
const KERNEL_FLOWS = Math.min(FLOWS, Number(process.env.WEIR_BENCH_KERNEL_FLOWS ?? 5_000));
const names = makeNames('cali');
const fmt = (x: number) => (x < 10 ? x.toFixed(3) : x.toFixed(1));

/** `conntrack -L` lines: connection i between local pod i mod L and remote pod i, TCP 8080,
 *  half of them started by the local pod. */
function conntrackText(local: readonly string[], remote: readonly string[], n: number): string {
  const lines: string[] = [];
  for (let i = 0; i < n; i++) {
    const l = local[i % local.length];
    const r = remote[i % remote.length];
    const [src, dst] = i % 2 === 0 ? [l, r] : [r, l];
    const sport = 30000 + (i % 30000);
    lines.push(`tcp      6 431999 ESTABLISHED src=${src} dst=${dst} sport=${sport} dport=8080 src=${dst} dst=${src} sport=8080 dport=${sport} [ASSURED] mark=0 use=1`);
  }
  return lines.join('\n');
}

async function main(): Promise<void> {
  console.log(`synthetic cluster: ${size.pods} pods, ${size.namespaces} namespaces, ${size.policies} policies, ~${size.localPods} pods on ${NODE}; ${FLOWS} tracked connections`);
  const calc = new Calculator({ nodeName: NODE, names, families: [4, 6], marks: { accept: 0x10000, pass: 0x20000 }, podBridge: 'cni0', allowAction: 'ACCEPT', sourceBinding: true });
  const events: CalcEvent[] = initialEvents(size);
  calc.applyEvents(events);
  const localV4 = calc.cutTargets(true).filter((ip) => !ip.includes(':'));
  calc.applyEvents(localV4.map((ip, i): CalcEvent => ({ kind: 'PodInterface', op: 'upsert', object: { ip, port: `veth${i}` } })));
  const remote: string[] = [];
  for (let i = 0; remote.length < 2_000 && i < size.pods; i++) {
    const p = makePod(i, size);
    if (p.nodeName !== NODE) remote.push(p.ips[0]);
  }
  const text = conntrackText(localV4, remote, FLOWS);

  const rounds: { parse: number; judge: number; denied: number; keys: number }[] = [];
  for (let round = 0; round < 6; round++) {
    let t0 = performance.now();
    const flows = parseFlows(text, 4);
    const parse = performance.now() - t0;
    t0 = performance.now();
    const targets = new Set(calc.cutTargets(true));
    const ctx = {
      desired: calc.desired,
      fromWorkloadDispatch: names.fromWorkloadDispatch,
      toWorkloadDispatch: names.toWorkloadDispatch,
      podBridge: 'cni0',
      isLocal: (ip: string) => targets.has(ip),
      portOf: (ip: string) => calc.bridgePortOf(ip),
    };
    let denied = 0;
    const keys = new Set<string>();
    for (const f of flows) {
      const p = connectionKey(f);
      if (!droppedByRulesOf(ctx, p, { source: targets.has(p.src), destination: targets.has(p.dst) })) continue;
      denied++;
      keys.add(`${p.src} ${p.dst} ${p.dport}`);
    }
    rounds.push({ parse, judge: performance.now() - t0, denied, keys: keys.size });
  }
  const steady = rounds.slice(1);
  const med = (xs: number[]) => percentile(xs, 50);
  console.log(`\njudging ${FLOWS} connections of ${localV4.length} local pods (median of ${steady.length} rounds after one warm-up):`);
  console.log(`  parse conntrack -L text: ${fmt(med(steady.map((r) => r.parse)))} ms`);
  console.log(
    `  walk each through calc's chains: ${fmt(med(steady.map((r) => r.judge)))} ms (${fmt((med(steady.map((r) => r.judge)) * 1000) / FLOWS)} us a connection; ${steady[0].denied} would be dropped, ${steady[0].keys} distinct keys to delete)`,
  );

  // The kernel: a table of inserted entries in a namespace of our own.
  const ns = `${uniquePrefix('wbcut')}node`;
  await createNs(ns);
  try {
    const runner = netnsRunner(ns, processRunner());
    let t0 = performance.now();
    for (let i = 0; i < KERNEL_FLOWS; i++) {
      const sport = String(20000 + (i % 40000));
      const src = `10.1.${(i >> 8) & 255}.${i & 255}`;
      const r = await runner.run('conntrack', ['-I', '-p', 'tcp', '-s', src, '-d', '10.2.0.1', '--sport', sport, '--dport', '8080', '--state', 'ESTABLISHED', '-t', '600', '-u', 'ASSURED']);
      if (r.exitCode !== 0) throw new Error(`conntrack -I: ${r.stderr}`);
    }
    console.log(`\nkernel, ${KERNEL_FLOWS} tracked connections in a namespace (inserted in ${fmt((performance.now() - t0) / 1000)} s):`);
    const lists: number[] = [];
    for (let i = 0; i < 5; i++) {
      t0 = performance.now();
      await listFlows(runner, 4);
      lists.push(performance.now() - t0);
    }
    console.log(`  conntrack -L, read and parsed: ${fmt(med(lists))} ms (median of ${lists.length})`);
    const listed = await listFlows(runner, 4);
    const deletes: number[] = [];
    for (const f of listed.slice(0, 200)) {
      t0 = performance.now();
      await deleteConnections(runner, connectionKey(f));
      deletes.push(performance.now() - t0);
    }
    console.log(`  conntrack -D of one key (a walk of the table): p50 ${fmt(percentile(deletes, 50))} ms, p99 ${fmt(percentile(deletes, 99))} ms (${deletes.length} deletions)`);
  } finally {
    await deleteNs(ns);
  }
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
