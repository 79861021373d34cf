// The audit pipeline end to end: events (from a real child's pcap stream, or handed in by a
// test reader) -> catalog -> pod names -> deduplication -> JSON lines in a real file, with
// the metrics it keeps. The kernel side is test/kernel/audit-reader.test.ts.

import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { type AuditLogConfig, createAuditLog } from '../../../src/audit/index.ts';
import { NflogPcapParser } from '../../../src/audit/pcap.ts';
import type { AuditCatalog, AuditTag } from '../../../src/calc/audit-tags.ts';
import { silentLogger } from '../../../src/log.ts';
import { untilPasses } from '../../support/eventually.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { nflogEvent as event, pod, readLines, testReader, up } from './fixtures.ts';

const FIXTURE = fileURLToPath(new URL('./fixtures/nflog-le.pcap', import.meta.url));
const root = await mkdtemp(join(tmpdir(), 'weir-audit-pipeline-'));
after(() => rm(root, { recursive: true, force: true }));
let seq = 0;

/** The pipeline's clock: its windows' timers run only when the test moves time on. */
const fakeClock = () => new FakeClock(1_000_000);

const catalogOf = (tags: Record<string, AuditTag>): AuditCatalog => ({ lookup: (p) => tags[p] });

function config(over: Partial<AuditLogConfig> = {}): AuditLogConfig {
  return { node: 'node-a', nflogGroup: 77, rate: 1000, file: join(root, `case${seq++}`, 'audit.log'), maxSize: 1 << 20, maxFiles: 2, stdout: false, ...over };
}

async function metric(registry: Registry, name: string): Promise<Record<string, number>> {
  const m = registry.getSingleMetric(name);
  if (m === undefined) return {};
  const got = await m.get();
  return Object.fromEntries(got.values.map((v) => [Object.values(v.labels).join(',') || '', v.value]));
}

const ALLOW: AuditTag = { verdict: 'allow', direction: 'ingress', policy: { namespace: 'shop', name: 'web', rule: 1 } };
const DENY: AuditTag = {
  verdict: 'deny',
  direction: 'egress',
  policy: null,
  reason: 'default-deny',
  isolatedBy: [
    { namespace: 'shop', name: 'lockdown' },
    { namespace: 'shop', name: 'web' },
  ],
};

/** A pipeline on a test reader and the fake clock; its catalog knows weir:AI:allow unless `tags` says otherwise. */
function driven(over: { config?: Partial<AuditLogConfig>; tags?: Record<string, AuditTag>; onError?: (e: unknown) => void } = {}) {
  const clock = fakeClock();
  const r = testReader();
  const registry = new Registry();
  const cfg = config(over.config);
  const audit = createAuditLog({ config: cfg, catalog: catalogOf(over.tags ?? { 'weir:AI:allow': ALLOW }), registry, log: silentLogger(), clock, reader: r.reader, onError: over.onError });
  return { clock, r, registry, cfg, audit };
}

