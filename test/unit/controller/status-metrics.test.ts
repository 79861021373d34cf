// The controller's metrics that alerts and the chart's dashboard read: each node's conditions
// and last sync time from its NodePolicyStatus, and how long the policy waiting longest has not
// been Enforced, from the NetworkPolicyStatus objects the leader holds.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { Registry } from 'prom-client';
import { createPolicyStatusAggregator } from '../../../src/controller/aggregator.ts';
import type { PolicyStatusAggregator } from '../../../src/controller/aggregator.ts';
import { createControllerMetrics, longestNotEnforcedMs } from '../../../src/controller/metrics.ts';
import { readNodeReport } from '../../../src/controller/node-reports.ts';
import type { PassResult, PolicyStatusInput } from '../../../src/status/index.ts';
import { buildNodeStatus } from '../../../src/status/node-status.ts';
import { buildPolicyStatus } from '../../../src/status/policy-status.ts';
import { captureLog, FakeApi, FakeClock, Results, until } from '../status/fake-api.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const NPS = (node: string) => `/apis/weir.dev/v1alpha1/nodepolicystatuses/${node}`;

const policy = (name: string, desiredNodes: string[], mode: 'enforce' | 'audit' = 'enforce'): PolicyStatusInput => ({
  namespace: 'shop',
  name,
  uid: `u-${name}`,
  generation: 1,
  accepted: { ok: true, message: '' },
  desiredNodes,
  mode,
});

/** A NetworkPolicyStatus as the writer builds it at `at`: pending on every desired node, or realized. */
const statusAt = (p: PolicyStatusInput, realized: boolean, at: number) =>
  buildPolicyStatus(p, { desired: p.desiredNodes.length, realized: realized ? p.desiredNodes.length : 0, pending: realized ? [] : p.desiredNodes }, undefined, at);

const nodeObject = (node: string, ok: boolean, lastSyncTime: number | null) => ({
  apiVersion: 'weir.dev/v1alpha1',
  kind: 'NodePolicyStatus',
  metadata: { name: node },
  status: JSON.parse(
    JSON.stringify(
      buildNodeStatus(
        {
          synced: true,
          lastApply: ok ? { ok: true } : { ok: false, message: 'iptables-restore: line 3 failed' },
          lastSyncTime,
          counts: { localPods: 1, policies: 0, sets: 0, chains: 0, rules: 0 },
          policies: [],
        },
        undefined,
        T0,
      ),
    ),
  ) as unknown,
});

/** The registry's samples of one metric, as `labels=value` lines. */
async function samples(registry: Registry, name: string): Promise<string[]> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  assert.ok(m, `${name} is registered`);
  return (m.values as { labels: Record<string, string | number>; value: number }[])
    .map(
      (v) =>
        `${Object.entries(v.labels)
          .map(([k, l]) => `${k}=${l}`)
          .join(',')} ${v.value}`,
    )
    .sort();
}

