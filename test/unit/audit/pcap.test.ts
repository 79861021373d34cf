// The pcap stream parser on bytes the kernel really produced: fixtures/nflog-le.pcap was
// recorded by test/kernel/audit-fixtures.ts (tcpdump -i nflog:77 -U -w - on a little-endian
// machine, eight new connections of every kind the parser decodes). The byte-swapped and
// nanosecond streams are derived from it here, field by field, as a big-endian writer or
// --time-stamp-precision=nano would have written them.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { formatIpv6, LINKTYPE_NFLOG, NflogPcapParser, type NflogEvent } from '../../../src/audit/pcap.ts';
import { WeirError } from '../../../src/errors.ts';
import { canonicalIp, parseIp } from '../../../src/model/cidr.ts';

const LE: Buffer = readFileSync(new URL('./fixtures/nflog-le.pcap', import.meta.url));

/** What was sent, in order (test/kernel/audit-fixtures.ts). */
const SENT = [
  { family: 4, protocol: 'TCP', srcIp: '10.99.0.1', srcPort: 40001, dstIp: '10.99.0.2', dstPort: 8080 },
  { family: 4, protocol: 'UDP', srcIp: '10.99.0.1', srcPort: 40002, dstIp: '10.99.0.2', dstPort: 5353 },
  { family: 6, protocol: 'TCP', srcIp: 'fd99::1', srcPort: 40001, dstIp: 'fd99::2', dstPort: 8080 },
  { family: 6, protocol: 'UDP', srcIp: 'fd99::1', srcPort: 40002, dstIp: 'fd99::2', dstPort: 5353 },
  { family: 6, protocol: 'UDP', srcIp: 'fd99::1', srcPort: 40003, dstIp: 'fd99::2', dstPort: 5354 },
  { family: 4, protocol: 'UDP', srcIp: '10.99.0.1', srcPort: 40004, dstIp: '10.99.0.2', dstPort: 5355 },
  { family: 4, protocol: 'ICMP', srcIp: '10.99.0.1', srcPort: null, dstIp: '10.99.0.2', dstPort: null },
  { family: 6, protocol: 'ICMPv6', srcIp: 'fd99::1', srcPort: null, dstIp: 'fd99::2', dstPort: null },
].map((e) => ({ prefix: 'weir:AI:test', ...e }));

const withoutTimes = (events: readonly NflogEvent[]) => events.map(({ time: _t, readTime: _r, ...rest }) => rest);

function parseAll(chunks: readonly Uint8Array[]): { events: NflogEvent[]; parser: NflogPcapParser } {
  const parser = new NflogPcapParser();
  const events: NflogEvent[] = [];
  for (const c of chunks) events.push(...parser.push(c));
  return { events, parser };
}

// ---- Reading the fixture as raw pcap, to derive the other streams --------------------------

interface RawRecord {
  header: Buffer;
  data: Buffer;
}

function records(file: Buffer): { global: Buffer; recs: RawRecord[] } {
  const recs: RawRecord[] = [];
  for (let o = 24; o < file.length; ) {
    const len = file.readUInt32LE(o + 8);
    recs.push({ header: file.subarray(o, o + 16), data: file.subarray(o + 16, o + 16 + len) });
    o += 16 + len;
  }
  return { global: file.subarray(0, 24), recs };
}

/** The TLVs of one NFLOG record (little-endian length and type), as [type, value] pairs. */
function tlvs(data: Buffer): [number, Buffer][] {
  const out: [number, Buffer][] = [];
  for (let o = 4; o + 4 <= data.length; ) {
    const len = data.readUInt16LE(o);
    out.push([data.readUInt16LE(o + 2), data.subarray(o + 4, o + len)]);
    o += (len + 3) & ~3;
  }
  return out;
}

/** An NFLOG record built back from TLVs, in either byte order. */
function nflogData(head: Buffer, ts: [number, Buffer][], big: boolean): Buffer {
  const parts = [head];
  for (const [type, value] of ts) {
    const h = Buffer.alloc(4);
    big ? h.writeUInt16BE(value.length + 4, 0) : h.writeUInt16LE(value.length + 4, 0);
    big ? h.writeUInt16BE(type, 2) : h.writeUInt16LE(type, 2);
    parts.push(h, value, Buffer.alloc((4 - (value.length % 4)) % 4));
  }
  return Buffer.concat(parts);
}

