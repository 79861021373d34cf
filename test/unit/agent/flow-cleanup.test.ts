import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { FlowCleanup, FORGET_ATTEMPTS } from '../../../src/agent/flow-cleanup.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/index.ts';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { pod } from '../calc/fixtures.ts';
import { batch, setup } from './loop-fixtures.ts';

describe("deleting released addresses' tracked connections", () => {
  test("a local pod's released addresses have their tracked flows deleted after the write that stops dispatching them; a failure retries after the next write", async () => {
    const { clock, dataplane, r } = setup();
    const gone = pod('ns', 'gone', { ip4: 5 });
    const podBatch = (revision: string, events: SourceBatch['events']): SourceBatch => ({ events, synced: true, revision });
    r.onBatch(podBatch('r1', [{ kind: 'Pod', op: 'upsert', object: gone }]));
    await clock.advanceAsync(100);
    assert.deepEqual(dataplane.forgotten, [], 'a new pod releases nothing');
    const order: string[] = [];
    for (const step of ['apply', 'forgetFlows'] as const) {
      const real = dataplane[step].bind(dataplane) as (...a: unknown[]) => Promise<unknown>;
      (dataplane as unknown as Record<string, unknown>)[step] = (...a: unknown[]) => {
        order.push(step);
        return real(...a);
      };
    }
    dataplane.failForgets = 1;
    r.onBatch(podBatch('r2', [{ kind: 'Pod', op: 'delete', uid: gone.uid }]));
    await clock.advanceAsync(100);
    assert.deepEqual(dataplane.forgotten, [], 'the first attempt failed');
    r.onBatch(batch('r3'));
    await clock.advanceAsync(100);
    assert.deepEqual(order, ['apply', 'forgetFlows', 'apply', 'forgetFlows'], 'each attempt follows a write');
    assert.deepEqual(dataplane.forgotten, [['10.244.1.5', 'fd00::5']]);
    // A conntrack that keeps failing is given up on after FORGET_ATTEMPTS writes.
    order.length = 0;
    dataplane.failForgets = FORGET_ATTEMPTS + 1;
    r.onBatch(podBatch('r4', [{ kind: 'Pod', op: 'upsert', object: gone }]));
    await clock.advanceAsync(100);
    r.onBatch(podBatch('r5', [{ kind: 'Pod', op: 'delete', uid: gone.uid }]));
    for (let i = 0; i < FORGET_ATTEMPTS + 1; i++) {
      await clock.advanceAsync(100);
      r.onBatch(batch(`r${6 + i}`, true, `p${i}`));
    }
    await clock.advanceAsync(100);
    assert.equal(order.filter((s) => s === 'forgetFlows').length, FORGET_ATTEMPTS);
  });

  test("deleting a released address's tracked connections runs beside the loop: the next change is written without waiting for it", async () => {
    const { clock, dataplane, r } = setup();
    const gone = pod('ns', 'gone', { ip4: 5, ip6: false });
    const later = pod('ns', 'later', { ip4: 6, ip6: false });
    r.onBatch({ events: [{ kind: 'Pod', op: 'upsert', object: gone }], synced: true, revision: 'r1' });
    await clock.advanceAsync(100);
    dataplane.forgetMs = 1_000;
    r.onBatch({ events: [{ kind: 'Pod', op: 'delete', uid: gone.uid }], synced: true, revision: 'r2' });
    await clock.advanceAsync(100);
    const writesBefore = dataplane.writes().length;
    r.onBatch({ events: [{ kind: 'Pod', op: 'upsert', object: later }], synced: true, revision: 'r3' });
    await clock.advanceAsync(100);
    assert.equal(dataplane.writes().length, writesBefore + 1, 'the change was written while the deletion ran');
    assert.deepEqual(dataplane.forgotten, [], 'the deletion is still running');
    await clock.advanceAsync(1_000);
    assert.deepEqual(dataplane.forgotten, [['10.244.1.5']]);
    await r.whenIdle();
  });
});

describe('FlowCleanup alone', () => {
  /** A forgetter whose rounds end when the test says. */
  function cleanup() {
    const rounds: { addresses: string[]; end: (ok: boolean) => void }[] = [];
    const c = new FlowCleanup({
      dataplane: {
        forgetFlows: (addresses) =>
          new Promise<number>((resolve, reject) => rounds.push({ addresses: [...addresses], end: (ok) => (ok ? resolve(addresses.length) : reject(new Error('conntrack: boom'))) })),
      },
      log: silentLogger(),
      metrics: createMetrics({ defaultMetrics: false }),
      clock: new FakeClock(),
      onEnded: () => {},
    });
    return { c, rounds };
  }

  test('addresses added while a round runs go in the next one, started as soon as it succeeds', async () => {
    const { c, rounds } = cleanup();
    c.add(['10.0.0.1']);
    c.start();
    c.add(['10.0.0.2']);
    c.start();
    assert.deepEqual(
      rounds.map((r) => r.addresses),
      [['10.0.0.1']],
      'one round at a time',
    );
    rounds[0].end(true);
    await c.whenDone();
    assert.deepEqual(
      rounds.map((r) => r.addresses),
      [['10.0.0.1'], ['10.0.0.2']],
    );
    rounds[1].end(true);
    await c.whenDone();
    assert.equal(c.running, false);
  });

  test('a failed round waits for the next start; after stop() none starts', async () => {
    const { c, rounds } = cleanup();
    c.add(['10.0.0.1']);
    c.start();
    rounds[0].end(false);
    await c.whenDone();
    assert.equal(rounds.length, 1, 'no retry on its own');
    c.stop();
    c.start();
    assert.equal(rounds.length, 1);
    assert.equal(c.running, false);
  });
});
