import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { HookWatch } from '../../../src/agent/hook-watch.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/index.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { batch, counterValue, setup, stopWhileAdvancing } from './loop-fixtures.ts';

describe('the hook check', () => {
  test('a hook found missing is repaired by a resync at once, counted and only then checked again', async () => {
    const { clock, dataplane, metrics, r } = setup({ hookCheckIntervalMs: 5000 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(20);
    await clock.advanceAsync(10_000);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['hookIntact', 5000],
        ['hookIntact', 10_000],
      ],
    );
    dataplane.hook = false;
    await clock.advanceAsync(5000);
    assert.deepEqual(
      dataplane.calls.slice(3).map((c) => [c.kind, c.at]),
      [
        ['hookIntact', 15_000],
        ['resync', 15_000],
      ],
    );
    assert.equal(dataplane.hook, true);
    assert.equal(await counterValue(metrics, 'driftRepairs', { what: 'hook' }), 1);
    await clock.advanceAsync(5000);
    assert.deepEqual(
      dataplane.calls.slice(5).map((c) => [c.kind, c.at]),
      [['hookIntact', 20_000]],
    );
    await r.stop();
  });

  test('under a constant stream of batches, a hook deleted at any moment is repaired within 10 s', async () => {
    for (const deletedAt of [1_000, 7_777, 12_345]) {
      const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 5000, resyncIntervalMs: 30_000 });
      dataplane.writeMs = 5;
      let repairedAt: number | null = null;
      for (let t = 0; t < 30_000; t += 30) {
        if (t === Math.floor(deletedAt / 30) * 30) dataplane.hook = false;
        r.onBatch(batch(`r${t}`, true, `p${t % 300}`));
        await clock.advanceAsync(30);
        if (repairedAt === null && t >= deletedAt && dataplane.hook === true) repairedAt = clock.t;
      }
      assert.ok(repairedAt !== null && repairedAt - deletedAt <= 10_000, `deleted at ${deletedAt}, repaired at ${repairedAt}`);
      await stopWhileAdvancing(clock, r);
    }
  });

  test('a change that arrives when the hook check is due is written first; the check follows at once', async () => {
    const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 5000 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(4990);
    dataplane.writeMs = 20;
    r.onBatch(batch('r2', true, 'p2')); // written 4990-5010, while the check falls due
    await clock.advanceAsync(10);
    r.onBatch(batch('r3', true, 'p3'));
    await clock.advanceAsync(100);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['apply', 4990],
        ['apply', 5010],
        ['hookIntact', 5030],
      ],
    );
    await stopWhileAdvancing(clock, r);
  });

  test('a change that arrives while a hook check runs is written at once, without waiting for the check', async () => {
    const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 5000 });
    dataplane.hookMs = 70;
    r.onBatch(batch('r1'));
    await clock.advanceAsync(5010); // the check fell due at 5000 and runs until 5070
    r.onBatch(batch('r2', true, 'p2'));
    await clock.advanceAsync(100);
    const apply = dataplane.writes('apply')[0];
    const check = dataplane.calls.find((c) => c.kind === 'hookIntact');
    assert.ok(check && apply, `calls: ${JSON.stringify(dataplane.calls)}`);
    assert.ok(apply.at < dataplane.hookChecksDone[0], `the change was written at ${apply.at}, the check ran ${check.at}-${dataplane.hookChecksDone[0]}`);
    assert.equal(apply.at, check.at + 10);
    await stopWhileAdvancing(clock, r);
  });

  test('a hook found missing while a change is written still gets its resync', async () => {
    const { clock, dataplane, metrics, r } = setup({ hookCheckIntervalMs: 5000 });
    dataplane.hookMs = 70;
    r.onBatch(batch('r1'));
    await clock.advanceAsync(4990);
    dataplane.writeMs = 100;
    dataplane.hook = false;
    await clock.advanceAsync(20); // the check starts at 5000 and ends at 5070, inside the write
    r.onBatch(batch('r2', true, 'p2')); // written 5010-5110
    await clock.advanceAsync(300);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['hookIntact', 5000],
        ['apply', 5010],
        ['resync', 5110],
      ],
    );
    assert.equal(dataplane.hook, true);
    assert.equal(await counterValue(metrics, 'driftRepairs', { what: 'hook' }), 1);
    await stopWhileAdvancing(clock, r);
  });

  test('a hook check that fails is answered with a resync', async () => {
    const { clock, dataplane, metrics, r } = setup({ hookCheckIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(20);
    dataplane.hook = 'throw';
    await clock.advanceAsync(1000);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['hookIntact', 1000],
        ['resync', 1000],
      ],
    );
    assert.equal(await counterValue(metrics, 'errors', { reason: 'UNKNOWN' }), 1);
    await r.stop();
  });
});

describe('HookWatch alone', () => {
  function watch(intact: () => Promise<boolean>) {
    const clock = new FakeClock();
    const damage: number[] = [];
    let ended = 0;
    const w = new HookWatch({
      dataplane: { hookIntact: intact },
      log: silentLogger(),
      metrics: createMetrics({ defaultMetrics: false }),
      clock,
      intervalMs: 5000,
      onDamage: (now) => damage.push(now),
      onEnded: () => ended++,
    });
    return { clock, damage, ended: () => ended, w };
  }

  test('no check is due before a resync has written the hook; a pass writing changes puts a due one off by at most an interval', async () => {
    const { w } = watch(async () => true);
    w.startIfDue(60_000, false);
    assert.equal(w.running, false, 'never rearmed');
    w.rearm(0);
    w.startIfDue(4999, false);
    assert.equal(w.running, false, 'not due yet');
    w.startIfDue(9999, true);
    assert.equal(w.running, false, 'put off by a pass that writes changes');
    w.startIfDue(10_000, true);
    assert.equal(w.running, true, 'a whole interval late: it starts anyway');
    await w.whenDone();
  });

  test('an intact hook is due again an interval after its check ends; a missing one owes a resync and is not due until rearmed', async () => {
    let intact = true;
    const { clock, damage, ended, w } = watch(async () => intact);
    w.rearm(0);
    clock.t = 5000;
    w.startIfDue(5000, false);
    assert.equal(w.dueAt, null, 'not due while it runs');
    await w.whenDone();
    assert.equal(w.running, false);
    assert.equal(w.dueAt, 10_000);
    intact = false;
    clock.t = 10_000;
    w.startIfDue(10_000, false);
    await w.whenDone();
    assert.deepEqual(damage, [10_000]);
    assert.equal(w.dueAt, null);
    assert.equal(ended(), 2);
  });
});
