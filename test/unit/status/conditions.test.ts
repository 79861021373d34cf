import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { conditionsKey, mergeConditions, microTime, parseConditions, rfc3339, truncate } from '../../../src/status/conditions.ts';
import type { Condition, ConditionSpec } from '../../../src/status/conditions.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const T1 = T0 + 90_500;
const ready = (status: 'True' | 'False' | 'Unknown', reason = 'Synced', message = 'm'): ConditionSpec => ({ type: 'Ready', status, reason, message });
const old = (status: 'True' | 'False' | 'Unknown', at: string, type = 'Ready'): Condition => ({ type, status, lastTransitionTime: at, reason: 'Old', message: 'old' });

describe('timestamps', () => {
  test('metav1.Time has second precision and a Z suffix', () => {
    assert.equal(rfc3339(T0 + 999), '2025-06-01T12:00:00Z');
    assert.equal(rfc3339(T1), '2025-06-01T12:01:30Z');
  });
  test('metav1.MicroTime has six fractional digits, and reads back to the same millisecond', () => {
    assert.equal(microTime(T0 + 123), '2025-06-01T12:00:00.123000Z');
    assert.equal(Date.parse(microTime(T0 + 123)), T0 + 123);
  });
});

describe('mergeConditions', () => {
  const cases: { name: string; previous: Condition[] | undefined; next: ConditionSpec[]; expectedTimes: string[] }[] = [
    { name: 'no previous condition: the transition is now', previous: undefined, next: [ready('True')], expectedTimes: ['2025-06-01T12:01:30Z'] },
    {
      name: 'same status: keeps the previous lastTransitionTime even when reason and message change',
      previous: [old('True', '2025-01-01T00:00:00Z')],
      next: [ready('True', 'Other', 'other message')],
      expectedTimes: ['2025-01-01T00:00:00Z'],
    },
    { name: 'status changed: the transition is now', previous: [old('True', '2025-01-01T00:00:00Z')], next: [ready('False')], expectedTimes: ['2025-06-01T12:01:30Z'] },
    { name: 'Unknown to True is a transition', previous: [old('Unknown', '2025-01-01T00:00:00Z')], next: [ready('True')], expectedTimes: ['2025-06-01T12:01:30Z'] },
    {
      name: 'a previous condition of another type does not carry over',
      previous: [old('True', '2025-01-01T00:00:00Z', 'Programmed')],
      next: [ready('True')],
      expectedTimes: ['2025-06-01T12:01:30Z'],
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const got = mergeConditions(c.previous, c.next, T1);
      assert.deepEqual(
        got.map((x) => x.lastTransitionTime),
        c.expectedTimes,
      );
      assert.deepEqual(
        got.map((x) => [x.type, x.status, x.reason, x.message]),
        c.next.map((x) => [x.type, x.status, x.reason, x.message]),
      );
    });
  }

  test('writes keys in metav1.Condition order, observedGeneration only when given', () => {
    assert.equal(
      JSON.stringify(mergeConditions(undefined, [ready('True')], T0, 7)),
      '[{"type":"Ready","status":"True","observedGeneration":7,"lastTransitionTime":"2025-06-01T12:00:00Z","reason":"Synced","message":"m"}]',
    );
    assert.equal(Object.hasOwn(mergeConditions(undefined, [ready('True')], T0)[0], 'observedGeneration'), false);
  });

  test('cuts messages to the 32768 characters metav1.Condition allows', () => {
    const [c] = mergeConditions(undefined, [ready('False', 'ApplyFailed', 'x'.repeat(40_000))], T0);
    assert.equal(c.message.length, 32768);
    assert.match(c.message, /\(truncated\)$/);
    assert.equal(truncate('short', 10), 'short');
  });
});

describe('parseConditions and conditionsKey', () => {
  test('reads well-formed conditions back and drops malformed ones', () => {
    const raw = [
      { type: 'Ready', status: 'True', lastTransitionTime: '2025-01-01T00:00:00Z', reason: 'Synced', message: 'ok', observedGeneration: 3 },
      { type: 'Bad', status: 'Maybe', lastTransitionTime: 'x', reason: 'R', message: '' },
      { status: 'True' },
      'nonsense',
    ];
    assert.deepEqual(parseConditions(raw), [raw[0]]);
    assert.deepEqual(parseConditions('nope'), []);
  });
  test('the key ignores order but not content', () => {
    const a = old('True', '2025-01-01T00:00:00Z', 'A');
    const b = old('False', '2025-01-01T00:00:00Z', 'B');
    assert.equal(conditionsKey([a, b]), conditionsKey([b, a]));
    assert.notEqual(conditionsKey([a, b]), conditionsKey([a, { ...b, message: 'changed' }]));
  });
});