test("a real child's pcap stream becomes exactly one line per connection, with the issue's fields in order", async () => {
  // A stand-in for tcpdump, started as tcpdump is (through setpriv), as the test's user.
  const fake = join(root, 'tcpdump');
  await writeFile(fake, `#!/bin/sh\necho "tcpdump: listening on nflog:77" >&2; cat ${FIXTURE}; exec sleep 30\n`, { mode: 0o755 });
  const cfg = config({ tcpdump: [fake], tcpdumpUser: null, dedupeWindowMs: 20 });
  const registry = new Registry();
  const audit = createAuditLog({ config: cfg, catalog: catalogOf({ 'weir:AI:test': ALLOW }), registry, log: silentLogger() });
  audit.applyModel([up(pod('team-a', 'client', ['10.99.0.1', 'fd99::1'])), up(pod('team-b', 'server', ['10.99.0.2']))]);
  await audit.start();
  await untilPasses(async () => assert.equal((await readLines(cfg.file)).length, 8));
  await audit.stop();
  const events = new NflogPcapParser().push(await readFile(FIXTURE));
  const text = (await readFile(cfg.file, 'utf8')).split('\n').filter((l) => l !== '');
  assert.deepEqual(
    text.map((l) => JSON.parse(l)),
    events.map((e) => ({
      version: 1,
      time: new Date(e.time).toISOString(),
      node: 'node-a',
      verdict: 'allow',
      direction: 'ingress',
      policy: { namespace: 'shop', name: 'web', rule: 1 },
      src: { ip: e.srcIp, port: e.srcPort, namespace: 'team-a', pod: 'client' },
      dst: { ip: e.dstIp, port: e.dstPort, namespace: e.dstIp === '10.99.0.2' ? 'team-b' : '', pod: e.dstIp === '10.99.0.2' ? 'server' : '' },
      protocol: e.protocol,
      count: 1,
    })),
  );
  assert.deepEqual(Object.keys(JSON.parse(text[0])), ['version', 'time', 'node', 'verdict', 'direction', 'policy', 'src', 'dst', 'protocol', 'count']);
  assert.match(JSON.parse(text[0]).time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.deepEqual(await metric(registry, 'weir_audit_events_total'), { allow: 8 });
  assert.deepEqual(await metric(registry, 'weir_audit_reader_up'), { '': 0 });
});

test("a flow's first connection is written at once; its later ones within the second fold into one line, written when the second is over", async () => {
  const { clock, r, cfg, registry, audit } = driven();
  await audit.start();
  r.emit([event({ srcPort: 40001 })]);
  // No time passes: the line is out as soon as the writer's turn of the event loop has run.
  await untilPasses(async () => assert.equal((await readLines(cfg.file)).length, 1));
  const [first] = await readLines(cfg.file);
  assert.deepEqual([first.count, first.src.port, first.time], [1, 40001, '2026-11-24T06:44:19.890Z']);
  clock.advance(400);
  r.emit([event({ srcPort: 40002, time: Date.UTC(2026, 10, 24, 6, 44, 20, 290) }), event({ dstPort: 9090 })]);
  clock.advance(500);
  r.emit([event({ srcPort: 40003 })]);
  clock.advance(99);
  await untilPasses(async () => assert.equal((await readLines(cfg.file)).length, 2)); // 9090's first line
  await new Promise((res) => setTimeout(res, 50));
  assert.equal((await readLines(cfg.file)).length, 2, 'the folded line was written before its second was over');
  clock.advance(1);
  await untilPasses(async () => assert.equal((await readLines(cfg.file)).length, 3));
  const folded = (await readLines(cfg.file))[2];
  // The line stands for the connections after the first: the time and source port of the first of them.
  assert.deepEqual([folded.dst.port, folded.count, folded.src.port, folded.time], [8080, 2, 40002, '2026-11-24T06:44:20.290Z']);
  clock.advance(400); // 9090's second is over too, with nothing folded: no line
  await audit.stop();
  assert.deepEqual(
    (await readLines(cfg.file)).map((l) => [l.dst.port, l.count]),
    [
      [8080, 1],
      [9090, 1],
      [8080, 2],
    ],
  );
  assert.deepEqual(await metric(registry, 'weir_audit_lines_total'), { '': 3 });
  assert.deepEqual(await metric(registry, 'weir_audit_events_total'), { allow: 4 });
});

test('a flow that goes on makes its first line at once and then one line a second; after a quiet second its next connection is written at once again', async () => {
  const { clock, r, cfg, audit } = driven();
  await audit.start();
  for (let i = 0; i < 25; i++) {
    r.emit([event({ srcPort: 40000 + i })]);
    clock.advance(100);
  }
  clock.advance(2000); // the third second folds the last five; the fourth is quiet and ends the flow
  r.emit([event({ srcPort: 41000 })]);
  await untilPasses(async () => assert.equal((await readLines(cfg.file)).length, 5));
  await audit.stop();
  assert.deepEqual(
    (await readLines(cfg.file)).map((l) => [l.src.port, l.count]),
    [
      [40000, 1],
      [40001, 9],
      [40010, 10],
      [40020, 5],
      [41000, 1],
    ],
  );
});

test('a drop no policy explains: policy null, reason default-deny and the isolating policies; addresses of no pod have empty names', async () => {
  const { r, cfg, audit } = driven({ tags: { 'weir:AD:x': DENY } });
  audit.applyModel([up(pod('shop', 'web-1', ['fd00:10:244:1::2']))]);
  await audit.start();
  r.emit([event({ prefix: 'weir:AD:x', family: 6, protocol: 'UDP', srcIp: 'fd00:10:244:1::2', srcPort: 5000, dstIp: '2001:db8::9', dstPort: 53 })]);
  await audit.stop(); // flushes the open second
  const lines = await readLines(cfg.file);
  assert.deepEqual(lines, [
    {
      version: 1,
      time: '2026-11-24T06:44:19.890Z',
      node: 'node-a',
      ...DENY, // the tag's verdict, direction, null policy, reason and isolating policies
      src: { ip: 'fd00:10:244:1::2', port: 5000, namespace: 'shop', pod: 'web-1' },
      dst: { ip: '2001:db8::9', port: 53, namespace: '', pod: '' },
      protocol: 'UDP',
      count: 1,
    },
  ]);
});

test('an event of a prefix the catalog does not know is counted and dropped, never written with a guess', async () => {
  const { r, cfg, registry, audit } = driven();
  await audit.start();
  r.emit([event({ prefix: 'weir:AI:gone' }), event({ prefix: 'someone-else' }), event()]);
  await audit.stop();
  assert.deepEqual(
    (await readLines(cfg.file)).map((l) => l.policy?.name),
    ['web'],
  );
  assert.deepEqual(await metric(registry, 'weir_audit_lost_total'), { 'unknown-prefix': 2 });
  assert.deepEqual(await metric(registry, 'weir_audit_events_total'), { allow: 1 });
});

test('a connection seen just after its pod was deleted is still named; a reused IP names its new pod', async () => {
  const { clock, r, cfg, audit } = driven();
  const old = pod('shop', 'web-1', ['10.244.2.3']);
  audit.applyModel([up(pod('shop', 'client', ['10.244.1.2'])), up(old)]);
  await audit.start();
  audit.applyModel([{ kind: 'Pod', op: 'delete', uid: old.uid }]);
  r.emit([event()]);
  clock.advance(1000);
  audit.applyModel([up(pod('bank', 'api-7', ['10.244.2.3']))]);
  r.emit([event()]);
  await audit.stop();
  assert.deepEqual(
    (await readLines(cfg.file)).map((l) => `${l.dst.namespace}/${l.dst.pod}`),
    ['shop/web-1', 'bank/api-7'],
  );
});

test("the reader's state and losses become metrics: up, restarts, and lost by where", async () => {
  const { r, registry, audit } = driven({ tags: {} });
  await audit.start();
  assert.deepEqual(await metric(registry, 'weir_audit_reader_up'), { '': 1 });
  const h = r.handlers();
  h.state?.('backoff');
  assert.deepEqual(await metric(registry, 'weir_audit_reader_up'), { '': 0 });
  h.state?.('starting');
  h.state?.('running');
  h.lost?.(17);
  h.malformed?.(2);
  assert.deepEqual(await metric(registry, 'weir_audit_reader_up'), { '': 1 });
  assert.deepEqual(await metric(registry, 'weir_audit_reader_restarts_total'), { '': 1 });
  assert.deepEqual(await metric(registry, 'weir_audit_lost_total'), { queue: 17, malformed: 2 });
  await audit.stop();
  assert.deepEqual(await metric(registry, 'weir_audit_reader_up'), { '': 0 });
});

test('a file that cannot be written costs lines (counted as lost where=write), never an exception in the reader', async () => {
  const dir = join(root, `case${seq++}`);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'blocked'), 'a file where the directory should be');
  const errors: unknown[] = [];
  const { r, registry, audit } = driven({ config: { file: join(dir, 'blocked', 'audit.log') }, onError: (e) => errors.push(e) });
  await audit.start();
  assert.doesNotThrow(() => r.emit([event(), event({ dstPort: 1 })]));
  await audit.stop();
  assert.deepEqual(await metric(registry, 'weir_audit_lost_total'), { write: 2 });
  assert.ok(errors.length >= 1);
});

