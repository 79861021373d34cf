// The audit reader on the real kernel: two namespaces, the NFLOG rule of the audit issue in
// the receiver's INPUT (test/kernel/audit-netns.ts), and the reader running the real tcpdump
// inside that namespace. The events must be exactly the connections made; a burst prints what
// was delivered, what the kernel dropped and what each event cost; a killed tcpdump comes back.

import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { after, before, describe, type TestContext, test } from 'node:test';
import { execa } from 'execa';
import type { NflogEvent } from '../../src/audit/pcap.ts';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { type AuditLine, createAuditLog } from '../../src/audit/index.ts';
import { createTcpdumpReader, type ReaderState } from '../../src/audit/reader.ts';
import type { WeirError } from '../../src/errors.ts';
import { silentLogger } from '../../src/log.ts';
import { deleteAllNs, inNs, uniquePrefix } from '../../src/sim/netns.ts';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BURST, createNflogPair, type NflogPair } from './audit-netns.ts';
import { untilPasses } from '../support/eventually.ts';
import { procStat, running } from '../support/leftovers.ts';

/** The kernel and tcpdump take their time: 10 s, polled every 20 ms. */
const settles = (check: () => void | Promise<void>, timeoutMs = 10_000) => untilPasses(check, timeoutMs, 20);

const isRoot = process.getuid?.() === 0;
const hasTcpdump = (await execa('sh', ['-c', 'command -v tcpdump'], { reject: false })).exitCode === 0;
const skip = !isRoot ? 'needs root (network namespaces)' : !hasTcpdump ? 'needs tcpdump (scripts/setup.sh installs it)' : false;

const nsPrefix = uniquePrefix('wau');
const READER = new URL('../../src/audit/reader.ts', import.meta.url).href;
const LOG = new URL('../../src/log.ts', import.meta.url).href;
const GROUP = 77;
const NODE = process.execPath;

interface Flow {
  readonly protocol: 'TCP' | 'UDP';
  readonly host: string;
  readonly port: number;
  readonly localPort: number;
}

/** Makes each flow from namespace a, one after the other: a TCP connection that sends and
 *  closes, or one UDP datagram. One: conntrack calls every packet of a flow NEW until a reply
 *  comes, so an unanswered flow's every datagram matches --ctstate NEW (a TCP SYN's retransmits
 *  too); the rule logs each, and the audit pipeline's one-second deduplication folds them. */
const CONNECT = `
import net from 'node:net'; import dgram from 'node:dgram';
for (const f of JSON.parse(process.argv[1])) {
  if (f.protocol === 'TCP') await new Promise((ok, fail) => { const s = net.connect({ host: f.host, port: f.port, localPort: f.localPort }, () => s.end('hello')); s.on('close', ok); s.on('error', fail); });
  else await new Promise((ok) => { const s = dgram.createSocket(f.host.includes(':') ? 'udp6' : 'udp4'); s.bind(f.localPort, () => s.send('a', f.port, f.host, () => { s.close(); ok(); })); });
}
`;

/** A TCP listener on ports 8080 and 8081 of both families in namespace b. */
const LISTEN = `
import net from 'node:net';
for (const port of [8080, 8081]) net.createServer((s) => { s.on('error', () => {}); s.resume(); s.on('end', () => s.end()); }).listen({ port, host: '::' });
console.log('listening');
`;

const connect = (pair: NflogPair, flows: readonly Flow[]) => inNs(pair.a, NODE, ['--input-type=module', '-e', CONNECT, JSON.stringify(flows)]);

const key = (e: { protocol: string; srcIp: string; srcPort: number | null; dstIp: string; dstPort: number | null }) => `${e.protocol} ${e.srcIp}:${e.srcPort} > ${e.dstIp}:${e.dstPort}`;
const expectedKey = (pair: NflogPair, f: Flow) => key({ protocol: f.protocol, srcIp: f.host.includes(':') ? pair.a6 : pair.a4, srcPort: f.localPort, dstIp: f.host, dstPort: f.port });

/** Packets the NFLOG rule matched in b (both families): every new connection that reached INPUT. */
async function ruleCount(pair: NflogPair): Promise<number> {
  let total = 0;
  for (const cmd of ['iptables', 'ip6tables']) {
    const out = await inNs(pair.b, cmd, ['-L', 'INPUT', '-v', '-x', '-n']);
    const line = out.split('\n').find((l) => l.includes('NFLOG'));
    total += Number(line!.trim().split(/\s+/)[0]);
  }
  return total;
}

