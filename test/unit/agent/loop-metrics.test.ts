import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_UNAPPLIED } from '../../../src/agent/loop-metrics.ts';
import { policy } from '../calc/fixtures.ts';
import { batch, setup } from './loop-fixtures.ts';

describe('what the loop measures', () => {
  test('the policy gauges come from counts calc keeps, valid and invalid', async () => {
    const { clock, metrics, r } = setup();
    r.onBatch({
      events: [
        { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'good', { podSelector: {} }) },
        { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'bad', { podSelector: {}, policyTypes: ['Sideways'] }) },
      ],
      synced: true,
      revision: 'r1',
    });
    await clock.advance(20);
    const got = (await metrics.policies.get()).values.map((v) => [v.labels.state, v.value]);
    assert.deepEqual(got.sort(), [
      ['invalid', 1],
      ['valid', 1],
    ]);
    await r.stop();
  });

  test('while writes fail, the arrival times kept for the latency histogram stay bounded', async () => {
    const { clock, dataplane, metrics, r } = setup({ retryMinMs: 1000, retryMaxMs: 1000 });
    dataplane.failWrites = Infinity;
    r.onBatch(batch('r0', true, 'p'));
    await clock.advance(20);
    const n = 5 * MAX_UNAPPLIED;
    for (let i = 1; i <= n; i++) {
      r.onBatch(batch(`r${i}`, true, 'p'));
      if (i % 500 === 0) await clock.advance(1000);
    }
    dataplane.failWrites = 0;
    await clock.advance(2000);
    assert.equal(r.readiness().ready, true);
    const got = await metrics.enforceLatency.get();
    const count = got.values.find((v) => v.metricName === 'weir_event_to_enforced_seconds_count')?.value;
    assert.ok(count !== undefined && count <= MAX_UNAPPLIED && count > 0, `observed ${count} of ${n + 1} batches`);
  });
});