function recordHeader(sec: number, frac: number, len: number, big: boolean): Buffer {
  const h = Buffer.alloc(16);
  const w = (v: number, o: number) => (big ? h.writeUInt32BE(v, o) : h.writeUInt32LE(v, o));
  w(sec, 0);
  w(frac, 4);
  w(len, 8);
  w(len, 12);
  return h;
}

/** The fixture rewritten: byte order, time precision, and each record's TLVs passed through `edit`. */
function rewrite(opts: { big?: boolean; nano?: boolean; edit?: (ts: [number, Buffer][], i: number) => [number, Buffer][] } = {}): Buffer {
  const { global, recs } = records(LE);
  const big = opts.big ?? false;
  const g = Buffer.alloc(24);
  const w32 = (v: number, o: number) => (big ? g.writeUInt32BE(v, o) : g.writeUInt32LE(v, o));
  const w16 = (v: number, o: number) => (big ? g.writeUInt16BE(v, o) : g.writeUInt16LE(v, o));
  w32(opts.nano ? 0xa1b23c4d : 0xa1b2c3d4, 0);
  w16(global.readUInt16LE(4), 4);
  w16(global.readUInt16LE(6), 6);
  w32(global.readUInt32LE(16), 16);
  w32(global.readUInt32LE(20), 20);
  const out: Uint8Array[] = [g];
  recs.forEach((r, i) => {
    const ts = opts.edit ? opts.edit(tlvs(r.data), i) : tlvs(r.data);
    const data = nflogData(r.data.subarray(0, 4), ts, big);
    const frac = r.header.readUInt32LE(4) * (opts.nano ? 1000 : 1);
    out.push(recordHeader(r.header.readUInt32LE(0), frac, data.length, big), data);
  });
  return Buffer.concat(out);
}

const PAYLOAD = 9;
const TIMESTAMP = 3;

// ---- Tests -------------------------------------------------------------------------------

test('the recorded stream decodes to exactly the connections sent: families, protocols, addresses and ports', () => {
  const { events, parser } = parseAll([LE]);
  assert.deepEqual(withoutTimes(events), SENT);
  assert.deepEqual(parser.stats, { records: 8, events: 8, malformed: 0 });
  assert.equal(parser.pending, 0);
});

test("each event's time is the kernel's timestamp of the packet, close to tcpdump's capture time", () => {
  const { events } = parseAll([LE]);
  const { recs } = records(LE);
  events.forEach((e, i) => {
    const read = recs[i].header.readUInt32LE(0) * 1000 + recs[i].header.readUInt32LE(4) / 1000;
    assert.equal(e.readTime, read);
    assert.ok(e.time <= read && read - e.time < 1000, `event ${i}: kernel ${e.time}, read ${read}`);
    if (i > 0) assert.ok(e.time >= events[i - 1].time);
  });
});

test('a stream split at every byte offset, or fed a byte at a time, gives the same events', () => {
  const whole = parseAll([LE]).events;
  for (let k = 0; k <= LE.length; k++) {
    const { events, parser } = parseAll([LE.subarray(0, k), LE.subarray(k)]);
    assert.deepEqual(events, whole, `split at ${k}`);
    assert.equal(parser.pending, 0);
  }
  assert.deepEqual(parseAll([...LE].map((b) => Uint8Array.of(b))).events, whole);
});

test('a big-endian writer and nanosecond timestamps give the same events, split anywhere', () => {
  const whole = parseAll([LE]).events;
  for (const opts of [{ big: true }, { nano: true }, { big: true, nano: true }]) {
    const stream = rewrite(opts);
    assert.deepEqual(parseAll([stream]).events, whole, JSON.stringify(opts));
    for (let k = 0; k <= stream.length; k += 7) assert.deepEqual(parseAll([stream.subarray(0, k), stream.subarray(k)]).events, whole, `${JSON.stringify(opts)} split at ${k}`);
  }
});

