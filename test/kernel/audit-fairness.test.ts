// The audit rules' rate limit on the real kernel: the rule calc builds (auditLimit) as render
// writes it, in the INPUT chain of a receiving namespace, read by the real tcpdump. One noisy
// source floods new connections, a quiet one beside it in the same subnet opens a few: every
// connection of the quiet one is logged, the noisy one's are cut to its own bucket; and the
// per-source table, fed only by what the node's bucket lets through, never fills, so the limit
// never drops a packet an allowing rule was about to accept.

import assert from 'node:assert/strict';
import { after, before, describe, type TestContext, test } from 'node:test';
import { execa } from 'execa';
import type { NflogEvent } from '../../src/audit/pcap.ts';
import { createTcpdumpReader } from '../../src/audit/reader.ts';
import { type AuditConfig, auditLimit } from '../../src/calc/config.ts';
import type { Rule } from '../../src/calc/desired.ts';
import { renderRuleBodies } from '../../src/dataplane/render.ts';
import { silentLogger } from '../../src/log.ts';
import { createNs, deleteAllNs, inNs, uniquePrefix } from '../../src/sim/netns.ts';
import { untilPasses } from '../support/eventually.ts';

const isRoot = process.getuid?.() === 0;
const hasTcpdump = (await execa('sh', ['-c', 'command -v tcpdump'], { reject: false })).exitCode === 0;
const skip = !isRoot ? 'needs root (network namespaces)' : !hasTcpdump ? 'needs tcpdump (scripts/setup.sh installs it)' : false;

const nsPrefix = uniquePrefix('waf');
const A = `${nsPrefix}a`;
const B = `${nsPrefix}b`;
const GROUP = 78;
const PREFIX = 'weir:DI:fairness';
const NODE = process.execPath;
/** The receiver, and the two senders of each family: all in one subnet, so that only the whole
 *  address tells them apart (a /64 mask in IPv6 would put both in one bucket). */
const ADDR = { b4: '10.97.0.2', noisy4: '10.97.0.1', quiet4: '10.97.0.3', b6: 'fd97::2', noisy6: 'fd97::1', quiet6: 'fd97::3' };

/** n UDP datagrams from `src` to distinct ports of `dst` (a new connection each), a batch every
 *  10 ms at `perSecond`; prints how long it took. */
const SEND = `
import dgram from 'node:dgram';
const [src, dst, n, first, perSecond] = [process.argv[1], process.argv[2], Number(process.argv[3]), Number(process.argv[4]), Number(process.argv[5])];
const s = dgram.createSocket(dst.includes(':') ? 'udp6' : 'udp4');
const batch = Math.max(1, Math.round(perSecond / 100));
s.bind({ address: src }, async () => {
  const t = performance.now();
  for (let i = 0; i < n; i += batch) {
    await new Promise((ok) => setTimeout(ok, Math.max(0, t + (i / batch) * 10 - performance.now())));
    await Promise.all(Array.from({ length: Math.min(batch, n - i) }, (_, j) => new Promise((ok) => s.send('x', first + i + j, dst, ok))));
  }
  console.log((performance.now() - t) / 1000);
  s.close();
});
`;

async function send(src: string, dst: string, n: number, firstPort: number, perSecond: number): Promise<number> {
  return Number(await inNs(A, NODE, ['--input-type=module', '-e', SEND, src, dst, String(n), String(firstPort), String(perSecond)]));
}

/** The audit rule of a default drop, with the limit calc builds from `audit`, in B's INPUT
 *  (both families), after whatever is there. */
async function writeAuditRule(audit: AuditConfig, then: 'none' | 'accept'): Promise<void> {
  const rule: Rule = { matches: [{ kind: 'ctstate', states: ['NEW'] }, auditLimit('waf', audit)], action: { kind: 'nflog', group: GROUP, prefix: PREFIX, size: 128 } };
  const [body] = renderRuleBodies(rule);
  const payload = `*filter\n-F INPUT\n-A INPUT -p udp ${body}\n${then === 'accept' ? '-A INPUT -p udp -j ACCEPT\n' : ''}COMMIT\n`;
  await inNs(B, 'iptables-restore', ['--noflush'], payload);
  await inNs(B, 'ip6tables-restore', ['--noflush'], payload);
}

/** Reads the NFLOG group in B with the real tcpdump until the test ends. */
async function readEvents(t: TestContext): Promise<NflogEvent[]> {
  const events: NflogEvent[] = [];
  const reader = createTcpdumpReader({ group: GROUP, command: ['ip', 'netns', 'exec', B, 'tcpdump'], log: silentLogger() }, { events: (batch) => events.push(...batch) });
  reader.start();
  t.after(() => reader.stop());
  await untilPasses(() => assert.equal(reader.state, 'running'), 10_000, 20);
  return events;
}

