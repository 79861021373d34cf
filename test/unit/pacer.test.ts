import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createPacer } from '../../src/pacer.ts';
import type { PassResult } from '../../src/pacer.ts';
import { FakeClock } from '../support/fake-clock.ts';

const O = { minIntervalMs: 1_000, retryMinMs: 500, retryMaxMs: 8_000 };

describe('createPacer', () => {
  function setup(script: ('ok' | 'skipped' | 'fail')[]) {
    const clock = new FakeClock(0);
    const starts: number[] = [];
    const results: PassResult[] = [];
    let i = 0;
    const pacer = createPacer({
      clock,
      ...O,
      run: async () => {
        starts.push(clock.now());
        const step = script[i++] ?? 'ok';
        if (step === 'fail') throw new Error('refused');
        return step;
      },
      onResult: (r) => results.push(r),
    });
    const advance = (ms: number) => clock.advanceAsync(ms);
    return { clock, pacer, starts, results, advance };
  }

  test('poke returns before the pass runs; the pass runs on the next timer', async () => {
    const { pacer, starts, advance } = setup([]);
    pacer.poke();
    assert.deepEqual(starts, []);
    await advance(0);
    assert.deepEqual(starts, [0]);
  });

  test('many pokes within the interval make one more pass, at the end of the interval', async () => {
    const { pacer, starts, results, advance } = setup([]);
    pacer.poke();
    await advance(0);
    for (let k = 0; k < 50; k++) pacer.poke();
    await advance(999);
    assert.deepEqual(starts, [0]);
    await advance(1);
    assert.deepEqual(starts, [0, 1_000]);
    await advance(10_000);
    assert.deepEqual(starts, [0, 1_000], 'no poke, no pass');
    assert.deepEqual(results, ['ok', 'ok']);
  });

  test('failures retry on their own with growing delays, and success resets them', async () => {
    const { pacer, starts, results, advance } = setup(['fail', 'fail', 'fail', 'fail', 'fail', 'ok', 'ok']);
    pacer.poke();
    await advance(16_000);
    assert.deepEqual(starts, [0, 1_000, 2_000, 4_000, 8_000, 16_000]);
    assert.deepEqual(results, ['error', 'error', 'error', 'error', 'error', 'ok']);
    assert.equal(pacer.failures(), 0);
    pacer.poke();
    await advance(1_000);
    assert.equal(starts.at(-1), 17_000, 'after a success the plain interval applies again');
  });

  test('a poke with a delay waits that long; an earlier poke wins', async () => {
    const { pacer, starts, advance } = setup([]);
    pacer.poke(5_000);
    await advance(100);
    pacer.poke(300);
    pacer.poke(4_000);
    await advance(299);
    assert.deepEqual(starts, []);
    await advance(1);
    assert.deepEqual(starts, [400]);
    await advance(10_000);
    assert.deepEqual(starts, [400], 'the later requests were served by that pass');
  });

  test('after a failure, pokes do not cut the backoff short; it runs from the end of the failed pass', async () => {
    const clock = new FakeClock(0);
    const starts: number[] = [];
    let calls = 0;
    const pacer = createPacer({
      clock,
      minIntervalMs: 0,
      retryMinMs: 1_000,
      retryMaxMs: 8_000,
      run: async () => {
        starts.push(clock.now());
        // Each pass takes 50 ms of the clock; the first two fail.
        await new Promise<void>((resolve) => clock.setTimeout(resolve, 50));
        if (++calls <= 2) throw new Error('refused');
        return 'ok';
      },
      onResult: () => {},
    });
    const advance = (ms: number) => clock.advanceAsync(ms);
    pacer.poke();
    for (let t = 0; t < 4_000; t += 10) {
      pacer.poke();
      await advance(10);
    }
    assert.deepEqual(starts.slice(0, 3), [0, 1_050, 3_100]);
  });

  test('stop cancels the pending pass', async () => {
    const { clock, pacer, starts, advance } = setup([]);
    pacer.poke();
    await pacer.stop();
    await advance(5_000);
    assert.deepEqual(starts, []);
    assert.equal(clock.pending(), 0);
    pacer.poke();
    assert.equal(clock.pending(), 0, 'a stopped pacer schedules nothing');
  });
});