test('without a kernel timestamp the time is the capture time of the record', () => {
  const { events } = parseAll([rewrite({ edit: (ts) => ts.filter(([t]) => t !== TIMESTAMP) })]);
  for (const e of events) assert.equal(e.time, e.readTime);
});

test('SCTP and UDP-Lite carry ports, GRE and unnamed protocols none (a number names the latter); a non-first IPv4 fragment has none', () => {
  // The real UDP IPv4 record (second) with its protocol byte and fragment offset rewritten.
  const ipv4 = (mutate: (ip: Buffer) => void) =>
    parseAll([
      rewrite({
        edit: (ts, i) =>
          i !== 1
            ? ts
            : ts.map(([t, v]) => {
                if (t !== PAYLOAD) return [t, v];
                const ip = Buffer.from(v);
                mutate(ip);
                return [t, ip];
              }),
      }),
    ]).events[1];
  assert.deepEqual(
    [ipv4((ip) => (ip[9] = 132))].map((e) => [e.protocol, e.srcPort, e.dstPort]),
    [['SCTP', 40002, 5353]],
  );
  assert.deepEqual(
    [ipv4((ip) => (ip[9] = 136))].map((e) => [e.protocol, e.srcPort, e.dstPort]),
    [['UDPLite', 40002, 5353]],
  );
  assert.deepEqual(
    [ipv4((ip) => (ip[9] = 47))].map((e) => [e.protocol, e.srcPort, e.dstPort]),
    [['GRE', null, null]],
  );
  assert.deepEqual(
    [ipv4((ip) => (ip[9] = 99))].map((e) => [e.protocol, e.srcPort, e.dstPort]),
    [['99', null, null]],
  );
  assert.deepEqual(
    [ipv4((ip) => ip.writeUInt16BE(0x2000 | 185, 6))].map((e) => [e.protocol, e.srcPort, e.dstPort]),
    [['UDP', null, null]],
  );
});

