// The status writers against a real kube-apiserver (test/integration/controlplane.ts): the CRDs
// install and are served, the API server accepts every body the writers send (schema, server-
// side apply on the status subresource, ownerReferences, Lease, Events), kubectl prints the
// columns, and RBAC denial is survived. No controller manager runs, so no garbage collection.

import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { silentLogger } from '../../src/log.ts';
import { createPolicyStatusAggregator } from '../../src/controller/aggregator.ts';
import { createEventRecorder } from '../../src/controller/events.ts';
import { createNodeStatusReporter } from '../../src/status/index.ts';
import type { RequestRecord } from '../../src/kube/client.ts';
import type { NodeStatusInput, PassResult } from '../../src/status/index.ts';
import { captureLog, Results, until } from '../unit/status/fake-api.ts';
import { eventually } from '../support/eventually.ts';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

const NS = 'weir-status-it';
const CRDS = fileURLToPath(new URL('../../crds/', import.meta.url));

const SETUP = `
apiVersion: v1
kind: Node
metadata:
  name: node-a
---
apiVersion: v1
kind: Namespace
metadata:
  name: ${NS}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web
  namespace: ${NS}
spec:
  podSelector:
    matchLabels: {app: web}
  policyTypes: [Ingress]
`;

interface Meta {
  uid: string;
  generation?: number;
  ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string }[];
  managedFields?: { manager: string; operation: string; subresource?: string }[];
}

