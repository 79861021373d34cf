import assert from 'node:assert/strict';
import { test } from 'node:test';
import { backoffMs } from '../../src/backoff.ts';

const B = { initialMs: 500, maxMs: 8_000 };

test('backoffMs doubles per attempt from the initial delay and stays at the cap', () => {
  const cases = [
    { name: 'no failure, no delay', attempt: 0, expected: 0 },
    { name: 'negative counts as none', attempt: -3, expected: 0 },
    { name: 'the first retry waits the initial delay', attempt: 1, expected: 500 },
    { name: 'doubles', attempt: 2, expected: 1_000 },
    { name: 'doubles again', attempt: 4, expected: 4_000 },
    { name: 'capped', attempt: 5, expected: 8_000 },
    { name: 'stays capped for huge counts', attempt: 10_000, expected: 8_000 },
  ];
  for (const c of cases) assert.equal(backoffMs(c.attempt, B), c.expected, c.name);
});

test('with jitter, the delay lies between half and all of the step', () => {
  const cases = [
    { name: 'least jitter', attempt: 3, random: 0, expected: 1_000 },
    { name: 'middle', attempt: 3, random: 0.5, expected: 1_500 },
    { name: 'most jitter', attempt: 3, random: 0.999, expected: 1_999 },
    { name: 'capped step', attempt: 99, random: 0, expected: 4_000 },
    { name: 'no failure is no delay, jitter or not', attempt: 0, random: 0.7, expected: 0 },
  ];
  for (const c of cases)
    assert.equal(
      backoffMs(c.attempt, B, () => c.random),
      c.expected,
      c.name,
    );
});
