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

test("a key's first occurrence is new (the caller writes it at once); the next ones within its window fold into one line, made from the first of them, released when the window closes", () => {
  const d = new Deduper<string>();
  const made: string[] = [];
  const make = (v: string) => () => {
    made.push(v);
    return v;
  };
  assert.equal(d.add('k', 1_000, make('first')), 'new');
  assert.deepEqual(made, [], 'the first occurrence needs no line kept');
  assert.equal(d.add('k', 1_400, make('second')), 'folded');
  assert.equal(d.add('k', 1_999, make('third')), 'folded');
  assert.deepEqual(made, ['second']);
  assert.deepEqual(d.due(1_999), []);
  assert.equal(d.nextDue(), 2_000);
  assert.deepEqual(d.due(2_000), [{ value: 'second', count: 2 }]);
});

test('a window that folded some opens the next; one that folded none ends it, and the next occurrence is new again', () => {
  const d = new Deduper<string>();
  d.add('k', 0, () => 'a');
  d.add('k', 500, () => 'b');
  assert.deepEqual(d.due(1_000), [{ value: 'b', count: 1 }]);
  assert.equal(d.size, 1, 'the next window is open');
  assert.equal(d.nextDue(), 2_000);
  assert.deepEqual(d.due(2_000), [], 'an empty window writes nothing');
  assert.equal(d.size, 0);
  assert.equal(d.nextDue(), undefined);
  assert.equal(
    d.add('k', 2_500, () => 'c'),
    'new',
  );
});

test('an occurrence at or after the end of its window, before due() ran, closes that window first and folds into the next', () => {
  const d = new Deduper<string>();
  d.add('k', 0, () => 'a');
  d.add('k', 100, () => 'b');
  assert.equal(
    d.add('k', 1_000, () => 'c'),
    'folded',
  );
  assert.deepEqual(d.due(1_000), [{ value: 'b', count: 1 }]);
  assert.deepEqual(d.due(2_000), [{ value: 'c', count: 1 }]);
});

test('different keys are kept apart and their lines come out in the order their windows close', () => {
  const d = new Deduper<string>();
  d.add('x', 0, () => 'x');
  d.add('y', 10, () => 'y');
  d.add('x', 20, () => 'x2');
  d.add('y', 30, () => 'y2');
  d.add('z', 900, () => 'z');
  d.add('z', 950, () => 'z2');
  assert.deepEqual(d.due(1_500), [
    { value: 'x2', count: 1 },
    { value: 'y2', count: 1 },
  ]);
  assert.deepEqual(d.flush(), [{ value: 'z2', count: 1 }], 'flush writes the open windows that folded some');
  assert.equal(d.size, 0);
});

test('at most maxPending windows are open; a new key beyond them is dropped and said so, repeats of open ones still fold', () => {
  const d = new Deduper<string>({ maxPending: 2 });
  assert.deepEqual(
    ['a', 'b', 'c'].map((k) => d.add(k, 0, () => k)),
    ['new', 'new', 'dropped'],
  );
  assert.equal(
    d.add('a', 1, () => 'a2'),
    'folded',
  );
  assert.deepEqual(d.flush(), [{ value: 'a2', count: 1 }]);
});

test('admit is asked only for a first occurrence that would open a window: refused, none opens and the next occurrence is a first one again; repeats of an open window never ask', () => {
  const d = new Deduper<string>({ windowMs: 1_000, maxPending: 2 });
  const asked: string[] = [];
  const admit = (k: string, yes: boolean) => () => {
    asked.push(k);
    return yes;
  };
  assert.equal(
    d.add('a', 0, () => 'a', admit('a', true)),
    'new',
  );
  assert.equal(
    d.add('b', 0, () => 'b', admit('b', false)),
    'refused',
  );
  assert.equal(d.size, 1);
  assert.equal(
    d.add('a', 10, () => 'a2', admit('a', false)),
    'folded',
  );
  assert.equal(
    d.add('b', 20, () => 'b2', admit('b', true)),
    'new',
  );
  assert.equal(
    d.add('c', 30, () => 'c', admit('c', true)),
    'dropped',
    'the bound comes before admit: no token is spent on a dropped key',
  );
  assert.deepEqual(asked, ['a', 'b', 'b']);
  assert.deepEqual(d.flush(), [{ value: 'a2', count: 1 }]);
});

test('with a window of 0 every occurrence is new: nothing is folded', () => {
  const d = new Deduper<string>({ windowMs: 0 });
  assert.deepEqual(
    [0, 0, 0, 1].map((t) => d.add('k', t, () => 'v')),
    ['new', 'new', 'new', 'new'],
  );
  assert.deepEqual(d.flush(), []);
});

test('a clock going backwards loses no occurrence: it folds into the open window', () => {
  const d = new Deduper<string>({ windowMs: 1_000 });
  d.add('k', 5_000, () => 'a');
  assert.equal(
    d.add('k', 4_000, () => 'b'),
    'folded',
  );
  assert.deepEqual(d.due(6_000), [{ value: 'b', count: 1 }]);
});
