// The reflector's schedule: randomised picks and the retry backoff, with a client that fails
// every list (the list+watch behaviour itself is tested through the kube source, in
// test/unit/sources/kube.test.ts, and through the policy status aggregator).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KubeApiError } from '../../../src/errors.ts';
import type { KubeClient } from '../../../src/kube/client.ts';
import { type Codec, rawRefOf } from '../../../src/kube/collection.ts';
import { createReflector, DEFAULT_LIST_WATCH_TIMINGS, pickBetween } from '../../../src/kube/reflector.ts';
import { silentLogger } from '../../../src/log.ts';
import { rng } from '../../support/rng.ts';

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

const failingClient: KubeClient = {
  send: () => Promise.reject(new KubeApiError('GET', '/x', 500, 'InternalError', 'down')),
  list: () => Promise.reject(new KubeApiError('GET', '/x', 500, 'InternalError', 'down')),
  watch: () => Promise.reject(new KubeApiError('GET', '/x', 500, 'InternalError', 'down')),
  reset: () => {},
  close: () => Promise.resolve(),
};

const codec: Codec<string> = {
  decode: (raw) => ({ key: rawRefOf(raw, false).name, name: rawRefOf(raw, false).name, value: '', warnings: [] }),
  same: (a, b) => a === b,
  ref: (raw) => rawRefOf(raw, false),
};

/** The delays of a reflector's first `n` retries against an API server that fails every list. */
async function retryDelays(random: () => number, n: number): Promise<number[]> {
  const delays: number[] = [];
  const abort = new AbortController();
  const reflector = createReflector(
    { kind: 'Thing', path: '/apis/example.com/v1/things' },
    codec,
    {
      client: failingClient,
      log: silentLogger(),
      timings: DEFAULT_LIST_WATCH_TIMINGS,
      backoff: { initialMs: 1_000, maxMs: 8_000 },
      delay: async (ms) => {
        delays.push(ms);
        if (delays.length >= n) abort.abort();
      },
      random,
      now: () => performance.now(),
      onWatchEvent: () => {},
    },
    { change: () => {}, listed: () => {} },
  );
  await reflector.run(abort.signal);
  return delays;
}

test('a crowd of reflectors failing together spreads its retries out, each between half and all of the backoff step', async () => {
  const crowd = await Promise.all(Array.from({ length: 20 }, (_, i) => retryDelays(rng(i + 1), 3)));
  for (const [attempt, step] of [1_000, 2_000, 4_000].entries()) {
    const delays = crowd.map((d) => d[attempt]);
    for (const d of delays) assert.ok(d >= step / 2 && d <= step, `retry ${attempt + 1}: ${d} ms lies in [${step / 2}, ${step}]`);
    assert.ok(new Set(delays).size >= 15, `retry ${attempt + 1}: the crowd retries at different times (${delays.join(', ')})`);
    assert.ok(Math.max(...delays) - Math.min(...delays) >= step / 4, `retry ${attempt + 1}: spread over at least a quarter of the step`);
  }
});

test('the jitter is the injected one: with random 0 every retry waits half the step, with random near 1 all of it', async () => {
  assert.deepEqual(await retryDelays(() => 0, 4), [500, 1_000, 2_000, 4_000]);
  assert.deepEqual(await retryDelays(() => 0.9999, 5), [1_000, 2_000, 4_000, 8_000, 8_000]);
});
