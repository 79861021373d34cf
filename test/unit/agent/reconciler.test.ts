import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Reconciler, type Clock, type DataplanePort } from '../../../src/agent/reconciler.ts';
import type { DesiredDataplane, Dirty } from '../../../src/calc/index.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/index.ts';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { newCalc, policy } from '../calc/fixtures.ts';

/** A clock whose timers run only when the test advances time. */
class FakeClock implements Clock {
  t = 0;
  timers: { at: number; fn: () => void; id: number }[] = [];
  #id = 0;
  now() {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number) {
    const id = ++this.#id;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  }
  clearTimeout(h: unknown) {
    this.timers = this.timers.filter((x) => x.id !== h);
  }
  /** Advances time, running due timers and letting their promises settle. */
  async advance(ms: number) {
    const end = this.t + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.timers.shift();
      this.t = next.at;
      next.fn();
      for (let i = 0; i < 20; i++) await Promise.resolve();
    }
    this.t = end;
  }
}

class FakeDataplane implements DataplanePort {
  calls: ('apply' | 'resync')[] = [];
  dirtyMarks = 0;
  failNext = 0;
  markDirty(_d: Dirty) {
    this.dirtyMarks++;
  }
  async apply(_d: DesiredDataplane) {
    return this.#run('apply');
  }
  async resync(_d: DesiredDataplane) {
    return this.#run('resync');
  }
  status() {
    return { sets: 0, chains: 0, rules: 0 };
  }
  #run(kind: 'apply' | 'resync') {
    this.calls.push(kind);
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error('iptables-restore: line 3 failed');
    }
    return {};
  }
}

function setup(resyncIntervalMs = 0) {
  const clock = new FakeClock();
  const dataplane = new FakeDataplane();
  const r = new Reconciler({
    calc: newCalc(),
    dataplane,
    log: silentLogger(),
    metrics: createMetrics({ defaultMetrics: false }),
    debounceMs: 20,
    retryMinMs: 100,
    retryMaxMs: 400,
    resyncIntervalMs,
    clock,
  });
  r.start();
  return { clock, dataplane, r };
}

const batch = (revision: string, synced = true, name = revision): SourceBatch => ({
  events: [{ kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', name, { podSelector: {} }) }],
  synced,
  revision,
});

describe('reconcile loop', () => {
  test('writes nothing before the source has delivered its first full state', async () => {
    const { clock, dataplane, r } = setup();
    r.onBatch(batch('r1', false));
    await clock.advance(1000);
    assert.deepEqual(dataplane.calls, []);
    assert.equal(r.readiness().ready, false);
    r.onBatch(batch('r2', true));
    await clock.advance(1000);
    assert.deepEqual(dataplane.calls, ['resync'], 'the first write reads the kernel back');
    assert.deepEqual(r.readiness(), { ready: true, revision: 'r2', reason: 'kernel holds the latest state' });
  });

  test('a burst inside the debounce window becomes one write', async () => {
    const { clock, dataplane, r } = setup();
    r.onBatch(batch('r1'));
    await clock.advance(100);
    for (let i = 0; i < 10; i++) r.onBatch(batch(`b${i}`));
    await clock.advance(100);
    assert.deepEqual(dataplane.calls, ['resync', 'apply']);
    assert.equal(r.readiness().revision, 'b9');
  });

  test('a failed write is retried with doubling backoff, as a resync, and readiness says why', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.failNext = 3;
    r.onBatch(batch('r1'));
    await clock.advance(20);
    assert.equal(dataplane.calls.length, 1);
    assert.match(r.readiness().reason, /last apply failed: iptables-restore: line 3 failed/);
    await clock.advance(99);
    assert.equal(dataplane.calls.length, 1, 'not before the first backoff of 100 ms');
    await clock.advance(1);
    assert.equal(dataplane.calls.length, 2);
    await clock.advance(200);
    assert.equal(dataplane.calls.length, 3, 'second backoff 200 ms');
    await clock.advance(400);
    assert.equal(dataplane.calls.length, 4, 'capped at 400 ms');
    assert.deepEqual(dataplane.calls, ['resync', 'resync', 'resync', 'resync']);
    assert.equal(r.readiness().ready, true);
  });

  test('the resync timer reads the kernel back periodically', async () => {
    const { clock, dataplane, r } = setup(1000);
    r.onBatch(batch('r1'));
    await clock.advance(20);
    await clock.advance(2000);
    assert.deepEqual(dataplane.calls, ['resync', 'resync', 'resync']);
    await r.stop();
  });
});
