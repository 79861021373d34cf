import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { COLLECT_GARBAGE_FROM, FirstComputeCollections } from '../../../src/agent/first-compute-collections.ts';
import { silentLogger } from '../../../src/log.ts';
import { diff, EMPTY, Mirror, newCalc, pod, policy, snapshot, world } from '../calc/fixtures.ts';
import { batch, recordingComputes, recordResyncs, setup } from './loop-fixtures.ts';

describe('collections during the first compute', () => {
  test('a full garbage collection runs before a large first full state is computed, a compacting one after its first successful write, never again', async () => {
    const order: string[] = [];
    const calc = recordingComputes(order);
    const { clock, dataplane, r } = setup({ calc, collectGarbage: (compact) => order.push(compact ? 'gc compact' : 'gc'), collectGarbageFrom: 1 });
    recordResyncs(dataplane, order);
    dataplane.failWrites = 1;
    r.onBatch(batch('r1', false));
    await clock.advanceAsync(100);
    r.onBatch(batch('r2'));
    await clock.advanceAsync(1000);
    r.onBatch(batch('r3'));
    await clock.advanceAsync(1000);
    assert.deepEqual(order, ['compute', 'gc', 'compute', 'write', 'write', 'gc compact', 'compute']);
  });

  test('a small first full state is computed and written without a collection', async () => {
    const order: string[] = [];
    const calc = recordingComputes(order);
    const { clock, dataplane, r } = setup({ calc, collectGarbage: () => order.push('gc') });
    recordResyncs(dataplane, order);
    r.onBatch(batch('r1'));
    await clock.advanceAsync(1000);
    assert.deepEqual(order, ['compute', 'write']);
  });

  test('the first full state is computed in slices with a full collection between them, to the dirty state one compute gives', async () => {
    const w = world(
      [pod('ns', 'a', { labels: { app: 'a' } }), pod('ns', 'b', { ip4: 2, labels: { app: 'b' } }), pod('ns', 'c', { ip4: 3, nodeName: 'node-b' })],
      [{ name: 'ns', labels: {} }],
      [policy('ns', 'p', { podSelector: { matchLabels: { app: 'a' } }, ingress: [{ from: [{ podSelector: {} }] }] })],
    );
    const events = diff(EMPTY, w);
    assert.equal(events.length, 5);
    const order: string[] = [];
    const calc = recordingComputes(order);
    const { clock, dataplane, r } = setup({ calc, collectGarbage: (compact) => order.push(compact ? 'gc compact' : 'gc'), firstComputeSlice: 2 });
    // What the real dataplane is told, kept only through dirty reports.
    const mirror = new Mirror();
    dataplane.markDirty = (d) => mirror.update(calc.desired, d);
    r.onBatch({ events: [...events], synced: true, revision: 'r1' });
    await clock.advanceAsync(1000);
    r.onBatch(batch('r2'));
    await clock.advanceAsync(1000);
    assert.deepEqual(order, ['gc', 'compute', 'gc', 'compute', 'gc', 'compute', 'gc compact', 'compute'], 'slices of 2, 2 and 1 events; later batches whole');
    const one = newCalc();
    one.applyEvents(events);
    one.applyEvents(batch('r2').events);
    assert.equal(snapshot(mirror.view(one.desired.topChain)), snapshot(one.desired));
  });
});

describe('FirstComputeCollections alone', () => {
  const collections = (o: { slice?: number; collect?: boolean }) => {
    const ran: boolean[] = [];
    const c = new FirstComputeCollections({
      collectGarbage: o.collect === false ? undefined : (compact) => ran.push(compact),
      firstComputeSlice: o.slice,
      log: silentLogger(),
      clock: { now: () => 0, setTimeout: () => 0, clearTimeout: () => {} },
    });
    return { c, ran };
  };

  test('without a collector the first full state is computed whole, however large', () => {
    const { c } = collections({ collect: false, slice: 2 });
    assert.equal(c.beforeFirstCompute(10 * COLLECT_GARBAGE_FROM), Number.POSITIVE_INFINITY);
  });

  test('a state larger than one slice is sliced and collected even below COLLECT_GARBAGE_FROM; the compacting collection runs once', () => {
    const { c, ran } = collections({ slice: 2 });
    assert.equal(c.beforeFirstCompute(3), 2);
    c.betweenSlices();
    c.afterWrite();
    c.afterWrite();
    assert.deepEqual(ran, [false, false, true]);
  });

  test('a small state that fits one slice is computed whole with no collection, before or after', () => {
    const { c, ran } = collections({ slice: 50_000 });
    assert.equal(c.beforeFirstCompute(COLLECT_GARBAGE_FROM - 1), Number.POSITIVE_INFINITY);
    c.afterWrite();
    assert.deepEqual(ran, []);
  });
});
