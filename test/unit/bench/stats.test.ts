import assert from 'node:assert/strict';
import { test } from 'node:test';
import { percentile } from '../../../bench/stats.ts';

const oneTo = (n: number): number[] => Array.from({ length: n }, (_, i) => n - i);

test('p99 of 100 samples is the 99th smallest, not the largest', () => {
  assert.equal(percentile(oneTo(100), 99), 99);
  assert.equal(percentile(oneTo(1000), 99), 990);
});

test('below 100 samples, p99 is the largest', () => {
  assert.equal(percentile(oneTo(60), 99), 60);
});

test('p50 is the lower middle of an even count and the middle of an odd one', () => {
  assert.equal(percentile(oneTo(10), 50), 5);
  assert.equal(percentile(oneTo(11), 50), 6);
});

test('p100 is the largest and a tiny p the smallest', () => {
  assert.equal(percentile(oneTo(7), 100), 7);
  assert.equal(percentile(oneTo(7), 0.001), 1);
});

test('the samples are not reordered, and no samples give NaN', () => {
  const xs = [3, 1, 2];
  assert.equal(percentile(xs, 50), 2);
  assert.deepEqual(xs, [3, 1, 2]);
  assert.ok(Number.isNaN(percentile([], 50)));
});
