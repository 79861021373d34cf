// npm run bench:cut: the opt-in cut of established connections (agent/connection-cut.ts) at
// cluster scale. Prints measured figures; asserts nothing.
//   - judging: conntrack -L text parsed and every connection of the node's pods walked
//     through calc's chains, for the engine bench's synthetic cluster;
//   - the kernel: conntrack -L and a keyed -D against a table of tracked connections, in a
//     network namespace this script creates (and always deletes).
// Size: WEIR_BENCH_SCALE=0.1 runs a tenth of the default 100k pods / 10k ns / 20k policies;
// WEIR_BENCH_FLOWS sets the connections judged (default 20,000), WEIR_BENCH_KERNEL_FLOWS those in
// the kernel's table (default 100,000).

import { Calculator, makeNames } from '../src/calc/index.ts';
import { deletionFilters } from '../src/agent/cut-filters.ts';
import { connectionKey, deleteConnections, listFlows, parseFlows } from '../src/dataplane/conntrack.ts';
import { netnsRunner, processRunner } from '../src/exec/runner.ts';
import { judgeByCalc } from '../src/explain/flow-judge.ts';
import type { CalcEvent } from '../src/model/types.ts';
import { createNs, deleteNs, inNs, uniquePrefix } from '../src/sim/netns.ts';
import { percentile } from './stats.ts';
import { initialEvents, makePod, NODE, type SyntheticSize } from './synthetic.ts';

const scale = Number(process.env.WEIR_BENCH_SCALE ?? 1);
const size: SyntheticSize = { pods: Math.round(100_000 * scale), namespaces: Math.round(10_000 * scale), policies: Math.round(20_000 * scale), localPods: 110 };
const FLOWS = Number(process.env.WEIR_BENCH_FLOWS ?? 20_000);
const KERNEL_FLOWS = Number(process.env.WEIR_BENCH_KERNEL_FLOWS ?? 100_000);
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

/** Sends argv[1] UDP datagrams from 127.0.0.1, each to its own address and port of 127/8. */
const DATAGRAMS = `
import dgram from 'node:dgram';
const n = Number(process.argv[1]);
const s = dgram.createSocket('udp4');
await new Promise((r) => s.bind(0, '127.0.0.1', r));
for (let i = 0; i < n; i++) {
  const dst = '127.' + (1 + (i >> 16)) + '.' + ((i >> 8) & 255) + '.' + (i & 255);
  await new Promise((r) => s.send('x', 9000 + (i % 1000), dst, r));
}
s.close();`;

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

  const rounds: { parse: number; judge: number; group: number; denied: number; filters: number }[] = [];
  for (let round = 0; round < 6; round++) {
    let t0 = performance.now();
    const flows = parseFlows(text, 4);
    const parse = performance.now() - t0;
    t0 = performance.now();
    const targets = new Set(calc.cutTargets(true));
    const dropped = judgeByCalc(calc, names, 'cni0');
    const listing = flows.map((f) => {
      const key = connectionKey(f);
      return { key, denied: dropped(key, { source: targets.has(key.src), destination: targets.has(key.dst) }) };
    });
    const judge = performance.now() - t0;
    t0 = performance.now();
    const filters = deletionFilters(listing).length;
    rounds.push({ parse, judge, group: performance.now() - t0, denied: listing.filter((c) => c.denied).length, filters });
  }
  const steady = rounds.slice(1);
  const med = (xs: number[]) => percentile(xs, 50);
  console.log(`\njudging ${FLOWS} connections of ${localV4.length} local pods (median of ${steady.length} rounds after one warm-up):`);
  console.log(`  parse conntrack -L text: ${fmt(med(steady.map((r) => r.parse)))} ms`);
  console.log(
    `  walk each through calc's chains: ${fmt(med(steady.map((r) => r.judge)))} ms (${fmt((med(steady.map((r) => r.judge)) * 1000) / FLOWS)} us a connection; ${steady[0].denied} would be dropped)`,
  );
  console.log(`  group them into deletions: ${fmt(med(steady.map((r) => r.group)))} ms, ${steady[0].filters} deletions (each a walk of the table)`);

  // The kernel: a table of tracked connections in a namespace of our own, made by sending one
  // UDP datagram each over loopback (each entry stays 30 s).
  const ns = `${uniquePrefix('wbcut')}node`;
  await createNs(ns);
  try {
    const runner = netnsRunner(ns, processRunner());
    // Conntrack hooks a namespace only once a rule there asks for it.
    await inNs(ns, 'iptables', ['-A', 'OUTPUT', '-m', 'conntrack', '--ctstate', 'NEW', '-j', 'ACCEPT']);
    let t0 = performance.now();
    await inNs(ns, process.execPath, ['--input-type=module', '-e', DATAGRAMS, String(KERNEL_FLOWS)]);
    console.log(`\nkernel, ${(await listFlows(runner, 4)).length} tracked connections in a namespace (made in ${fmt((performance.now() - t0) / 1000)} s):`);
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
    console.log(`  conntrack -D of one connection's key (a walk of the table): p50 ${fmt(percentile(deletes, 50))} ms, p99 ${fmt(percentile(deletes, 99))} ms (${deletes.length} deletions)`);
  } finally {
    await deleteNs(ns);
  }
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