test('IPv6 fragment, routing and AH headers are walked; a non-first fragment has no ports', () => {
  // The real UDP IPv6 record (fourth) with one extension header inserted after the fixed header.
  const ipv6 = (ext: Buffer, nextHeaderOfIp: number) =>
    parseAll([
      rewrite({
        edit: (ts, i) =>
          i !== 3
            ? ts
            : ts.map(([t, v]) => {
                if (t !== PAYLOAD) return [t, v];
                const ext2 = Buffer.from(ext);
                ext2[0] = v[6]; // the extension header's next header: what the IP header said
                const ip = Buffer.concat([v.subarray(0, 40), ext2, v.subarray(40)]);
                ip[6] = nextHeaderOfIp;
                ip.writeUInt16BE(v.readUInt16BE(4) + ext.length, 4);
                return [t, ip];
              }),
      }),
    ]).events[3];
  const fragment = (offset: number) => Buffer.from([0, 0, (offset << 3) >> 8, (offset << 3) & 0xff, 0, 0, 0, 1]);
  const routing = Buffer.from([0, 0, 0, 0, 0, 0, 0, 0]); // type 0, segments left 0, 8 bytes
  const ah = Buffer.from([0, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // (4+2)*4 = 24 bytes
  const ports = (e: NflogEvent) => [e.protocol, e.srcPort, e.dstPort];
  assert.deepEqual(ports(ipv6(fragment(0), 44)), ['UDP', 40002, 5353]);
  assert.deepEqual(ports(ipv6(fragment(100), 44)), ['UDP', null, null]);
  assert.deepEqual(ports(ipv6(routing, 43)), ['UDP', 40002, 5353]);
  assert.deepEqual(ports(ipv6(ah, 51)), ['UDP', 40002, 5353]);
  assert.deepEqual(ports(ipv6(Buffer.alloc(0), 50)), ['ESP', null, null]);
});

test('a record the parser cannot read is counted and skipped; the records after it still decode', () => {
  const cases: { name: string; edit: (ts: [number, Buffer][]) => [number, Buffer][] }[] = [
    { name: 'no payload', edit: (ts) => ts.filter(([t]) => t !== PAYLOAD) },
    { name: 'not IP', edit: (ts) => ts.map(([t, v]) => (t === PAYLOAD ? [t, Buffer.from([0x00, 1, 2, 3])] : [t, v])) },
    { name: 'IPv4 cut in the addresses', edit: (ts) => ts.map(([t, v]) => (t === PAYLOAD ? [t, v.subarray(0, 15)] : [t, v])) },
    { name: 'IPv6 cut in the addresses', edit: (ts) => ts.map(([t, v]) => (t === PAYLOAD ? [t, Buffer.concat([Buffer.from([0x60]), v.subarray(1, 30)])] : [t, v])) },
  ];
  for (const c of cases) {
    const { events, parser } = parseAll([rewrite({ edit: (ts, i) => (i === 2 ? c.edit(ts) : ts) })]);
    assert.deepEqual(
      withoutTimes(events),
      SENT.filter((_, i) => i !== 2),
      c.name,
    );
    assert.deepEqual(parser.stats, { records: 8, events: 7, malformed: 1 }, c.name);
  }
  // A TLV whose length runs past the record: the record is malformed, not the stream.
  const { recs, global } = records(LE);
  const broken = Buffer.from(recs[0].data);
  broken.writeUInt16LE(0xfff0, 4);
  const { events, parser } = parseAll([global, recs[0].header, broken, ...recs.slice(1).flatMap((r) => [r.header, r.data])]);
  assert.equal(events.length, 7);
  assert.equal(parser.stats.malformed, 1);
});

test('a prefix without its terminating NUL is read to the end of its TLV', () => {
  const { events } = parseAll([rewrite({ edit: (ts) => ts.map(([t, v]) => (t === 10 ? [t, Buffer.from('weir:AI:abc')] : [t, v])) })]);
  assert.ok(events.every((e) => e.prefix === 'weir:AI:abc'));
});

test('a stream that is not an NFLOG pcap stream fails with WEIR_AUDIT_STREAM, naming what was wrong', () => {
  const bad = (mutate: (b: Buffer) => void) => {
    const b = Buffer.from(LE);
    mutate(b);
    return b;
  };
  const cases: [string, Buffer, RegExp][] = [
    ['text instead of pcap', Buffer.from('tcpdump: nflog:77: No such device exists\n'.repeat(2)), /not a pcap stream/],
    ['Ethernet link type', bad((b) => b.writeUInt32LE(1, 20)), /link type 1, not NFLOG \(239\)/],
    ['a record longer than any NFLOG message', bad((b) => b.writeUInt32LE(0x7fffffff, 24 + 8)), /record of 2147483647 bytes/],
  ];
  for (const [name, stream, message] of cases) {
    const parser = new NflogPcapParser();
    assert.throws(
      () => parser.push(stream),
      (err: unknown) => err instanceof WeirError && err.code === 'WEIR_AUDIT_STREAM' && message.test(err.message),
      name,
    );
  }
  assert.equal(LINKTYPE_NFLOG, 239);
});

test('IPv6 addresses are printed like the model prints them: lower case, RFC 5952 compressed', () => {
  const cases = ['::', '::1', '1::', 'fd99::2', '2001:db8::1:0:0:1', '2001:db8:0:1:1:1:1:1', 'fe80::a:b:c:d', '::ffff:10.1.2.3', '2001:db8:0:0:1::', 'FD00:ABCD::EF', '1:0:0:2:0:0:0:3', '0:0:1::'];
  let seed = 7;
  for (let i = 0; i < 500; i++) {
    const groups = Array.from({ length: 8 }, () => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % 3 === 0 ? 0 : seed % 0x10000;
    });
    cases.push(groups.map((g) => g.toString(16)).join(':'));
  }
  for (const text of cases) {
    const ip = parseIp(text);
    assert.ok(!('error' in ip) && ip.family === 6, text);
    const bytes = Buffer.alloc(16);
    for (let j = 0; j < 16; j++) bytes[j] = Number((ip.value >> BigInt(8 * (15 - j))) & 0xffn);
    const canonical = canonicalIp(text);
    assert.equal(formatIpv6(bytes, 0), canonical, text);
  }
});