test('more distinct lines than may wait are dropped and counted (where=overflow), bounding memory, however many the cap lets through', async () => {
  // At most 8 x 10 lines wait; windows of a minute keep every flow's open while the cap's
  // tokens come back, one each 100 ms.
  const { clock, r, cfg, registry, audit } = driven({ config: { rate: 10, dedupeWindowMs: 60_000 } });
  await audit.start();
  r.emit(Array.from({ length: 20 }, (_, i) => event({ dstPort: 1000 + i }))); // the cap's burst
  for (let i = 0; i < 70; i++) {
    clock.advance(100);
    r.emit([event({ dstPort: 2000 + i })]);
  }
  assert.equal(audit.stats().linesWaiting, 80);
  await audit.stop();
  assert.equal((await readLines(cfg.file)).length, 80);
  assert.deepEqual(await metric(registry, 'weir_audit_lost_total'), { overflow: 10 });
  assert.deepEqual(await metric(registry, 'weir_audit_events_capped_total'), {});
  assert.deepEqual(await metric(registry, 'weir_audit_events_total'), { allow: 90 });
});

test("the node's cap: beyond --audit-rate lines a second (bursts of twice that) a flow's first line is not written, and is counted by its source's namespace; its next event, once tokens are back, is a first line again", async () => {
  const { clock, r, cfg, registry, audit } = driven({ config: { rate: 5 } }); // bursts of 10
  audit.applyModel([up(pod('noisy', 'scanner', ['10.244.1.2'])), up(pod('quiet', 'client', ['10.244.1.3']))]);
  await audit.start();
  r.emit(Array.from({ length: 15 }, (_, i) => event({ dstPort: 1000 + i })));
  r.emit([event({ srcIp: '10.244.1.3', dstPort: 80 }), event({ srcIp: '192.0.2.9', dstPort: 80 })]);
  assert.deepEqual(await metric(registry, 'weir_audit_events_capped_total'), { noisy: 5, quiet: 1, '': 1 });
  assert.equal(audit.stats().linesWaiting, 10, 'a refused first line opens no window');
  clock.advance(1000); // 5 tokens back
  r.emit([event({ srcIp: '10.244.1.3', dstPort: 80 })]);
  await audit.stop();
  const lines = await readLines(cfg.file);
  assert.deepEqual(
    lines.map((l) => `${l.src.namespace}:${l.dst.port}:${l.count}`),
    [...Array.from({ length: 10 }, (_, i) => `noisy:${1000 + i}:1`), 'quiet:80:1'],
  );
  assert.deepEqual(await metric(registry, 'weir_audit_events_capped_total'), { noisy: 5, quiet: 1, '': 1 });
  assert.deepEqual(await metric(registry, 'weir_audit_lines_total'), { '': 11 });
  assert.deepEqual(await metric(registry, 'weir_audit_events_total'), { allow: 18 });
  assert.deepEqual(await metric(registry, 'weir_audit_lost_total'), {});
});

