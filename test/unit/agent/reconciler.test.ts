import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { FULL_READ_EVERY } from '../../../src/agent/reconciler.ts';
import { pino } from 'pino';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { newCalc, policy } from '../calc/fixtures.ts';
import { batch, counterValue, setup, stopWhileAdvancing } from './loop-fixtures.ts';

describe('reconcile loop', () => {
  test("a compute is logged with the loop thread's CPU time beside its wall time", async () => {
    const lines: { msg: string; ms?: number; cpuMs?: number }[] = [];
    let cpu = 10;
    const { clock, r } = setup({
      log: pino({ level: 'debug' }, { write: (l: string) => void lines.push(JSON.parse(l)) }),
      // Each read moves 2.5 ms on: the compute reads it once before and once after.
      threadCpuMs: () => (cpu += 2.5),
    });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    const computed = lines.filter((l) => l.msg === 'model updated');
    assert.equal(computed.length, 1);
    assert.equal(computed[0].cpuMs, 2.5);
    assert.equal(computed[0].ms, 0, 'the fake clock did not move');
  });

  test('a batch lets go of each event as calc takes it, so compiled raw policies need not stay alive through the compute', async () => {
    const calc = newCalc();
    const events = ['a', 'b', 'c'].map((name) => ({ kind: 'NetworkPolicy' as const, op: 'upsert' as const, object: policy('ns', name, { podSelector: {} }) }));
    const b: SourceBatch = { events: [...events], synced: true, revision: 'r1' };
    const held: number[] = [];
    const applyEvents = calc.applyEvents.bind(calc);
    calc.applyEvents = (taken) =>
      applyEvents(
        (function* () {
          for (const e of taken) {
            yield e;
            held.push(b.events.filter((x) => x !== undefined).length);
          }
        })(),
      );
    const { clock, metrics, r } = setup({ calc });
    r.onBatch(b);
    await clock.advanceAsync(100);
    assert.deepEqual(held, [2, 1, 0], 'events still held by the batch after each one was taken');
    assert.equal(b.events.length, 0);
    assert.equal(calc.cluster.policies.size, 3);
    assert.equal((await metrics.sourceEvents.get()).values.find((v) => v.labels.kind === 'NetworkPolicy')?.value, 3);
  });

  test('a first batch of 500k policies is computed and written (no call passes the engine limit on arguments)', async () => {
    const lines: { level: number; msg: string }[] = [];
    const calc = newCalc();
    // Compiling 500k policies takes seconds: the report calc gives after them is what matters.
    calc.takePolicyChanges = () => Array.from({ length: 500_000 }, (_, i) => ({ key: `ns/p${i}`, policy: null }));
    const { clock, dataplane, r } = setup({ calc, log: pino({ level: 'debug' }, { write: (l: string) => void lines.push(JSON.parse(l)) }) });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    assert.deepEqual(
      lines.filter((l) => l.level >= 40).map((l) => l.msg),
      [],
    );
    assert.equal(lines.filter((l) => l.msg === 'model updated').length, 1);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync'],
    );
  });

  test('writes nothing before the source has delivered its first full state', async () => {
    const { clock, dataplane, r } = setup();
    r.onBatch(batch('r1', false));
    await clock.advanceAsync(1000);
    assert.deepEqual(dataplane.writes(), []);
    assert.equal(r.readiness().ready, false);
    assert.equal(r.readiness().reason, 'NotSynced');
    r.onBatch(batch('r2', true));
    await clock.advanceAsync(1000);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync'],
      'the first write reads the kernel back',
    );
    assert.deepEqual(r.readiness(), { ready: true, revision: 'r2', reason: 'Ready' });
  });

  test('a burst inside the debounce window becomes one write', async () => {
    const { clock, dataplane, r } = setup();
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    for (let i = 0; i < 10; i++) r.onBatch(batch(`b${i}`));
    await clock.advanceAsync(100);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'apply'],
    );
    assert.equal(r.readiness().revision, 'b9');
  });

  test('a batch after a quiet spell is written at once; batches right after it, or during a write, wait and coalesce', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.writeMs = 30;
    r.onBatch(batch('r1'));
    await clock.advanceAsync(0);
    assert.deepEqual(
      dataplane.writes().map((c) => c.at),
      [0],
      'no debounce on the first batch',
    );
    for (const t of [5, 10, 15]) {
      await clock.advanceAsync(t - clock.t);
      r.onBatch(batch(`b${t}`));
    }
    await clock.advanceAsync(200);
    assert.deepEqual(
      dataplane.writes().map((c) => c.at),
      [0, 30],
      'the three batches during the first write are one write, when it ends (20 ms after the first of them had passed)',
    );
    assert.equal(r.readiness().revision, 'b15');
    await clock.advanceAsync(1000 - clock.t);
    r.onBatch(batch('late'));
    await clock.advanceAsync(0);
    assert.deepEqual(dataplane.writes().at(-1)?.at, 1000, 'quiet again: at once');
  });

  test('what a layered write left is tidied once the node has been quiet for tidyDelayMs; each change pushes the tidy back', async () => {
    const { clock, dataplane, metrics, r } = setup({ tidyDelayMs: 500 });
    dataplane.layers = true;
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    r.onBatch(batch('r2', true, 'p2'));
    await clock.advanceAsync(0);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'apply'],
    );
    await clock.advanceAsync(400);
    r.onBatch(batch('r3', true, 'p3'));
    await clock.advanceAsync(0);
    await clock.advanceAsync(499);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'apply', 'apply'],
      'no tidy within 500 ms of a write',
    );
    await clock.advanceAsync(1);
    assert.deepEqual(
      dataplane.writes().map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['apply', 100],
        ['apply', 500],
        ['tidy', 1000],
      ],
    );
    assert.equal(dataplane.tidyPending, 0);
    const counts = (await metrics.applyDuration.get()).values.filter((v) => v.metricName === 'weir_dataplane_apply_duration_seconds_count');
    assert.deepEqual(Object.fromEntries(counts.map((v) => [v.labels.step, v.value])), { resync: 1, total: 2, tidy: 1 }, 'the tidy is timed apart from changes');
    await clock.advanceAsync(5000);
    assert.equal(dataplane.writes().length, 4, 'nothing owed: no more writes');
    assert.deepEqual(r.readiness(), { ready: true, revision: 'r3', reason: 'Ready' });
  });

  test(`periodic resyncs read set sizes only, but every ${FULL_READ_EVERY}th reads every member; a resync after a failure reads all`, async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(0);
    await clock.advanceAsync(FULL_READ_EVERY * 1000);
    assert.deepEqual(dataplane.resyncReads, ['all', ...Array(FULL_READ_EVERY - 1).fill('counts'), 'all']);
    dataplane.failWrites = 1;
    r.onBatch(batch('r2', true, 'p2'));
    await clock.advanceAsync(0);
    await clock.advanceAsync(100);
    assert.deepEqual(dataplane.resyncReads.slice(-1), ['all'], 'the retry after the failed write');
    await stopWhileAdvancing(clock, r);
  });

  test('a failed write is retried with doubling backoff, as a resync, and readiness says why', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.failWrites = 3;
    r.onBatch(batch('r1'));
    await clock.advanceAsync(0);
    assert.equal(dataplane.writes().length, 1, 'a batch after a quiet spell is written at once');
    assert.deepEqual(r.readiness(), { ready: false, revision: '', reason: 'ApplyFailed', error: 'UNKNOWN' });
    await clock.advanceAsync(99);
    assert.equal(dataplane.writes().length, 1, 'not before the first backoff of 100 ms');
    await clock.advanceAsync(1);
    assert.equal(dataplane.writes().length, 2);
    await clock.advanceAsync(200);
    assert.equal(dataplane.writes().length, 3, 'second backoff 200 ms');
    await clock.advanceAsync(400);
    assert.equal(dataplane.writes().length, 4, 'capped at 400 ms');
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'resync', 'resync', 'resync'],
    );
    assert.equal(r.readiness().ready, true);
  });

  test('the periodic resync reads the kernel back', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(2000);
    assert.deepEqual(
      dataplane.writes().map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['resync', 1000],
        ['resync', 2000],
      ],
    );
    await r.stop();
  });
});

