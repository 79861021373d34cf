import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  agentFieldManager,
  applyQuery,
  clusterPolicyListPath,
  clusterPolicyPath,
  clusterPolicyStatusBody,
  deleteBody,
  eventBody,
  eventName,
  eventRepeatBody,
  eventsPath,
  nodeObjectBody,
  nodePath,
  nodeStatusBody,
  nodeStatusListPath,
  nodeStatusPath,
  policyObjectBody,
  policyStatusBody,
  policyStatusListPath,
  policyStatusPath,
} from '../../../src/status/bodies.ts';
import type { NodeStatus } from '../../../src/status/node-status.ts';
import type { PolicyStatus } from '../../../src/status/policy-status.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const ref = { namespace: 'shop', name: 'web', uid: 'u-web' };

describe('paths', () => {
  const cases: { name: string; got: string; expected: string }[] = [
    { name: 'NodePolicyStatus', got: nodeStatusPath('node-a'), expected: '/apis/weir.dev/v1alpha1/nodepolicystatuses/node-a' },
    { name: 'NodePolicyStatus status', got: nodeStatusPath('node-a', 'status'), expected: '/apis/weir.dev/v1alpha1/nodepolicystatuses/node-a/status' },
    { name: 'NodePolicyStatus list', got: nodeStatusListPath(), expected: '/apis/weir.dev/v1alpha1/nodepolicystatuses' },
    { name: 'NetworkPolicyStatus', got: policyStatusPath('shop', 'web'), expected: '/apis/weir.dev/v1alpha1/namespaces/shop/networkpolicystatuses/web' },
    {
      name: 'NetworkPolicyStatus status',
      got: policyStatusPath('shop', 'web', 'status'),
      expected: '/apis/weir.dev/v1alpha1/namespaces/shop/networkpolicystatuses/web/status',
    },
    { name: 'NetworkPolicyStatus list, all namespaces', got: policyStatusListPath(), expected: '/apis/weir.dev/v1alpha1/networkpolicystatuses' },
    {
      name: 'ClusterNetworkPolicy status',
      got: clusterPolicyPath('db-only', 'status'),
      expected: '/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies/db-only/status',
    },
    { name: 'ClusterNetworkPolicy list', got: clusterPolicyListPath(), expected: '/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies' },
    { name: 'Node', got: nodePath('node-a'), expected: '/api/v1/nodes/node-a' },
    { name: 'Events', got: eventsPath('shop'), expected: '/api/v1/namespaces/shop/events' },
    { name: 'one Event', got: eventsPath('shop', 'web.1'), expected: '/api/v1/namespaces/shop/events/web.1' },
    { name: 'names are escaped', got: nodeStatusPath('a/b?c'), expected: '/apis/weir.dev/v1alpha1/nodepolicystatuses/a%2Fb%3Fc' },
  ];
  for (const c of cases) test(c.name, () => assert.equal(c.got, c.expected));
});

describe('field managers and the apply query', () => {
  test('each agent applies as weir-agent-<node>, with force', () => {
    assert.equal(agentFieldManager('node-a'), 'weir-agent-node-a');
    assert.deepEqual(applyQuery('weir-agent-node-a'), { fieldManager: 'weir-agent-node-a', force: 'true' });
  });
  test('a long node name is cut to the 128 characters the API server accepts', () => {
    const m = agentFieldManager('n'.repeat(253));
    assert.equal(m.length, 128);
    assert.ok(m.startsWith('weir-agent-nnn'));
  });
});

