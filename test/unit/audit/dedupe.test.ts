import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Deduper, dedupeKey } from '../../../src/audit/dedupe.ts';
import type { NflogEvent } from '../../../src/audit/pcap.ts';
import type { AuditTag } from '../../../src/calc/audit-tags.ts';

const allow: AuditTag = { verdict: 'allow', direction: 'ingress', policy: { namespace: 'shop', name: 'web', rule: 0 } };
const event: NflogEvent = { time: 0, readTime: 0, prefix: 'weir:AI:x', family: 4, protocol: 'TCP', srcIp: '10.0.0.1', srcPort: 40000, dstIp: '10.0.0.2', dstPort: 80 };

test('the key is verdict, direction, policy, rule, reason, isolating policies, source IP, destination IP and port, and protocol; not the source port', () => {
  const base = dedupeKey(allow, event);
  assert.equal(dedupeKey({ ...allow, policy: { ...allow.policy! } }, { ...event, srcPort: 40001, time: 5, prefix: 'weir:AI:y' }), base);
  const differing: [string, AuditTag, NflogEvent][] = [
    ['verdict', { ...allow, verdict: 'would-deny' }, event],
    ['direction', { ...allow, direction: 'egress' }, event],
    ['policy namespace', { ...allow, policy: { ...allow.policy!, namespace: 'bank' } }, event],
    ['policy name', { ...allow, policy: { ...allow.policy!, name: 'api' } }, event],
    ['rule', { ...allow, policy: { ...allow.policy!, rule: 1 } }, event],
    ['default deny', { verdict: 'deny', direction: 'ingress', policy: null, reason: 'default-deny', isolatedBy: [{ namespace: 'shop', name: 'web' }] }, event],
    ['source IP', allow, { ...event, srcIp: '10.0.0.3' }],
    ['destination IP', allow, { ...event, dstIp: '10.0.0.4' }],
    ['destination port', allow, { ...event, dstPort: 81 }],
    ['protocol', allow, { ...event, protocol: 'UDP' }],
  ];
  const keys = new Set([base]);
  for (const [name, tag, e] of differing) {
    const k = dedupeKey(tag, e);
    assert.ok(!keys.has(k), name);
    keys.add(k);
  }
  const denyBy = (names: string[]): AuditTag => ({ verdict: 'deny', direction: 'ingress', policy: null, reason: 'default-deny', isolatedBy: names.map((name) => ({ namespace: 'shop', name })) });
  assert.notEqual(dedupeKey(denyBy(['a']), event), dedupeKey(denyBy(['a', 'b']), event));
  assert.notEqual(dedupeKey(denyBy(['a|b']), event), dedupeKey(denyBy(['a', 'b']), event));
});

test('identical lines within one second of the first become one line with their count, written when the window closes', () => {
  const d = new Deduper<string>();
  assert.equal(
    d.add('k', 1_000, () => 'first'),
    'new',
  );
  assert.equal(
    d.add('k', 1_400, () => 'second'),
    'folded',
  );
  assert.equal(
    d.add('k', 1_999, () => 'third'),
    'folded',
  );
  assert.deepEqual(d.due(1_999), []);
  assert.equal(d.nextDue(), 2_000);
  assert.deepEqual(d.due(2_000), [{ value: 'first', count: 3 }]);
  assert.equal(d.size, 0);
  assert.equal(d.nextDue(), undefined);
});

test('the same line after the window closed starts a new one', () => {
  const d = new Deduper<string>();
  d.add('k', 0, () => 'a');
  d.add('k', 1_000, () => 'b'); // the first window [0, 1000) is over
  assert.deepEqual(d.due(1_000), [{ value: 'a', count: 1 }]);
  d.add('k', 1_500, () => 'c');
  assert.deepEqual(d.due(2_000), [{ value: 'b', count: 2 }]);
});

test('different lines are kept apart and come out in the order they were first seen', () => {
  const d = new Deduper<string>();
  d.add('x', 0, () => 'x');
  d.add('y', 10, () => 'y');
  d.add('x', 20, () => 'x2');
  d.add('z', 900, () => 'z');
  assert.deepEqual(d.due(1_500), [
    { value: 'x', count: 2 },
    { value: 'y', count: 1 },
  ]);
  assert.deepEqual(d.flush(), [{ value: 'z', count: 1 }]);
  assert.equal(d.size, 0);
});

test('at most maxPending distinct lines wait; more are dropped and said so, repeats of waiting ones still fold', () => {
  const d = new Deduper<string>({ maxPending: 2 });
  assert.equal(
    d.add('a', 0, () => 'a'),
    'new',
  );
  assert.equal(
    d.add('b', 0, () => 'b'),
    'new',
  );
  assert.equal(
    d.add('c', 0, () => 'c'),
    'dropped',
  );
  assert.equal(
    d.add('a', 1, () => 'a'),
    'folded',
  );
  assert.deepEqual(d.flush(), [
    { value: 'a', count: 2 },
    { value: 'b', count: 1 },
  ]);
});

test('a clock going backwards never holds a line longer than one window after its first', () => {
  const d = new Deduper<string>({ windowMs: 1_000 });
  d.add('k', 5_000, () => 'a');
  d.add('k', 4_000, () => 'b');
  assert.deepEqual(d.due(6_000), [{ value: 'a', count: 2 }]);
});

test('a line whose window closed behind a younger one (the clock went backwards) is released, never overwritten', () => {
  const d = new Deduper<string>({ windowMs: 1_000 });
  d.add('late', 5_000, () => 'late'); // closes at 6000
  d.add('k', 3_000, () => 'k'); // closes at 4000, behind 'late'
  assert.equal(
    d.add('k', 4_500, () => 'k2'),
    'new',
  );
  assert.deepEqual(d.flush(), [
    { value: 'k', count: 1 },
    { value: 'late', count: 1 },
    { value: 'k2', count: 1 },
  ]);
});
