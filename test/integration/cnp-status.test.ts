// Weir's conditions on ClusterNetworkPolicies, against a real kube-apiserver with the vendored
// CRD: the controller's model and the agent's calc and reporting feed the aggregator, which
// applies Accepted and Enforced to each policy's own status subresource. The API server takes
// the body (schema, server-side apply beside another writer's condition, the resourceVersion
// precondition), and Enforced follows the node's digest. No controller manager or kubelet runs:
// the pod exists only as the model's event.

import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { startReporting } from '../../src/agent/reporting.ts';
import { Calculator, makeNames } from '../../src/calc/index.ts';
import { createPolicyStatusAggregator } from '../../src/controller/aggregator.ts';
import { ControllerModel } from '../../src/controller/policy-inputs.ts';
import { silentLogger } from '../../src/log.ts';
import { createMetrics } from '../../src/metrics/index.ts';
import type { ModelEvent, RawClusterNetworkPolicy } from '../../src/model/types.ts';
import { eventually } from '../support/eventually.ts';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

const CRDS = fileURLToPath(new URL('../../crds/', import.meta.url));
const NODE = 'node-a';

const SETUP = `
apiVersion: v1
kind: Node
metadata:
  name: ${NODE}
---
apiVersion: v1
kind: Namespace
metadata:
  name: shop
  labels: {team: shop}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: guard
spec:
  tier: Admin
  priority: 10
  subject:
    namespaces:
      matchLabels: {team: shop}
  ingress:
    - name: no-one
      action: Deny
      from:
        - namespaces: {}
---
# Admitted by the CRD, refused by Weir: a ClusterNetworkPolicy is never audit-only.
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: audited
  annotations:
    weir.dev/enforcement: audit
spec:
  tier: Baseline
  priority: 5
  subject:
    namespaces: {}
  egress:
    - action: Deny
      to:
        - networks: [10.0.0.0/8]
`;

interface Condition {
  type: string;
  status: string;
  observedGeneration?: number;
  reason: string;
  message: string;
}
interface Cnp {
  metadata: { name: string; uid: string; generation: number; annotations?: Record<string, string>; managedFields?: { manager: string; operation: string; subresource?: string }[] };
  spec: unknown;
  status?: { conditions?: Condition[] };
}

