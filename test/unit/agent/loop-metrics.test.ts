import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { LoopMetrics, MAX_UNAPPLIED } from '../../../src/agent/loop-metrics.ts';
import { createMetrics } from '../../../src/metrics/index.ts';
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
    await clock.advanceAsync(20);
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
    await clock.advanceAsync(20);
    const n = 5 * MAX_UNAPPLIED;
    for (let i = 1; i <= n; i++) {
      r.onBatch(batch(`r${i}`, true, 'p'));
      if (i % 500 === 0) await clock.advanceAsync(1000);
    }
    dataplane.failWrites = 0;
    await clock.advanceAsync(2000);
    assert.equal(r.readiness().ready, true);
    const got = await metrics.enforceLatency.get();
    const count = got.values.find((v) => v.metricName === 'weir_event_to_enforced_seconds_count')?.value;
    assert.ok(count !== undefined && count <= MAX_UNAPPLIED && count > 0, `observed ${count} of ${n + 1} batches`);
  });
});

describe('LoopMetrics alone', () => {
  test("a batch's wait is observed once, by the first write after calc took it", async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const m = new LoopMetrics(metrics);
    const state = { sets: 1, chains: 2, rules: 3, localPods: 4, policies: { valid: 5, invalid: 0 } };
    m.arrived(0);
    m.written(100, 'total', 10, state);
    const count = async () => (await metrics.enforceLatency.get()).values.find((v) => v.metricName === 'weir_event_to_enforced_seconds_count')?.value;
    assert.equal(await count(), 0, 'not taken into calc yet: that write did not carry it');
    m.taken();
    m.written(300, 'total', 10, state);
    m.written(400, 'total', 10, state);
    assert.equal(await count(), 1);
    const sum = (await metrics.enforceLatency.get()).values.find((v) => v.metricName === 'weir_event_to_enforced_seconds_sum')?.value;
    assert.equal(sum, 0.3);
  });
});
