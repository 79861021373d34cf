// The node's cap on audit lines (src/audit/cap.ts): a token bucket the caller gives the time.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { TokenBucket } from '../../../src/audit/cap.ts';

const takes = (b: TokenBucket, n: number, now: number) => Array.from({ length: n }, () => b.take(now)).filter(Boolean).length;

test('full at the start: a burst is taken at once, then nothing until tokens come back at the rate', () => {
  const b = new TokenBucket(10, 20, 5_000);
  assert.equal(takes(b, 25, 5_000), 20);
  assert.equal(b.take(5_050), false, 'half a token is not one');
  assert.equal(b.take(5_100), true);
  assert.equal(takes(b, 10, 6_000), 9);
});

test('tokens come back up to the burst, no more, however long it was quiet', () => {
  const b = new TokenBucket(10, 20, 0);
  takes(b, 20, 0);
  assert.equal(takes(b, 100, 3_600_000), 20);
});

test('a clock that goes back refills nothing, and refills again from where it went', () => {
  const b = new TokenBucket(10, 20, 10_000);
  takes(b, 20, 10_000);
  assert.equal(takes(b, 5, 4_000), 0);
  assert.equal(takes(b, 5, 4_200), 2);
});

test('a rate of 0, or a burst below one token, is refused', () => {
  assert.throws(() => new TokenBucket(0, 1, 0), /rate above 0/);
  assert.throws(() => new TokenBucket(1, 0.5, 0), /burst of at least 1/);
});