describe('ClusterNetworkPolicy conditions against a real API server', () => {
  let cp: ControlPlane;
  let kc: KubeConfig;

  const getCnp = async (name: string): Promise<Cnp> => JSON.parse(await cp.kubectl(['get', 'clusternetworkpolicy', name, '-o', 'json', '--show-managed-fields'])) as Cnp;
  const event = (c: Cnp): ModelEvent => {
    const object: RawClusterNetworkPolicy = {
      name: c.metadata.name,
      uid: c.metadata.uid,
      generation: c.metadata.generation,
      spec: c.spec,
      ...(c.metadata.annotations ? { annotations: c.metadata.annotations } : {}),
    };
    return { kind: 'ClusterNetworkPolicy', op: 'upsert', object };
  };
  const weirs = (c: Cnp): [string, string, string, number | undefined][] =>
    (c.status?.conditions ?? []).filter((x) => x.type === 'Accepted' || x.type === 'Enforced').map((x) => [x.type, x.status, x.reason, x.observedGeneration]);

  before(async () => {
    cp = await startControlPlane();
    await cp.kubectl(['apply', '--server-side', '-f', CRDS]);
    // Null conditions right after the create read as an error to kubectl wait: retried.
    await eventually(
      'the CRDs Established',
      () =>
        cp.kubectl([
          'wait',
          '--for=condition=Established',
          '--timeout=60s',
          'crd/nodepolicystatuses.weir.dev',
          'crd/networkpolicystatuses.weir.dev',
          'crd/clusternetworkpolicies.policy.networking.k8s.io',
        ]),
      () => true,
      60_000,
    );
    await cp.kubectl(['apply', '-f', '-'], SETUP);
    kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
  });
  after(async () => {
    await cp?.stop();
  });

  test('Accepted and Enforced appear on each policy once its node holds it, beside another writer’s condition; an invalid one is not Accepted, with its error', async () => {
    // Another implementation's condition, there first: server-side apply leaves it alone.
    const foreign = { type: 'Programmed', status: 'True', lastTransitionTime: '2025-01-01T00:00:00Z', reason: 'Elsewhere', message: 'another writer' };
    await cp.kubectl(['patch', 'clusternetworkpolicy', 'guard', '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: { conditions: [foreign] } })]);
    const events: ModelEvent[] = [
      { kind: 'Namespace', op: 'upsert', object: { name: 'shop', labels: { team: 'shop' } } },
      {
        kind: 'Pod',
        op: 'upsert',
        object: { uid: 'p-web', namespace: 'shop', name: 'web', labels: {}, nodeName: NODE, hostNetwork: false, phase: 'Running', terminating: false, ips: ['10.244.1.5'], ports: [] },
      },
      event(await getCnp('guard')),
      event(await getCnp('audited')),
    ];
    const model = new ControllerModel();
    model.apply(events);
    const calc = new Calculator({ nodeName: NODE, names: makeNames('cali'), families: [4], marks: { accept: 0x10000, pass: 0x20000 } });
    calc.applyEvents(events);

    const agg = createPolicyStatusAggregator({ kubeConfig: kc, identity: 'controller-0', log: silentLogger(), minIntervalMs: 200 });
    const reporting = startReporting({
      kubeConfig: kc,
      nodeName: NODE,
      calc,
      log: silentLogger(),
      metrics: createMetrics({ defaultMetrics: false }),
      synced: () => true,
      counts: () => ({ sets: 0, chains: 0, rules: 0 }),
      problems: [],
    });
    try {
      agg.start();
      agg.update({ policies: model.statusInputs(), clusterPolicies: model.clusterStatusInputs() });
      // The node has reported nothing yet: both pending on it.
      const pending = await eventually(
        'the conditions written, pending on the node',
        () => getCnp('guard'),
        (c) => weirs(c).length === 2,
      );
      assert.deepEqual(weirs(pending), [
        ['Accepted', 'True', 'Valid', 1],
        ['Enforced', 'False', 'NodesPending', 1],
      ]);
      assert.match(pending.status!.conditions!.find((c) => c.type === 'Enforced')!.message, /^1 of 1 nodes have not realized generation 1: node-a$/);

      // The node enforces both (the invalid one fails closed on its pod) and says so.
      reporting.onPass({ ok: true, policyChanges: [], modelChanged: true });
      const guard = await eventually(
        'guard Enforced',
        () => getCnp('guard'),
        (c) => weirs(c).some(([t, s]) => t === 'Enforced' && s === 'True'),
      );
      assert.deepEqual(weirs(guard), [
        ['Accepted', 'True', 'Valid', 1],
        ['Enforced', 'True', 'AllNodesRealized', 1],
      ]);
      assert.deepEqual(
        guard.status!.conditions!.find((c) => c.type === 'Programmed'),
        foreign,
        'the other writer’s condition stays',
      );
      assert.ok((guard.metadata.managedFields ?? []).some((m) => m.manager === 'weir-aggregator' && m.operation === 'Apply' && m.subresource === 'status'));
      const audited = await eventually(
        'audited Enforced',
        () => getCnp('audited'),
        (c) => weirs(c).some(([t, s]) => t === 'Enforced' && s === 'True'),
      );
      assert.deepEqual(weirs(audited), [
        ['Accepted', 'False', 'Invalid', 1],
        ['Enforced', 'True', 'AllNodesRealized', 1],
      ]);
      assert.equal(
        audited.status!.conditions!.find((c) => c.type === 'Accepted')!.message,
        'metadata.annotations["weir.dev/enforcement"]: audit-only mode is for NetworkPolicies; a ClusterNetworkPolicy is always enforced (remove the annotation)',
      );

      // An edit: pending at its new generation until the node holds it, then Enforced again.
      await cp.kubectl(['patch', 'clusternetworkpolicy', 'guard', '--type=merge', '-p', '{"spec":{"priority":20}}']);
      const edited = event(await getCnp('guard'));
      model.apply([edited]);
      calc.applyEvents([edited]);
      agg.update({ policies: model.statusInputs(), clusterPolicies: model.clusterStatusInputs() });
      const waiting = await eventually(
        'generation 2 pending',
        () => getCnp('guard'),
        (c) => weirs(c).every(([, , , g]) => g === 2),
      );
      assert.deepEqual(weirs(waiting), [
        ['Accepted', 'True', 'Valid', 2],
        ['Enforced', 'False', 'NodesPending', 2],
      ]);
      reporting.onPass({ ok: true, policyChanges: [], modelChanged: true });
      const held = await eventually(
        'generation 2 Enforced',
        () => getCnp('guard'),
        (c) => weirs(c).some(([t, s, , g]) => t === 'Enforced' && s === 'True' && g === 2),
      );
      assert.equal(held.metadata.generation, 2);
    } finally {
      await reporting.stop();
      await agg.stop();
    }
  });
});
