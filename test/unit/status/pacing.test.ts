import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { delayUntilNext } from '../../../src/status/pacing.ts';

const O = { minIntervalMs: 1_000, retryMinMs: 500, retryMaxMs: 8_000 };

describe('delayUntilNext', () => {
  const cases = [
    { name: 'the first pass runs at once', last: null, failures: 0, now: 5_000, expected: 0 },
    { name: 'within the interval: waits for the rest of it', last: 5_000, failures: 0, now: 5_300, expected: 700 },
    { name: 'after the interval: at once', last: 5_000, failures: 0, now: 7_000, expected: 0 },
    { name: 'a short backoff does not undercut the interval', last: 5_000, failures: 1, now: 5_000, expected: 1_000 },
    { name: 'a long backoff stretches the gap', last: 5_000, failures: 4, now: 6_000, expected: 3_000 },
  ];
  for (const c of cases) test(c.name, () => assert.equal(delayUntilNext(c.last, c.failures, c.now, O), c.expected));
});