function startReader(t: TestContext, pair: NflogPair, command: readonly string[], bufferKiB?: number) {
  const events: NflogEvent[] = [];
  const states: ReaderState[] = [];
  const errors: WeirError[] = [];
  const reader = createTcpdumpReader(
    { group: pair.group, command: ['ip', 'netns', 'exec', pair.b, ...command], bufferKiB, restart: { initialMs: 50, maxMs: 1000 }, dropPollMs: 100, log: silentLogger() },
    {
      events: (batch) => events.push(...batch),
      state: (s, err) => {
        states.push(s);
        if (err) errors.push(err);
      },
    },
  );
  reader.start();
  t.after(() => reader.stop());
  return { reader, events, states, errors };
}

describe('the audit reader on the real kernel', { skip }, () => {
  let pair: NflogPair;
  let listener: ChildProcess;

  before(async () => {
    await deleteAllNs(nsPrefix);
    pair = await createNflogPair(nsPrefix, GROUP);
    listener = spawn('ip', ['netns', 'exec', pair.b, NODE, '--input-type=module', '-e', LISTEN], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((ok) => listener.stdout!.once('data', () => ok()));
  });
  after(async () => {
    if (listener?.pid !== undefined) listener.kill('SIGTERM');
    await deleteAllNs(nsPrefix);
  });

  test("TCP and UDP, IPv4 and IPv6: the events are exactly the connections made, ports included, with tcpdump holding only the chart's capabilities", async (t) => {
    // As the chart runs the agent: NET_ADMIN to listen on the group; SETUID and SETGID to start
    // tcpdump as its own user; no privilege escalation.
    const h = startReader(t, pair, ['setpriv', '--no-new-privs', '--bounding-set', '-all,+net_admin,+setuid,+setgid', 'tcpdump']);
    await settles(() => assert.equal(h.reader.state, 'running'));
    const flows: Flow[] = [
      { protocol: 'TCP', host: pair.b4, port: 8080, localPort: 41001 },
      { protocol: 'TCP', host: pair.b4, port: 8081, localPort: 41002 },
      { protocol: 'UDP', host: pair.b4, port: 5353, localPort: 41003 },
      { protocol: 'UDP', host: pair.b4, port: 5354, localPort: 41004 },
      { protocol: 'TCP', host: pair.b6, port: 8080, localPort: 41005 },
      { protocol: 'TCP', host: pair.b6, port: 8081, localPort: 41006 },
      { protocol: 'UDP', host: pair.b6, port: 5353, localPort: 41007 },
      { protocol: 'UDP', host: pair.b6, port: 5354, localPort: 41008 },
    ];
    const before = await ruleCount(pair);
    await connect(pair, flows);
    const expected = flows.map((f) => expectedKey(pair, f)).sort();
    await settles(() => assert.ok(h.events.length >= flows.length));
    await new Promise((r) => setTimeout(r, 300)); // nothing more may come
    assert.deepEqual(h.events.map(key).sort(), expected);
    assert.equal((await ruleCount(pair)) - before, flows.length);
    for (const e of h.events) {
      assert.equal(e.prefix, pair.prefix);
      assert.equal(e.family, e.dstIp.includes(':') ? 6 : 4);
      assert.ok(Math.abs(e.time - Date.now()) < 10_000);
    }
    assert.deepEqual(h.errors, []);
    await h.reader.stop();
    assert.equal(h.reader.state, 'stopped');
  });

  test('tcpdump runs as its own user with CAP_NET_ADMIN alone, and dies with the process that started the reader when that process is killed with SIGKILL', async (t) => {
    // Plays the agent: a reader on the real tcpdump in b, printing tcpdump's PID once it listens.
    const agent = `
      const { createTcpdumpReader } = await import(${JSON.stringify(READER)});
      const { silentLogger } = await import(${JSON.stringify(LOG)});
      const r = createTcpdumpReader({ group: ${pair.group}, command: ['ip', 'netns', 'exec', ${JSON.stringify(pair.b)}, 'tcpdump'], log: silentLogger() }, {
        events() {},
        state(s) { if (s === 'running') console.log(r.pid); },
      });
      r.start();
    `;
    const parent = spawn(NODE, ['--input-type=module', '-e', agent], { stdio: ['ignore', 'pipe', 'inherit'] });
    let pid = 0;
    t.after(() => {
      parent.kill('SIGKILL');
      if (pid > 0 && running(pid)) process.kill(pid, 'SIGKILL');
    });
    pid = Number(await new Promise<string>((resolve) => parent.stdout.once('data', (b: Buffer) => resolve(b.toString().trim()))));
    assert.equal(procStat(pid)?.ppid, parent.pid, "tcpdump's parent is not the reader's process");
    const status = await readFile(`/proc/${pid}/status`, 'utf8');
    const field = (name: string) => new RegExp(`^${name}:\\s+(.*)$`, 'm').exec(status)?.[1];
    assert.equal(field('Uid')?.split(/\s+/)[0], (await execa('id', ['-u', 'tcpdump'])).stdout.trim());
    assert.equal(BigInt(`0x${field('CapEff')}`), 1n << 12n, 'tcpdump holds more than CAP_NET_ADMIN');
    parent.kill('SIGKILL');
    await settles(() => assert.ok(!running(pid), `tcpdump ${pid} outlived the killed reader process`), 3000);
  });

  test('a tcpdump killed from outside is restarted, and the connections made after it listens again are all read', async (t) => {
    const h = startReader(t, pair, ['tcpdump']);
    await settles(() => assert.equal(h.reader.state, 'running'));
    const first = h.reader.pid!;
    process.kill(first, 'SIGKILL');
    await settles(() => assert.ok(h.reader.state === 'running' && h.reader.pid !== first));
    assert.equal(h.reader.stats().restarts, 1);
    assert.equal(h.errors[0].code, 'WEIR_AUDIT_READER');
    assert.match(h.errors[0].message, /killed by SIGKILL/);
    const flows: Flow[] = [
      { protocol: 'TCP', host: pair.b4, port: 8080, localPort: 42001 },
      { protocol: 'UDP', host: pair.b6, port: 5353, localPort: 42002 },
    ];
    await connect(pair, flows);
    await settles(() => assert.deepEqual(h.events.map(key).sort(), flows.map((f) => expectedKey(pair, f)).sort()));
    await h.reader.stop();
  });

  /** Sends n new UDP flows from a; returns what was sent, logged, read and dropped. */
  async function burst(t: TestContext, n: number, firstPort: number, bufferKiB?: number) {
    const h = startReader(t, pair, ['tcpdump'], bufferKiB);
    await settles(() => assert.equal(h.reader.state, 'running'));
    const pid = h.reader.pid!;
    const before = await ruleCount(pair);
    const cpu0 = process.cpuUsage();
    const ticks = async () => {
      const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      return Number(f[11]) + Number(f[12]); // utime + stime, in clock ticks (1/100 s)
    };
    const tcpdump0 = await ticks();
    const sent = JSON.parse(await inNs(pair.a, NODE, ['--input-type=module', '-e', BURST, pair.b4, String(n), String(firstPort)])) as { seconds: number; failed: number };
    const logged = (await ruleCount(pair)) - before;
    // Everything the rule logged is either read or (once the next poll of /proc has run) counted.
    await settles(() => assert.equal(h.events.length + h.reader.stats().queueDrops, logged), 20_000);
    const cpu = process.cpuUsage(cpu0);
    const tcpdumpMs = ((await ticks()) - tcpdump0) * 10;
    const delivered = h.events.length;
    const dropped = h.reader.stats().queueDrops;
    console.log(
      `audit burst (-B ${bufferKiB ?? 16384}): ${n} UDP flows sent in ${sent.seconds.toFixed(3)} s (${sent.failed} send errors), ${logged} logged by the rule, ` +
        `${delivered} delivered (${((100 * delivered) / logged).toFixed(2)} %), ${dropped} dropped by the kernel (queue); ` +
        `reader CPU ${((cpu.user + cpu.system) / delivered).toFixed(1)} µs/event in Node (parse + handler) + ${((tcpdumpMs * 1000) / delivered).toFixed(1)} µs/event in tcpdump`,
    );
    assert.ok(logged > n * 0.9, `the rule logged only ${logged} of ${n}`);
    assert.equal(new Set(h.events.map((e) => e.dstPort)).size, delivered, 'each flow is read once');
    assert.ok(h.events.every((e) => e.protocol === 'UDP' && e.srcPort === 39999 && e.dstPort! >= firstPort && e.dstPort! < firstPort + n));
    await h.reader.stop();
    return { logged, delivered, dropped };
  }

  test('a burst of 20,000 new UDP flows in about 0.3 s: every event the rule logged is read (printed: delivery, drops, CPU per event)', async (t) => {
    const r = await burst(t, 20_000, 10_000);
    assert.equal(r.dropped + r.delivered, r.logged);
  });

  test('with a socket buffer too small for the burst, the kernel drops events and the reader counts every one', async (t) => {
    const r = await burst(t, 20_000, 30_000, 1);
    assert.ok(r.dropped > 0, 'the kernel dropped nothing: the buffer was not small enough to prove the count');
    assert.equal(r.dropped + r.delivered, r.logged);
  });

  test('the whole pipeline, paced (2,000 flows at 1,000/s) and in a burst (20,000 in about 0.3 s): one line per flow, named by pod, written at once although the one-second window is on (printed: kernel-to-line latency p50/p99, CPU per event)', async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'weir-audit-kernel-'));
    t.after(() => rm(dir, { recursive: true, force: true }));
    // Lines as they reach standard output, stamped on arrival; parsed after the measurement.
    let chunks: { text: string; at: number }[] = [];
    const stdout = new Writable({
      write(chunk: Buffer, _enc, done) {
        chunks.push({ text: chunk.toString(), at: Date.now() });
        done();
      },
    });
    const arrived = () => chunks.reduce((s, c) => s + (c.text.split('\n').length - 1), 0);
    const registry = new Registry();
    const audit = createAuditLog({
      config: {
        node: 'node-b',
        nflogGroup: pair.group,
        rate: 10_000,
        file: join(dir, 'audit.log'),
        maxSize: 64 << 20,
        maxFiles: 1,
        stdout: true,
        tcpdump: ['ip', 'netns', 'exec', pair.b, 'tcpdump'],
      },
      catalog: { lookup: (p) => (p === pair.prefix ? { verdict: 'allow', direction: 'ingress', policy: { namespace: 'team-b', name: 'allow-all', rule: 0 } } : undefined) },
      registry,
      log: silentLogger(),
      stdout,
    });
    const pod = (namespace: string, name: string, ips: string[]) => ({
      kind: 'Pod' as const,
      op: 'upsert' as const,
      object: { uid: name, namespace, name, labels: {}, nodeName: 'node-b', hostNetwork: false, phase: 'Running', terminating: false, ips, ports: [] },
    });
    audit.applyModel([pod('team-a', 'client', [pair.a4, pair.a6]), pod('team-b', 'server', [pair.b4, pair.b6])]);
    await audit.start();
    t.after(() => audit.stop());
    const metricSum = async (name: string) => (await registry.getSingleMetric(name)!.get()).values.reduce((s, v) => s + v.value, 0);
    await settles(async () => assert.equal(await metricSum('weir_audit_reader_up'), 1));

    async function run(what: string, n: number, firstPort: number, perSecond: number) {
      chunks = [];
      const lost0 = await metricSum('weir_audit_lost_total');
      const before = await ruleCount(pair);
      const cpu0 = process.cpuUsage();
      await inNs(pair.a, NODE, ['--input-type=module', '-e', BURST, pair.b4, String(n), String(firstPort), String(perSecond)]);
      const logged = (await ruleCount(pair)) - before;
      await settles(async () => assert.equal(arrived() + (await metricSum('weir_audit_lost_total')) - lost0, logged), 20_000);
      const cpu = process.cpuUsage(cpu0);
      const arrivals = chunks.flatMap((c) =>
        c.text
          .split('\n')
          .filter((l) => l !== '')
          .map((l) => ({ line: JSON.parse(l) as AuditLine, at: c.at })),
      );
      const delays = arrivals.map((a) => a.at - Date.parse(a.line.time)).sort((x, y) => x - y);
      const pct = (q: number) => delays[Math.min(delays.length - 1, Math.floor(q * delays.length))];
      console.log(
        `audit pipeline, ${what}: ${logged} logged, ${arrivals.length} lines, ${(await metricSum('weir_audit_lost_total')) - lost0} lost; ` +
          `kernel-to-line p50 ${pct(0.5)} ms, p99 ${pct(0.99)} ms, max ${delays.at(-1)} ms (each flow's first line, written without waiting for its window); ` +
          `${((cpu.user + cpu.system) / arrivals.length).toFixed(1)} µs CPU per event in Node (read, parse, name, dedupe, JSON, file and stdout)`,
      );
      assert.equal(arrivals.length, logged, 'lines lost although the kernel delivered every event');
      // Far under the one-second window, which every line waited for before (a bound loose enough for a loaded machine).
      assert.ok(pct(0.5) < 500, `half the lines took ${pct(0.5)} ms or more: they waited for their window`);
      assert.equal(new Set(arrivals.map((a) => a.line.dst.port)).size, arrivals.length);
      assert.ok(arrivals.every((a) => a.line.dst.port! >= firstPort && a.line.dst.port! < firstPort + n));
      return arrivals;
    }

    await run('paced, 1,000 flows/s', 2_000, 2_000, 1_000);
    const arrivals = await run('burst', 20_000, 45_000, 0);
    const sample = arrivals[0].line;
    assert.deepEqual(
      { ...sample, time: '', dst: { ...sample.dst, port: 0 } },
      {
        version: 1,
        time: '',
        node: 'node-b',
        verdict: 'allow',
        direction: 'ingress',
        policy: { namespace: 'team-b', name: 'allow-all', rule: 0 },
        src: { ip: pair.a4, port: 39999, namespace: 'team-a', pod: 'client' },
        dst: { ip: pair.b4, port: 0, namespace: 'team-b', pod: 'server' },
        protocol: 'UDP',
        count: 1,
      },
    );
  });
});