describe('what each pass tells the reporters', () => {
  test('onPass says whether the model changed: true after source events, false for a periodic resync that carried none', async () => {
    const passes: boolean[] = [];
    const { clock, r } = setup({ resyncIntervalMs: 1000, onPass: (o) => passes.push(o.modelChanged) });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(20);
    await clock.advanceAsync(2000);
    r.onBatch(batch('r2'));
    await clock.advanceAsync(20);
    assert.deepEqual(passes, [true, false, false, true]);
    await r.stop();
  });
});

describe('backoff while events keep arriving', () => {
  // The case of the issue: every write fails, and a batch arrives every 30 ms, also while a
  // write runs. Each batch asks for a pass; none may cut the backoff short.
  test('with every write failing and a batch every 30 ms for 3 s, writes are spaced by the backoff', async () => {
    const { clock, dataplane, r } = setup({ retryMinMs: 1000, retryMaxMs: 10_000 });
    dataplane.failWrites = Infinity;
    dataplane.writeMs = 25; // so that batches also arrive while a write runs
    for (let t = 0; t < 3000; t += 30) {
      r.onBatch(batch(`r${t}`, true, `p${t}`));
      await clock.advanceAsync(30);
    }
    const starts = dataplane.writes().map((c) => c.at);
    assert.deepEqual(starts, [0, 1025], 'the first write at once, the next one backoff (1 s) after its end');
    await clock.advanceAsync(100);
    assert.deepEqual(
      dataplane.writes().map((c) => c.at),
      [0, 1025, 3050],
      'then 2 s after the second',
    );
    await stopWhileAdvancing(clock, r);
  });

  test('stop() cancels every timer: no pass, retry, resync or hook check runs after it', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000, hookCheckIntervalMs: 500, retryMinMs: 1000 });
    await r.start();
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    dataplane.failWrites = Infinity;
    dataplane.writeMs = 50;
    r.onBatch(batch('r2'));
    await clock.advanceAsync(65); // the write runs from 120 to 170
    r.onBatch(batch('r3')); // asks for a pass at 185, while the write still runs
    await clock.advanceAsync(5); // the write has failed: a retry is due at 1170
    await stopWhileAdvancing(clock, r);
    assert.equal(clock.pending(), 0, 'no timer left');
    const calls = dataplane.calls.length;
    r.onBatch(batch('r4'));
    await clock.advanceAsync(60_000);
    assert.equal(dataplane.calls.length, calls, 'nothing ran after stop()');
    assert.equal(clock.pending(), 0);
  });
});

describe('the start-up guard', () => {
  test('start() runs the guard once and nothing else is written before the source is synced; the hook is not checked before', async () => {
    const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 1000, resyncIntervalMs: 1000 });
    dataplane.guardDoes = true;
    await r.start();
    r.onBatch(batch('r0', false));
    await clock.advanceAsync(60_000);
    assert.deepEqual(
      dataplane.calls.map((c) => c.kind),
      ['guard'],
    );
    r.onBatch(batch('r1'));
    await clock.advanceAsync(20);
    assert.deepEqual(
      dataplane.calls.map((c) => c.kind),
      ['guard', 'resync'],
    );
    await r.stop();
  });

  test('a guard that fails is logged and does not stop the loop', async () => {
    const { clock, dataplane, metrics, r } = setup();
    dataplane.guardDoes = 'throw';
    await r.start();
    r.onBatch(batch('r1'));
    await clock.advanceAsync(20);
    assert.deepEqual(
      dataplane.calls.map((c) => c.kind),
      ['guard', 'resync'],
    );
    assert.equal(r.readiness().ready, true);
    assert.equal(await counterValue(metrics, 'errors', { reason: 'UNKNOWN' }), 1);
  });
});