describe('controller metrics', () => {
  test('the longest wait for Enforced counts from the Enforced condition turning False, and leaves out audit-only and Enforced policies', () => {
    const waiting = statusAt(policy('web', ['node-a']), false, T0 - 700_000);
    const later = statusAt(policy('db', ['node-b']), false, T0 - 100_000);
    const auditOnly = statusAt(policy('trial', ['node-a'], 'audit'), false, T0 - 5_000_000);
    const done = statusAt(policy('api', ['node-a']), true, T0 - 9_000_000);
    const all = [waiting, later, auditOnly, done, null].map((status) => ({ status }));
    assert.equal(longestNotEnforcedMs(all, T0), 700_000);
    assert.equal(longestNotEnforcedMs([{ status: auditOnly }, { status: done }, { status: null }], T0), 0);
    assert.equal(longestNotEnforcedMs([], T0), 0);
  });

  test("a node's report carries its conditions and last sync time, as its NodePolicyStatus says", () => {
    const ready = readNodeReport(nodeObject('node-a', true, T0 - 30_000));
    assert.deepEqual(ready.conditions, [
      { type: 'Ready', status: 'True' },
      { type: 'Programmed', status: 'True' },
      { type: 'Degraded', status: 'False' },
    ]);
    assert.equal(ready.lastSyncTime, T0 - 30_000);
    const failing = readNodeReport(nodeObject('node-b', false, null));
    assert.deepEqual(failing.conditions, [
      { type: 'Ready', status: 'False' },
      { type: 'Programmed', status: 'False' },
      { type: 'Degraded', status: 'True' },
    ]);
    assert.equal(failing.lastSyncTime, null);
    const empty = readNodeReport({ metadata: { name: 'node-c' } });
    assert.deepEqual([empty.conditions, empty.lastSyncTime], [[], null]);
  });

  test('the registry serves each node condition as 1 or 0, each last sync as Unix seconds, and the longest wait in seconds, read at scrape time', async () => {
    const registry = new Registry();
    const reports = [readNodeReport(nodeObject('node-a', true, T0 - 30_000)), readNodeReport(nodeObject('node-b', false, null))];
    let waitMs = 0;
    const m = createControllerMetrics(registry, { nodes: () => reports, notEnforcedMs: () => waitMs });
    m.leader.set(1);
    m.statusWrites.inc({ kind: 'Event', result: 'ok' });
    assert.deepEqual(await samples(registry, 'weir_node_status_condition'), [
      'node=node-a,condition=Degraded 0',
      'node=node-a,condition=Programmed 1',
      'node=node-a,condition=Ready 1',
      'node=node-b,condition=Degraded 1',
      'node=node-b,condition=Programmed 0',
      'node=node-b,condition=Ready 0',
    ]);
    assert.deepEqual(await samples(registry, 'weir_node_status_last_sync_timestamp_seconds'), [`node=node-a ${(T0 - 30_000) / 1000}`]);
    assert.deepEqual(await samples(registry, 'weir_policy_not_enforced_seconds'), [' 0']);
    assert.deepEqual(await samples(registry, 'weir_controller_leader'), [' 1']);
    assert.deepEqual(await samples(registry, 'weir_status_writes_total'), ['kind=Event,result=ok 1']);

    // A node gone, a policy waiting: the next scrape says so.
    reports.pop();
    waitMs = 612_500;
    assert.deepEqual(await samples(registry, 'weir_node_status_condition'), ['node=node-a,condition=Degraded 0', 'node=node-a,condition=Programmed 1', 'node=node-a,condition=Ready 1']);
    assert.deepEqual(await samples(registry, 'weir_policy_not_enforced_seconds'), [' 612.5']);
  });

  describe('the aggregator', () => {
    let api: FakeApi;
    let clock: FakeClock;
    let running: PolicyStatusAggregator[];

    beforeEach(async () => {
      api = new FakeApi();
      await api.start();
      clock = new FakeClock(T0);
      running = [];
    });
    afterEach(async () => {
      for (const a of running) await a.stop();
      await api.stop();
    });

    const start = (identity: string, results: Results<PassResult>) => {
      const a = createPolicyStatusAggregator({
        kubeConfig: api.kubeConfig(`token-${identity}`),
        identity,
        log: captureLog().log,
        clock,
        leaseDurationSeconds: 15,
        minIntervalMs: 2_000,
        retryMinMs: 1_000,
        retryMaxMs: 8_000,
        onWrite: results.push,
      });
      running.push(a);
      a.start();
      return a;
    };

    test('the holder tells how long its pending policy has waited, until the node realizes it; a replica not holding tells 0', async () => {
      const enforcing = (node: string, generation: number | null) => {
        const status = buildNodeStatus(
          {
            synced: true,
            lastApply: { ok: true },
            lastSyncTime: T0,
            counts: { localPods: 1, policies: generation === null ? 0 : 1, sets: 0, chains: 0, rules: 0 },
            policies: generation === null ? [] : [{ namespace: 'shop', name: 'web', uid: 'u-web', generation }],
          },
          undefined,
          T0,
        );
        api.put(NPS(node), { apiVersion: 'weir.dev/v1alpha1', kind: 'NodePolicyStatus', metadata: { name: node }, status: JSON.parse(JSON.stringify(status)) as unknown });
      };
      enforcing('node-a', null);
      const results = new Results<PassResult>();
      const a = start('node-a', results);
      clock.advance(0);
      await until(() => a.isHolder(), 'node-a holds the lease');
      assert.equal(a.notEnforcedMs(), 0, 'nothing written yet');

      a.update({ policies: [policy('web', ['node-a'])] });
      await until(() => clock.hasTimerAt(clock.now()), 'the first pass');
      clock.advance(0);
      assert.equal(await results.next(), 'ok');
      const b = start('node-b', new Results<PassResult>());
      // Within one renewal (a third of the 15 s Lease): the holder still holds it.
      clock.advance(4_000);
      assert.equal(a.notEnforcedMs(), 4_000);
      assert.equal(b.notEnforcedMs(), 0, 'not the holder');

      enforcing('node-a', 1);
      await until(() => clock.hasTimerAt(clock.now()), 'the pass the node status brings');
      clock.advance(0);
      assert.equal(await results.next(), 'ok');
      assert.equal(a.notEnforcedMs(), 0);
    });

    test('a ClusterNetworkPolicy waiting for its nodes counts too, from the Enforced condition on the policy itself', async () => {
      api.put('/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies/guard', {
        apiVersion: 'policy.networking.k8s.io/v1beta1',
        kind: 'ClusterNetworkPolicy',
        metadata: { name: 'guard', uid: 'u-guard', generation: 1 },
        spec: { tier: 'Admin', priority: 1, subject: { namespaces: {} } },
      });
      const results = new Results<PassResult>();
      const a = start('node-a', results);
      clock.advance(0);
      await until(() => a.isHolder(), 'node-a holds the lease');
      a.update({ policies: [], clusterPolicies: [{ name: 'guard', uid: 'u-guard', generation: 1, accepted: { ok: true, message: '' }, desiredNodes: ['node-a'] }] });
      await until(() => clock.hasTimerAt(clock.now()), 'the first pass');
      clock.advance(0);
      assert.equal(await results.next(), 'ok');
      clock.advance(3_000);
      assert.equal(a.notEnforcedMs(), 3_000);
    });
  });
});
