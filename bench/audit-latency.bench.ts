// node bench/audit-latency.bench.ts: how soon an audit line follows its packet. Two network
// namespaces (test/kernel/audit-netns.ts: the audit issue's NFLOG rule in the receiver), the
// audit pipeline in this process with its defaults (the one-second window on, the real tcpdump
// started as the agent starts it), and a sender in the other namespace. Prints, over every line,
// the time from the kernel's timestamp of the line's first packet to the line reaching the
// writer's output, p50/p99/max; asserts nothing. Root and tcpdump.
//   new flows     : WEIR_BENCH_FLOWS UDP flows (default 5,000), each its own line, paced at
//                   WEIR_BENCH_RATE a second (default 1,000, the agent's default --audit-rate)
//   a flow goes on: one unanswered UDP flow, a datagram every 50 ms for 3.5 s: its first line,
//                   then one folded line a second (whose delay is the window, by design)

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { type AuditLine, createAuditLog } from '../src/audit/index.ts';
import { silentLogger } from '../src/log.ts';
import { deleteAllNs, inNs, uniquePrefix } from '../src/sim/netns.ts';
import { BURST, createNflogPair } from '../test/kernel/audit-netns.ts';
import { log, machine, section, sourceState } from './report.ts';
import { percentile } from './stats.ts';

const FLOWS = Number(process.env.WEIR_BENCH_FLOWS ?? 5_000);
const RATE = Number(process.env.WEIR_BENCH_RATE ?? 1_000);
const GROUP = 79;

/** One UDP socket of a sending to one port of host every `everyMs` for `forMs`: one flow. */
const REPEAT = `
import dgram from 'node:dgram';
const [host, port, everyMs, forMs] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3]), Number(process.argv[4])];
const s = dgram.createSocket('udp4');
s.bind(39998, async () => {
  const end = Date.now() + forMs;
  while (Date.now() < end) {
    await new Promise((ok) => s.send('x', port, host, ok));
    await new Promise((ok) => setTimeout(ok, everyMs));
  }
  s.close();
});
`;

interface Arrival {
  readonly line: AuditLine;
  /** When the line reached the writer's output (ms since the epoch). */
  readonly at: number;
}

const summary = (xs: readonly number[]) =>
  xs.length === 0 ? 'no lines' : `p50 ${percentile(xs, 50).toFixed(0)} ms, p99 ${percentile(xs, 99).toFixed(0)} ms, max ${Math.max(...xs).toFixed(0)} ms (${xs.length} lines)`;

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('needs root (network namespaces)');
  log(`audit latency: ${machine({ iptables: true })}; ${sourceState('run')}`);
  const nsPrefix = uniquePrefix('wal');
  const dir = await mkdtemp(join(tmpdir(), 'weir-bench-audit-'));
  await deleteAllNs(nsPrefix);
  const pair = await createNflogPair(nsPrefix, GROUP);
  let arrivals: Arrival[] = [];
  let partial = '';
  const stdout = new Writable({
    write(chunk: Buffer, _enc, done) {
      const at = Date.now();
      const text = partial + chunk.toString();
      const lines = text.split('\n');
      partial = lines.pop() ?? '';
      for (const l of lines) if (l !== '') arrivals.push({ line: JSON.parse(l) as AuditLine, at });
      done();
    },
  });
  const registry = new Registry();
  const audit = createAuditLog({
    config: { node: 'node-b', nflogGroup: GROUP, rate: RATE, file: join(dir, 'audit.log'), maxSize: 64 << 20, maxFiles: 1, stdout: true, tcpdump: ['ip', 'netns', 'exec', pair.b, 'tcpdump'] },
    catalog: {
      lookup: (p) => (p === pair.prefix ? { verdict: 'deny', direction: 'ingress', policy: null, reason: 'default-deny', isolatedBy: [{ namespace: 'team-b', name: 'lockdown' }] } : undefined),
    },
    registry,
    log: silentLogger(),
    stdout,
  });
  const metric = async (name: string) => (await registry.getSingleMetric(name)!.get()).values.reduce((s, v) => s + v.value, 0);
  try {
    await audit.start();
    const deadline = Date.now() + 10_000;
    while ((await metric('weir_audit_reader_up')) !== 1) {
      if (Date.now() > deadline) throw new Error('the audit reader did not listen within 10 s');
      await new Promise((r) => setTimeout(r, 20));
    }
    const delay = (a: Arrival) => a.at - Date.parse(a.line.time);

    section(`new flows: ${FLOWS} UDP flows at ${RATE}/s, each its own line`);
    arrivals = [];
    const lost0 = await metric('weir_audit_lost_total');
    await inNs(pair.a, process.execPath, ['--input-type=module', '-e', BURST, pair.b4, String(FLOWS), '2000', String(RATE)]);
    const waitUntil = Date.now() + 10_000;
    while (arrivals.length + (await metric('weir_audit_lost_total')) - lost0 < FLOWS && Date.now() < waitUntil) await new Promise((r) => setTimeout(r, 50));
    log(`  packet -> line: ${summary(arrivals.map(delay))}; lost ${(await metric('weir_audit_lost_total')) - lost0}`);

    section('a flow goes on: one UDP flow, a datagram every 50 ms for 3.5 s');
    arrivals = [];
    await inNs(pair.a, process.execPath, ['--input-type=module', '-e', REPEAT, pair.b4, '7000', '50', '3500']);
    await new Promise((r) => setTimeout(r, 2_200)); // its last window closes, and the one after, empty
    const [first, ...folded] = arrivals;
    log(`  its first line (count ${first?.line.count}): ${first === undefined ? '-' : `${delay(first)} ms`} after its packet`);
    log(`  folded lines (count ${folded.map((a) => a.line.count).join(', ')}): ${summary(folded.map(delay))} after their first packet`);
    log(`  lines ${arrivals.length}, connections ${arrivals.reduce((s, a) => s + a.line.count, 0)}`);
  } finally {
    await audit.stop();
    await pair.delete();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