describe('server-side apply bodies', () => {
  test('NodePolicyStatus object: only the ownerReference to the Node', () => {
    assert.equal(
      JSON.stringify(nodeObjectBody('node-a', 'uid-node-a')),
      '{"apiVersion":"weir.dev/v1alpha1","kind":"NodePolicyStatus","metadata":{"name":"node-a",' + '"ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"node-a","uid":"uid-node-a"}]}}',
    );
  });
  test('NodePolicyStatus status: name and status only', () => {
    const status = {
      conditions: [],
      counts: { localPods: 0, policies: 0, sets: 0, chains: 0, rules: 0, failingPolicies: 0 },
      failingPolicies: [],
      failingPoliciesOmitted: 0,
      applyFailures: [],
      policyDigest: { buckets: 1, digests: '0000000000000000' },
    } satisfies NodeStatus;
    assert.equal(
      JSON.stringify(nodeStatusBody('node-a', status)),
      '{"apiVersion":"weir.dev/v1alpha1","kind":"NodePolicyStatus","metadata":{"name":"node-a"},' +
        '"status":{"conditions":[],"counts":{"localPods":0,"policies":0,"sets":0,"chains":0,"rules":0,"failingPolicies":0},' +
        '"failingPolicies":[],"failingPoliciesOmitted":0,"applyFailures":[],"policyDigest":{"buckets":1,"digests":"0000000000000000"}}}',
    );
  });
  test('NetworkPolicyStatus object: same namespace and name, owned by the NetworkPolicy', () => {
    assert.equal(
      JSON.stringify(policyObjectBody(ref)),
      '{"apiVersion":"weir.dev/v1alpha1","kind":"NetworkPolicyStatus","metadata":{"name":"web","namespace":"shop",' +
        '"ownerReferences":[{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","name":"web","uid":"u-web"}]}}',
    );
  });
  test('NetworkPolicyStatus status', () => {
    const status: PolicyStatus = { observedGeneration: 2, conditions: [], nodesDesired: 1, nodesRealized: 1, realized: '1/1', nodesPending: [], mode: 'audit' };
    assert.equal(
      JSON.stringify(policyStatusBody(ref, status)),
      '{"apiVersion":"weir.dev/v1alpha1","kind":"NetworkPolicyStatus","metadata":{"name":"web","namespace":"shop"},' +
        '"status":{"observedGeneration":2,"conditions":[],"nodesDesired":1,"nodesRealized":1,"realized":"1/1","nodesPending":[],"mode":"audit"}}',
    );
  });
  test("ClusterNetworkPolicy status: Weir's conditions alone, on the resourceVersion read", () => {
    const accepted = { type: 'Accepted', status: 'True', observedGeneration: 2, lastTransitionTime: '2025-06-01T12:00:00Z', reason: 'Valid', message: 'ok' } as const;
    assert.equal(
      JSON.stringify(clusterPolicyStatusBody('db-only', '4711', [accepted])),
      '{"apiVersion":"policy.networking.k8s.io/v1beta1","kind":"ClusterNetworkPolicy","metadata":{"name":"db-only","resourceVersion":"4711"},' +
        '"status":{"conditions":[{"type":"Accepted","status":"True","observedGeneration":2,"lastTransitionTime":"2025-06-01T12:00:00Z","reason":"Valid","message":"ok"}]}}',
    );
  });
  test('delete options carry a uid precondition', () => {
    assert.equal(JSON.stringify(deleteBody('u-1')), '{"apiVersion":"v1","kind":"DeleteOptions","preconditions":{"uid":"u-1"}}');
  });
});

describe('events', () => {
  test('an Event on the NetworkPolicy, with source and reporting fields', () => {
    const body = eventBody('web.abc', {
      ref,
      type: 'Warning',
      reason: 'PolicyRejected',
      message: 'spec.ingress[0]: bad',
      component: 'weir-agent',
      host: 'node-a',
      count: 3,
      firstMs: T0,
      lastMs: T0 + 61_000,
    });
    assert.equal(
      JSON.stringify(body),
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Event',
        metadata: { name: 'web.abc', namespace: 'shop' },
        involvedObject: { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', namespace: 'shop', name: 'web', uid: 'u-web' },
        type: 'Warning',
        reason: 'PolicyRejected',
        message: 'spec.ingress[0]: bad',
        source: { component: 'weir-agent', host: 'node-a' },
        reportingComponent: 'weir-agent',
        reportingInstance: 'node-a',
        firstTimestamp: '2025-06-01T12:00:00Z',
        lastTimestamp: '2025-06-01T12:01:01Z',
        count: 3,
      }),
    );
  });
  test('the repeat patch sets count, lastTimestamp and message', () => {
    assert.equal(JSON.stringify(eventRepeatBody({ count: 4, lastMs: T0, message: 'm' })), '{"count":4,"lastTimestamp":"2025-06-01T12:00:00Z","message":"m"}');
  });
  test('event names: object name, dot, hex nanoseconds; unique per sequence; never longer than 253', () => {
    assert.equal(eventName('web', T0, 0), `web.${(BigInt(T0) * 1_000_000n).toString(16)}`);
    assert.notEqual(eventName('web', T0, 0), eventName('web', T0, 1));
    const long = eventName('p'.repeat(253), T0, 0);
    assert.equal(long.length, 253);
    assert.match(long, /^p+\.[0-9a-f]+$/);
  });
});
