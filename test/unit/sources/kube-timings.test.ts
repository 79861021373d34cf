import assert from 'node:assert/strict';
import { test } from 'node:test';
import { backoffDelay, DEFAULT_KUBE_TIMINGS } from '../../../src/sources/kube/index.ts';
import { pickBetween } from '../../../src/sources/kube/timings.ts';

const T = { backoffInitialMs: 100, backoffMaxMs: 1000 };

test('backoffDelay doubles per failure, caps at the maximum and jitters between half and all of the step', () => {
  const cases = [
    { name: 'first retry, least jitter', attempt: 1, random: 0, expected: 50 },
    { name: 'first retry, most jitter', attempt: 1, random: 0.999999, expected: 100 },
    { name: 'second retry', attempt: 2, random: 0.5, expected: 150 },
    { name: 'third retry', attempt: 3, random: 0, expected: 200 },
    { name: 'fifth retry reaches the cap', attempt: 5, random: 0, expected: 500 },
    { name: 'far beyond the cap stays capped', attempt: 60, random: 0.999999, expected: 1000 },
    { name: 'attempt 0 is treated as the first', attempt: 0, random: 0, expected: 50 },
  ];
  for (const c of cases)
    assert.equal(
      backoffDelay(c.attempt, T, () => c.random),
      c.expected,
      c.name,
    );
});

test('pickBetween spans the range', () => {
  const cases = [
    { name: 'low end', range: [300, 600] as const, random: 0, expected: 300 },
    { name: 'middle', range: [300, 600] as const, random: 0.5, expected: 450 },
    { name: 'a fixed value', range: [7, 7] as const, random: 0.9, expected: 7 },
  ];
  for (const c of cases)
    assert.equal(
      pickBetween(c.range, () => c.random),
      c.expected,
      c.name,
    );
});

test('the default watchdog outlasts the API server bookmark period and the default watch timeouts are randomised', () => {
  assert.ok(DEFAULT_KUBE_TIMINGS.watchdogMs > 60_000, 'bookmarks come about once a minute');
  assert.ok(DEFAULT_KUBE_TIMINGS.watchTimeoutSeconds[0] < DEFAULT_KUBE_TIMINGS.watchTimeoutSeconds[1]);
  assert.ok(DEFAULT_KUBE_TIMINGS.relistMs[0] < DEFAULT_KUBE_TIMINGS.relistMs[1]);
});
