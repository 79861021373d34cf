// The agent's status reporting against a loopback fake API server: what the node's
// NodePolicyStatus claims it holds, from calc, for both kinds of policy.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { startReporting } from '../../../src/agent/reporting.ts';
import type { Reporting } from '../../../src/agent/reporting.ts';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import { createMetrics } from '../../../src/metrics/index.ts';
import type { ModelEvent, RawClusterNetworkPolicy } from '../../../src/model/types.ts';
import { digestOf, encodeDigest } from '../../../src/status/realization.ts';
import { captureLog, FakeApi, until } from '../status/fake-api.ts';

const NODE = 'node-a';
const NPS = `/apis/weir.dev/v1alpha1/nodepolicystatuses/${NODE}`;

const cnp = (name: string, generation: number, subject: unknown): RawClusterNetworkPolicy => ({
  name,
  uid: `u-${name}`,
  generation,
  spec: { tier: 'Admin', priority: 1, subject, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] },
});

const EVENTS: ModelEvent[] = [
  { kind: 'Namespace', op: 'upsert', object: { name: 'shop', labels: { team: 'shop' } } },
  {
    kind: 'Pod',
    op: 'upsert',
    object: { uid: 'p-web', namespace: 'shop', name: 'web', labels: { app: 'web' }, nodeName: NODE, hostNetwork: false, phase: 'Running', terminating: false, ips: ['10.244.1.5'], ports: [] },
  },
  // On another node: what it selects there is that node's to report.
  {
    kind: 'Pod',
    op: 'upsert',
    object: { uid: 'p-db', namespace: 'db', name: 'db', labels: { app: 'db' }, nodeName: 'node-b', hostNetwork: false, phase: 'Running', terminating: false, ips: ['10.244.2.5'], ports: [] },
  },
  { kind: 'NetworkPolicy', op: 'upsert', object: { namespace: 'shop', name: 'web', uid: 'u-np-web', generation: 3, spec: { podSelector: {}, policyTypes: ['Ingress'] } } },
  { kind: 'ClusterNetworkPolicy', op: 'upsert', object: cnp('shop-guard', 2, { namespaces: { matchLabels: { team: 'shop' } } }) },
  { kind: 'ClusterNetworkPolicy', op: 'upsert', object: cnp('db-guard', 1, { namespaces: { matchLabels: { 'kubernetes.io/metadata.name': 'db' } } }) },
  // Invalid (both subject kinds): it fails closed on every pod, this node's included.
  { kind: 'ClusterNetworkPolicy', op: 'upsert', object: cnp('broken', 5, { namespaces: {}, pods: { podSelector: {} } }) },
];

describe('agent status reporting', () => {
  let api: FakeApi;
  let reporting: Reporting | undefined;

  beforeEach(async () => {
    api = new FakeApi();
    await api.start();
    api.put(`/api/v1/nodes/${NODE}`, { apiVersion: 'v1', kind: 'Node', metadata: { name: NODE } });
  });
  afterEach(async () => {
    await reporting?.stop();
    await api.stop();
  });

  /** Reporting for a calc that holds EVENTS. */
  function startWithEvents(): { calc: Calculator; reporting: Reporting } {
    const calc = new Calculator({ nodeName: NODE, names: makeNames('cali'), families: [4], marks: { accept: 0x10000, pass: 0x20000 } });
    calc.applyEvents(EVENTS);
    reporting = startReporting({
      kubeConfig: api.kubeConfig(),
      nodeName: NODE,
      calc,
      log: captureLog().log,
      metrics: createMetrics({ defaultMetrics: false }),
      synced: () => true,
      counts: () => ({ sets: 1, chains: 2, rules: 3 }),
      problems: [],
    });
    return { calc, reporting };
  }

  test("the node's digest covers the ClusterNetworkPolicies whose subject holds a local pod, at their generation; an invalid one is listed as failing", async () => {
    const { calc, reporting } = startWithEvents();
    reporting.onPass({ ok: true, policyChanges: [], modelChanged: true });
    await until(() => api.get(NPS)?.status !== undefined, 'the NodePolicyStatus written', 5_000);

    const status = api.get(NPS)!.status as {
      counts: { policies: number; failingPolicies: number };
      failingPolicies: { namespace: string; name: string; uid: string; generation: number }[];
      policyDigest: { digests: string };
    };
    const held = [
      { uid: 'u-np-web', generation: 3 },
      { uid: 'u-shop-guard', generation: 2 },
      { uid: 'u-broken', generation: 5 },
    ];
    assert.equal(status.policyDigest.digests, encodeDigest(digestOf(held)));
    assert.equal(status.counts.policies, 3);
    assert.deepEqual(
      status.failingPolicies.map((p) => [p.namespace, p.name, p.uid, p.generation]),
      [['', 'broken', 'u-broken', 5]],
    );

    // An edit reaches the digest at its new generation.
    calc.applyEvents([{ kind: 'ClusterNetworkPolicy', op: 'upsert', object: cnp('shop-guard', 3, { namespaces: { matchLabels: { team: 'shop' } } }) }]);
    reporting.onPass({ ok: true, policyChanges: [], modelChanged: true });
    const next = encodeDigest(digestOf([held[0], { uid: 'u-shop-guard', generation: 3 }, held[2]]));
    await until(() => (api.get(NPS)!.status as { policyDigest: { digests: string } }).policyDigest.digests === next, 'the new generation reported', 5_000);
  });

  test('after a failed write the digest still says what the kernel holds (the last written generations) until a write succeeds', async () => {
    const { calc, reporting } = startWithEvents();
    const status = () => api.get(NPS)?.status as { policyDigest: { digests: string }; lastApply?: { ok: boolean } } | undefined;
    reporting.onPass({ ok: true, policyChanges: [], modelChanged: true });
    const written = encodeDigest(
      digestOf([
        { uid: 'u-np-web', generation: 3 },
        { uid: 'u-shop-guard', generation: 2 },
        { uid: 'u-broken', generation: 5 },
      ]),
    );
    await until(() => status()?.policyDigest.digests === written, 'the first write reported', 5_000);

    const edited = { kind: 'NetworkPolicy', op: 'upsert', object: { namespace: 'shop', name: 'web', uid: 'u-np-web', generation: 4, spec: { podSelector: {}, policyTypes: ['Egress'] } } } as const;
    calc.applyEvents([edited, { kind: 'ClusterNetworkPolicy', op: 'upsert', object: cnp('shop-guard', 3, { namespaces: { matchLabels: { team: 'shop' } } }) }]);
    reporting.onPass({ ok: false, error: 'iptables-restore: line 3 failed', policyChanges: [], modelChanged: true });
    await until(() => JSON.stringify(status()).includes('line 3 failed'), 'the failure reported', 5_000);
    assert.equal(status()?.policyDigest.digests, written, 'a generation the kernel does not hold was reported');

    // The retry carries no model change; it succeeds and the new generations are held.
    reporting.onPass({ ok: true, policyChanges: [], modelChanged: false });
    const next = encodeDigest(
      digestOf([
        { uid: 'u-np-web', generation: 4 },
        { uid: 'u-shop-guard', generation: 3 },
        { uid: 'u-broken', generation: 5 },
      ]),
    );
    await until(() => status()?.policyDigest.digests === next, 'the written generations reported', 5_000);
  });
});
