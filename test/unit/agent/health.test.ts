import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DEFAULT_UNHEALTHY_AFTER_MS, unhealthyAfterMs, WriteHealth } from '../../../src/agent/health.ts';
import { RestoreError } from '../../../src/errors.ts';
import { batch, setup } from './loop-fixtures.ts';

describe('health and readiness', () => {
  test('/healthz fails once no write has succeeded for three resync intervals, and recovers with the next success', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000, retryMinMs: 100, retryMaxMs: 400 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(1500);
    assert.deepEqual(r.health(), { healthy: true, reason: 'Ok' });
    dataplane.failWith = () => new RestoreError('iptables-nft-restore', 4, 'line 2 failed', '*filter\n-A cali-x -s 10.9.8.7/32 -j ACCEPT\n');
    dataplane.failWrites = Infinity;
    r.onBatch(batch('r2'));
    const failingFrom = clock.t;
    await clock.advanceAsync(3000);
    assert.equal(r.health().healthy, true, 'three intervals have not passed yet');
    await clock.advanceAsync(1);
    assert.deepEqual(r.health(), { healthy: false, reason: 'NoWriteSucceeded', error: 'WEIR_RESTORE_FAILED' });
    assert.ok(clock.t - failingFrom > 3000);
    dataplane.failWrites = 0;
    await clock.advanceAsync(400);
    assert.deepEqual(r.health(), { healthy: true, reason: 'Ok' });
  });

  test('/healthz fails while a write hangs', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(10);
    dataplane.hang = true;
    r.onBatch(batch('r2')); // within the debounce of r1: its write starts 20 ms later, and hangs
    await clock.advanceAsync(3000);
    assert.equal(r.health().healthy, true);
    await clock.advanceAsync(1);
    assert.deepEqual(r.health(), { healthy: false, reason: 'NoWriteSucceeded' }, 'a write has been owed since the batch came');
    await clock.advanceAsync(20);
    assert.deepEqual(r.health(), { healthy: false, reason: 'WriteHung' }, 'and the one write started has run for the whole bound');
  });

  test('/healthz stays ok on an idle node, and before the source is synced', async () => {
    const { clock, r } = setup({ resyncIntervalMs: 0 });
    r.onBatch(batch('r0', false));
    await clock.advanceAsync(3_600_000);
    assert.equal(r.health().healthy, true, 'not synced: nothing is owed yet');
    r.onBatch(batch('r1'));
    await clock.advanceAsync(3_600_000);
    assert.equal(r.health().healthy, true);
  });

  test('readiness carries codes only, never the text of the error (payload lines, addresses)', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.failWith = () =>
      new RestoreError('iptables-nft-restore', 4, 'Error occurred at line: 2', '*filter\n-A cali-pi-secret -s 10.9.8.7/32 -m comment --comment "cali:x ns/db" -j MARK\nCOMMIT\n');
    dataplane.failWrites = 1;
    r.onBatch(batch('r1'));
    await clock.advanceAsync(20);
    const body = JSON.stringify({ ready: r.readiness(), health: r.health() });
    assert.deepEqual(r.readiness(), { ready: false, revision: '', reason: 'ApplyFailed', error: 'WEIR_RESTORE_FAILED' });
    for (const secret of ['10.9.8.7', 'cali-pi-secret', 'ns/db', 'line']) assert.ok(!body.includes(secret), `${secret} in ${body}`);
  });
});

describe('WriteHealth alone', () => {
  test('the bound is three resync intervals, or the default with the resync off, unless one is given', () => {
    assert.equal(unhealthyAfterMs(1000), 3000);
    assert.equal(unhealthyAfterMs(0), DEFAULT_UNHEALTHY_AFTER_MS);
    assert.equal(unhealthyAfterMs(1000, 42), 42);
  });

  test('a write owed stays owed from the first moment it was wanted, until one succeeds', () => {
    const h = new WriteHealth(1000);
    h.owe(0);
    h.owe(500);
    h.started(600);
    h.failed({ code: 'WEIR_RESTORE_FAILED', message: 'line 2 failed' });
    assert.equal(h.health(1000).healthy, true);
    assert.deepEqual(h.health(1001), { healthy: false, reason: 'NoWriteSucceeded', error: 'WEIR_RESTORE_FAILED' });
    h.succeeded();
    assert.deepEqual(h.health(10_000), { healthy: true, reason: 'Ok' });
    assert.equal(h.lastError, null);
  });

  test('readiness says NotSynced before ApplyFailed, and ApplyFailed before ChangesPending', () => {
    const h = new WriteHealth(1000);
    h.failed({ code: 'E', message: 'm' });
    assert.equal(h.readiness({ synced: false, revision: 'r1', pending: true }).reason, 'NotSynced');
    assert.equal(h.readiness({ synced: true, revision: 'r1', pending: true }).reason, 'ApplyFailed');
    h.succeeded();
    assert.equal(h.readiness({ synced: true, revision: 'r1', pending: true }).reason, 'ChangesPending');
    assert.deepEqual(h.readiness({ synced: true, revision: 'r1', pending: false }), { ready: true, revision: 'r1', reason: 'Ready' });
  });
});