test('lines spend tokens, not folded events: a flow that goes on costs one token a second, and a folded line the cap refuses counts every event it held', async () => {
  const { clock, r, cfg, registry, audit } = driven({ config: { rate: 1 } }); // bursts of 2
  audit.applyModel([up(pod('shop', 'client', ['10.244.1.2'])), up(pod('bank', 'teller', ['10.244.1.3']))]);
  await audit.start();
  r.emit([event({ dstPort: 1 }), event({ srcIp: '10.244.1.3', dstPort: 2 }), event({ dstPort: 3 })]); // two first lines; the third refused
  clock.advance(100);
  r.emit([...Array.from({ length: 10 }, () => event({ dstPort: 1 })), ...Array.from({ length: 3 }, () => event({ srcIp: '10.244.1.3', dstPort: 2 }))]);
  assert.deepEqual(await metric(registry, 'weir_audit_events_capped_total'), { shop: 1 });
  clock.advance(900); // both windows close; one token has come back, for the first of them
  await audit.stop();
  assert.deepEqual(
    (await readLines(cfg.file)).map((l) => [l.dst.port, l.count]),
    [
      [1, 1],
      [2, 1],
      [1, 10],
    ],
  );
  assert.deepEqual(await metric(registry, 'weir_audit_events_capped_total'), { shop: 1, bank: 3 });
  assert.deepEqual(await metric(registry, 'weir_audit_lines_total'), { '': 3 });
});
