import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { RestoreError } from '../../../src/errors.ts';
import { batch, setup } from './loop-fixtures.ts';

describe('health and readiness', () => {
  test('/healthz fails once no write has succeeded for three resync intervals, and recovers with the next success', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000, retryMinMs: 100, retryMaxMs: 400 });
    r.onBatch(batch('r1'));
    await clock.advance(1500);
    assert.deepEqual(r.health(), { healthy: true, reason: 'Ok' });
    dataplane.failWith = () => new RestoreError('iptables-nft-restore', 4, 'line 2 failed', '*filter\n-A cali-x -s 10.9.8.7/32 -j ACCEPT\n');
    dataplane.failWrites = Infinity;
    r.onBatch(batch('r2'));
    const failingFrom = clock.t;
    await clock.advance(3000);
    assert.equal(r.health().healthy, true, 'three intervals have not passed yet');
    await clock.advance(1);
    assert.deepEqual(r.health(), { healthy: false, reason: 'NoWriteSucceeded', error: 'WEIR_RESTORE_FAILED' });
    assert.ok(clock.t - failingFrom > 3000);
    dataplane.failWrites = 0;
    await clock.advance(400);
    assert.deepEqual(r.health(), { healthy: true, reason: 'Ok' });
  });

  test('/healthz fails while a write hangs', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advance(10);
    dataplane.hang = true;
    r.onBatch(batch('r2')); // within the debounce of r1: its write starts 20 ms later, and hangs
    await clock.advance(3000);
    assert.equal(r.health().healthy, true);
    await clock.advance(1);
    assert.deepEqual(r.health(), { healthy: false, reason: 'NoWriteSucceeded' }, 'a write has been owed since the batch came');
    await clock.advance(20);
    assert.deepEqual(r.health(), { healthy: false, reason: 'WriteHung' }, 'and the one write started has run for the whole bound');
  });

  test('/healthz stays ok on an idle node, and before the source is synced', async () => {
    const { clock, r } = setup({ resyncIntervalMs: 0 });
    r.onBatch(batch('r0', false));
    await clock.advance(3_600_000);
    assert.equal(r.health().healthy, true, 'not synced: nothing is owed yet');
    r.onBatch(batch('r1'));
    await clock.advance(3_600_000);
    assert.equal(r.health().healthy, true);
  });

  test('readiness carries codes only, never the text of the error (payload lines, addresses)', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.failWith = () =>
      new RestoreError('iptables-nft-restore', 4, 'Error occurred at line: 2', '*filter\n-A cali-pi-secret -s 10.9.8.7/32 -m comment --comment "cali:x ns/db" -j MARK\nCOMMIT\n');
    dataplane.failWrites = 1;
    r.onBatch(batch('r1'));
    await clock.advance(20);
    const body = JSON.stringify({ ready: r.readiness(), health: r.health() });
    assert.deepEqual(r.readiness(), { ready: false, revision: '', reason: 'ApplyFailed', error: 'WEIR_RESTORE_FAILED' });
    for (const secret of ['10.9.8.7', 'cali-pi-secret', 'ns/db', 'line']) assert.ok(!body.includes(secret), `${secret} in ${body}`);
  });
});