/** Waits until no event has come for 500 ms. */
async function quiet(events: readonly NflogEvent[]): Promise<void> {
  let last = -1;
  while (last !== events.length) {
    last = events.length;
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Datagrams B's UDP layer received (the ACCEPT rule's packets, answered by port unreachable). */
async function udpReceived(): Promise<number> {
  const snmp = await inNs(B, 'cat', ['/proc/net/snmp']);
  const [head, values] = snmp.split('\n').filter((l) => l.startsWith('Udp:'));
  const i = head.split(/\s+/).indexOf('NoPorts');
  return Number(values.split(/\s+/)[i]);
}

describe('the audit rate limit on the real kernel', { skip }, () => {
  before(async () => {
    await deleteAllNs(nsPrefix);
    await createNs(A);
    await createNs(B);
    const a = (args: string[]) => inNs(A, 'ip', args);
    await a(['link', 'add', 'va', 'type', 'veth', 'peer', 'name', 'vb']);
    await a(['link', 'set', 'vb', 'netns', B]);
    for (const ip of [ADDR.noisy4, ADDR.quiet4]) await a(['addr', 'add', `${ip}/16`, 'dev', 'va']);
    for (const ip of [ADDR.noisy6, ADDR.quiet6]) await a(['addr', 'add', `${ip}/64`, 'dev', 'va', 'nodad']);
    await inNs(B, 'ip', ['addr', 'add', `${ADDR.b4}/16`, 'dev', 'vb']);
    await inNs(B, 'ip', ['addr', 'add', `${ADDR.b6}/64`, 'dev', 'vb', 'nodad']);
    await a(['link', 'set', 'va', 'up']);
    await inNs(B, 'ip', ['link', 'set', 'vb', 'up']);
  });
  after(() => deleteAllNs(nsPrefix));

  test('one source floods new connections, another beside it opens a few: every one of the quiet source is logged, the noisy one is cut to its own bucket (IPv4 and IPv6)', async (t) => {
    // The node's bucket far above the flood, so that only the per-source buckets cut it.
    const perSource = { perSecond: 20, burst: 40 };
    await writeAuditRule({ group: GROUP, defaultLevel: 'deny', perSecond: 20_000, burst: 40_000, perSource }, 'none');
    const events = await readEvents(t);
    const [noisy4, noisy6] = [1500, 1500];
    const [seconds] = await Promise.all([
      Promise.all([send(ADDR.noisy4, ADDR.b4, noisy4, 20_000, 1000), send(ADDR.noisy6, ADDR.b6, noisy6, 20_000, 1000)]).then((s) => Math.max(...s)),
      send(ADDR.quiet4, ADDR.b4, 10, 30_000, 10),
      send(ADDR.quiet6, ADDR.b6, 10, 30_000, 10),
    ]);
    await quiet(events);
    const from = (ip: string) => events.filter((e) => e.srcIp === ip).length;
    const most = Math.ceil(perSource.burst + perSource.perSecond * (seconds + 0.5));
    console.log(
      `audit fairness: in ${seconds.toFixed(2)} s, noisy sources logged ${from(ADDR.noisy4)} of ${noisy4} (IPv4) and ${from(ADDR.noisy6)} of ${noisy6} (IPv6), quiet ones ${from(ADDR.quiet4)} and ${from(ADDR.quiet6)} of 10`,
    );
    assert.equal(from(ADDR.quiet4), 10, 'a connection of the quiet IPv4 source went unlogged');
    assert.equal(from(ADDR.quiet6), 10, 'a connection of the quiet IPv6 source went unlogged');
    for (const ip of [ADDR.noisy4, ADDR.noisy6]) {
      assert.ok(from(ip) >= perSource.burst, `${ip}: ${from(ip)} logged, fewer than its burst`);
      assert.ok(from(ip) <= most, `${ip}: ${from(ip)} logged, more than its bucket allows in ${seconds.toFixed(2)} s (${most})`);
    }
  });

  test('more new sources than the per-source table holds: the node bucket in front keeps it from filling, so no packet the next rule accepts is dropped', async (t) => {
    // A table of at most 10 x 3 + 20 = 50 addresses (calc's sizing); 120 sources, one packet each.
    const audit: AuditConfig = { group: GROUP, defaultLevel: 'all', perSecond: 10, burst: 20, perSource: { perSecond: 1, burst: 2 } };
    assert.equal(auditLimit('waf', audit).perSource?.tableMax, 50);
    await writeAuditRule(audit, 'accept');
    const events = await readEvents(t);
    const sources = Array.from({ length: 120 }, (_, i) => `10.97.1.${i + 1}`);
    await inNs(A, 'ip', ['-batch', '-'], sources.map((ip) => `addr add ${ip}/16 dev va`).join('\n'));
    t.after(() => inNs(A, 'ip', ['-batch', '-'], sources.map((ip) => `addr del ${ip}/16 dev va`).join('\n')));
    const before = await udpReceived();
    const script = `
      import dgram from 'node:dgram';
      for (const src of JSON.parse(process.argv[1])) await new Promise((ok) => { const s = dgram.createSocket('udp4'); s.bind({ address: src }, () => s.send('x', 9, ${JSON.stringify(ADDR.b4)}, () => { s.close(); ok(); })); });
    `;
    await inNs(A, NODE, ['--input-type=module', '-e', script, JSON.stringify(sources)]);
    await quiet(events);
    const received = (await udpReceived()) - before;
    console.log(`audit table: ${sources.length} new sources, ${received} accepted, ${events.length} logged`);
    assert.equal(received, sources.length, 'the audit rule dropped packets the next rule accepts');
    assert.ok(events.length >= audit.burst && events.length < sources.length, `${events.length} logged: the node bucket should have cut the 120 to about its burst`);
  });
});