describe('status writers against a real API server', () => {
  let cp: ControlPlane;
  let kc: KubeConfig;
  let nodeUid: string;
  let policy: { uid: string; generation: number };

  const getJson = async <T>(args: string[]): Promise<T> => JSON.parse(await cp.kubectl([...args, '-o', 'json', '--show-managed-fields'])) as T;

  before(async () => {
    cp = await startControlPlane();
    await cp.kubectl(['apply', '-f', CRDS]);
    // Null conditions right after the create read as an error to kubectl wait: retried.
    await eventually(
      'the CRDs Established',
      () => cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev']),
      () => true,
      60_000,
    );
    await cp.kubectl(['apply', '-f', '-'], SETUP);
    nodeUid = (await getJson<{ metadata: Meta }>(['get', 'node', 'node-a'])).metadata.uid;
    const np = await getJson<{ metadata: Meta }>(['get', 'networkpolicy', 'web', '-n', NS]);
    policy = { uid: np.metadata.uid, generation: np.metadata.generation ?? 1 };
    kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
  });
  after(async () => {
    await cp?.stop();
  });

  const nodeInput = (rules: number): NodeStatusInput => ({
    synced: true,
    lastApply: { ok: true },
    lastSyncTime: Date.now(),
    counts: { localPods: 1, policies: 1, sets: 1, chains: 4, rules },
    policies: [{ namespace: NS, name: 'web', uid: policy.uid, generation: policy.generation }],
  });

  test('the node reporter creates its NodePolicyStatus, owned by the Node, status applied by its field manager', async () => {
    const results = new Results<PassResult>();
    const reporter = createNodeStatusReporter({ kubeConfig: kc, nodeName: 'node-a', log: silentLogger(), minIntervalMs: 100, onWrite: results.push });
    try {
      reporter.update(nodeInput(12));
      assert.equal(await results.next(10_000), 'ok');
      reporter.update(nodeInput(13));
      assert.equal(await results.next(10_000), 'ok');
      reporter.update(nodeInput(13));
      assert.equal(await results.next(10_000), 'skipped');
    } finally {
      await reporter.stop();
    }
    const obj = await getJson<{ metadata: Meta; status: { counts: { rules: number }; conditions: { type: string; status: string }[] } }>(['get', 'nodepolicystatus', 'node-a']);
    assert.deepEqual(obj.metadata.ownerReferences, [{ apiVersion: 'v1', kind: 'Node', name: 'node-a', uid: nodeUid }]);
    assert.equal(obj.status.counts.rules, 13);
    assert.deepEqual(
      obj.status.conditions.map((c) => [c.type, c.status]),
      [
        ['Ready', 'True'],
        ['Programmed', 'True'],
        ['Degraded', 'False'],
      ],
    );
    const managers = (obj.metadata.managedFields ?? []).map((m) => `${m.manager} ${m.operation} ${m.subresource ?? ''}`.trim());
    assert.ok(managers.includes('weir-agent-node-a Apply'), managers.join(', '));
    assert.ok(managers.includes('weir-agent-node-a Apply status'), managers.join(', '));

    const table = await cp.kubectl(['get', 'nodepolicystatuses']);
    assert.match(table, /^NAME\s+READY\s+PROGRAMMED\s+DEGRADED\s+PODS\s+POLICIES\s+RULES\s+FAILING\s+AGE\n/);
    assert.match(table, /\nnode-a\s+True\s+True\s+False\s+1\s+1\s+13\s+0\s+\S+/);
  });

  test('the Lease holder writes the NetworkPolicyStatus from the node digests, deletes orphans, and then only watches', async () => {
    await cp.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'weir.dev/v1alpha1', kind: 'NetworkPolicyStatus', metadata: { name: 'gone', namespace: NS } }));
    const results = new Results<PassResult>();
    const requests: RequestRecord[] = [];
    const agg = createPolicyStatusAggregator({ kubeConfig: kc, identity: 'node-a', log: silentLogger(), minIntervalMs: 200, onWrite: results.push, onRequest: (r) => void requests.push(r) });
    const input = (generation: number) => ({
      policies: [{ namespace: NS, name: 'web', uid: policy.uid, generation, accepted: { ok: true, message: '' }, desiredNodes: ['node-a'] }],
    });
    const realized = async () => (await getJson<{ status: { realized: string } }>(['get', 'networkpolicystatus', 'web', '-n', NS])).status.realized;
    const lists = () => requests.filter((r) => r.method === 'GET' && !r.watch && r.path.startsWith('/apis/weir.dev/')).length;
    try {
      agg.start();
      await until(() => agg.isHolder(), 'node-a holds the lease', 10_000);
      agg.update(input(policy.generation));
      assert.equal(await results.next(10_000), 'ok');
      assert.equal(await realized(), '1/1', "node-a's digest, as the API server stored it, proves the generation");
      assert.equal(lists(), 2, 'one list of each kind');
      await new Promise((r) => setTimeout(r, 1_500));
      assert.deepEqual(results.all, ['ok'], 'no pass while nothing changes');

      // A new generation is pending until node-a reports it; the report arrives by the watch.
      agg.update(input(policy.generation + 1));
      assert.equal(await results.next(10_000), 'ok');
      assert.equal(await realized(), '0/1');
      const reporter = createNodeStatusReporter({ kubeConfig: kc, nodeName: 'node-a', log: silentLogger(), minIntervalMs: 100 });
      reporter.update({ ...nodeInput(13), policies: [{ namespace: NS, name: 'web', uid: policy.uid, generation: policy.generation + 1 }] });
      assert.equal(await results.next(10_000), 'ok');
      await reporter.stop();
      assert.equal(await realized(), '1/1');
      assert.equal(lists(), 2, 'still no list: the watch brought the change');
    } finally {
      await agg.stop();
    }
    const obj = await getJson<{ metadata: Meta; status: { observedGeneration: number; realized: string; conditions: { type: string; status: string }[] } }>([
      'get',
      'networkpolicystatus',
      'web',
      '-n',
      NS,
    ]);
    assert.deepEqual(obj.metadata.ownerReferences, [{ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', name: 'web', uid: policy.uid }]);
    assert.equal(obj.status.realized, '1/1');
    assert.equal(obj.status.observedGeneration, policy.generation + 1);
    assert.deepEqual(
      obj.status.conditions.map((c) => [c.type, c.status]),
      [
        ['Accepted', 'True'],
        ['Enforced', 'True'],
      ],
    );
    assert.ok((obj.metadata.managedFields ?? []).some((m) => m.manager === 'weir-aggregator' && m.subresource === 'status'));
    await assert.rejects(cp.kubectl(['get', 'networkpolicystatus', 'gone', '-n', NS]), /NotFound|not found/);

    const table = await cp.kubectl(['get', 'networkpolicystatuses', '-n', NS]);
    assert.match(table, /^NAME\s+ACCEPTED\s+ENFORCED\s+MODE\s+REALIZED\s+AGE\n/);
    assert.match(table, /\nweb\s+True\s+True\s+enforce\s+1\/1\s+\S+/);

    const lease = await getJson<{ spec: { holderIdentity?: string; leaseTransitions: number } }>(['get', 'lease', 'weir-policy-status', '-n', 'kube-system']);
    assert.equal(lease.spec.holderIdentity, undefined, 'released on stop');
    // The NetworkPolicy itself is never written.
    const np = await getJson<{ metadata: Meta }>(['get', 'networkpolicy', 'web', '-n', NS]);
    assert.equal(np.metadata.generation, policy.generation);
    assert.ok((np.metadata.managedFields ?? []).every((m) => !m.manager.startsWith('weir')));
  });

  test('events land on the NetworkPolicy, with repeats counted', async () => {
    const results = new Results<'ok' | 'error'>();
    const rec = createEventRecorder({ kubeConfig: kc, component: 'weir-agent', host: 'node-a', log: silentLogger(), windowMs: 300, onWrite: results.push });
    const ref = { namespace: NS, name: 'web', uid: policy.uid };
    try {
      rec.record(ref, 'Warning', 'ApplyFailed', 'iptables-restore: line 3 failed');
      assert.equal(await results.next(10_000), 'ok');
      rec.record(ref, 'Warning', 'ApplyFailed', 'iptables-restore: line 3 failed');
      rec.record(ref, 'Warning', 'ApplyFailed', 'iptables-restore: line 4 failed');
      assert.equal(await results.next(10_000), 'ok');
    } finally {
      await rec.stop();
    }
    const events = await getJson<{ items: { reason: string; count: number; message: string; involvedObject: { kind: string; uid: string } }[] }>([
      'get',
      'events',
      '-n',
      NS,
      '--field-selector',
      'involvedObject.name=web',
    ]);
    assert.deepEqual(
      events.items.map((e) => [e.involvedObject.kind, e.involvedObject.uid, e.reason, e.count, e.message]),
      [['NetworkPolicy', policy.uid, 'ApplyFailed', 3, 'iptables-restore: line 4 failed']],
    );
  });

  test('RBAC denial: the reporter warns once and keeps retrying, it never throws', async () => {
    await cp.kubectl(['create', 'serviceaccount', 'no-rights', '-n', NS]);
    const token = (await cp.kubectl(['create', 'token', 'no-rights', '-n', NS])).trim();
    const denied = new KubeConfig();
    denied.loadFromOptions({
      clusters: kc.clusters,
      users: [{ name: 'no-rights', token }],
      contexts: [{ name: 'denied', cluster: kc.getCurrentCluster()!.name, user: 'no-rights' }],
      currentContext: 'denied',
    });
    const logs = captureLog();
    const results = new Results<PassResult>();
    const reporter = createNodeStatusReporter({
      kubeConfig: denied,
      nodeName: 'node-a',
      log: logs.log,
      minIntervalMs: 50,
      retryMinMs: 50,
      retryMaxMs: 100,
      onWrite: results.push,
    });
    try {
      for (let i = 0; i < 3; i++) {
        reporter.update(nodeInput(i));
        assert.equal(await results.next(10_000), 'error');
      }
    } finally {
      await reporter.stop();
    }
    const warnings = logs.warnings();
    assert.equal(warnings.length, 1);
    assert.match(warnings[0].msg, /forbids the status write \(RBAC, or an admission policy\)/);
    assert.match(String(warnings[0].error), /forbidden/i);
  });
});
