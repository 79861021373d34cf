import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  buildPolicyStatus,
  parsePolicyStatus,
  policyConditionSpecs,
  realizationsFromList,
  realize,
} from '../../../src/status/policy-status.ts';
import type { NodeRealizations, PolicyStatusInput } from '../../../src/status/policy-status.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const policy = (desiredNodes: string[], generation = 3, accepted = { ok: true, message: '' }): PolicyStatusInput => ({
  namespace: 'shop',
  name: 'web',
  uid: 'u-web',
  generation,
  accepted,
  desiredNodes,
});
const nodes: NodeRealizations = new Map([
  ['node-a', new Map([['u-web', 3]])],
  ['node-b', new Map([['u-web', 2]])],
  ['node-c', new Map([['u-web', 4]])],
  ['node-d', new Map([['u-other', 9]])],
]);

describe('realize', () => {
  const cases: { name: string; desired: string[]; generation?: number; expected: { desired: number; realized: number; pending: string[] } }[] = [
    { name: 'a node at the current generation has realized it', desired: ['node-a'], expected: { desired: 1, realized: 1, pending: [] } },
    { name: 'a node at a later generation has realized it too', desired: ['node-c'], expected: { desired: 1, realized: 1, pending: [] } },
    { name: 'a node at an older generation is pending', desired: ['node-b'], expected: { desired: 1, realized: 0, pending: ['node-b'] } },
    { name: 'a node that does not list the policy is pending', desired: ['node-d'], expected: { desired: 1, realized: 0, pending: ['node-d'] } },
    { name: 'a node without a NodePolicyStatus is pending', desired: ['node-x'], expected: { desired: 1, realized: 0, pending: ['node-x'] } },
    { name: 'no desired nodes: nothing to realize', desired: [], expected: { desired: 0, realized: 0, pending: [] } },
    {
      name: 'duplicate desired nodes count once; pending is sorted',
      desired: ['node-x', 'node-b', 'node-a', 'node-b'],
      expected: { desired: 3, realized: 1, pending: ['node-b', 'node-x'] },
    },
    { name: 'generation 5 is newer than every node', desired: ['node-a', 'node-c'], generation: 5, expected: { desired: 2, realized: 0, pending: ['node-a', 'node-c'] } },
  ];
  for (const c of cases) {
    test(c.name, () => assert.deepEqual(realize(policy(c.desired, c.generation ?? 3), nodes), c.expected));
  }
});

describe('realizationsFromList', () => {
  test('reads NodePolicyStatus objects; one without status is a node that realized nothing', () => {
    const list = {
      items: [
        { metadata: { name: 'node-a' }, status: { policies: [{ namespace: 'shop', name: 'web', uid: 'u-web', generation: 3 }, { uid: 'broken' }] } },
        { metadata: { name: 'node-b' } },
        { metadata: {} },
      ],
    };
    assert.deepEqual(realizationsFromList(list), new Map([['node-a', new Map([['u-web', 3]])], ['node-b', new Map()]]));
    assert.deepEqual(realizationsFromList(undefined), new Map());
  });
});

describe('policyConditionSpecs', () => {
  const cases: { name: string; input: PolicyStatusInput; expected: [string, string, string, string][] }[] = [
    {
      name: 'accepted and realized everywhere',
      input: policy(['node-a', 'node-c']),
      expected: [
        ['Accepted', 'True', 'Valid', 'the spec is valid and supported'],
        ['Enforced', 'True', 'AllNodesRealized', '2/2 nodes enforce generation 3'],
      ],
    },
    {
      name: 'pending nodes are named',
      input: policy(['node-a', 'node-b', 'node-x']),
      expected: [
        ['Accepted', 'True', 'Valid', 'the spec is valid and supported'],
        ['Enforced', 'False', 'NodesPending', '2 of 3 nodes have not realized generation 3: node-b, node-x'],
      ],
    },
    {
      name: 'rejected: Accepted carries the field errors; Enforced still reports realization (the pods are isolated)',
      input: policy(['node-a'], 3, { ok: false, message: 'spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "10.0.0.0/33"' }),
      expected: [
        ['Accepted', 'False', 'Invalid', 'spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "10.0.0.0/33"'],
        ['Enforced', 'True', 'AllNodesRealized', '1/1 nodes enforce generation 3'],
      ],
    },
    {
      name: 'no node runs a selected pod',
      input: policy([]),
      expected: [
        ['Accepted', 'True', 'Valid', 'the spec is valid and supported'],
        ['Enforced', 'True', 'NoPodsSelected', 'no node runs a pod this policy selects'],
      ],
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const specs = policyConditionSpecs(c.input, realize(c.input, nodes));
      assert.deepEqual(specs.map((s) => [s.type, s.status, s.reason, s.message]), c.expected);
    });
  }

  test('names at most ten pending nodes, then says how many more', () => {
    const many = Array.from({ length: 12 }, (_, i) => `n${String(i).padStart(2, '0')}`);
    const [, enforced] = policyConditionSpecs(policy(many), realize(policy(many), nodes));
    assert.equal(enforced.message, `12 of 12 nodes have not realized generation 3: ${many.slice(0, 10).join(', ')} and 2 more`);
  });
});

describe('buildPolicyStatus', () => {
  test('builds the exact status JSON, with observedGeneration on the object and on each condition', () => {
    const p = policy(['node-a', 'node-b']);
    const status = buildPolicyStatus(p, realize(p, nodes), undefined, T0);
    assert.equal(
      JSON.stringify(status),
      JSON.stringify({
        observedGeneration: 3,
        conditions: [
          { type: 'Accepted', status: 'True', observedGeneration: 3, lastTransitionTime: '2025-06-01T12:00:00Z', reason: 'Valid', message: 'the spec is valid and supported' },
          {
            type: 'Enforced',
            status: 'False',
            observedGeneration: 3,
            lastTransitionTime: '2025-06-01T12:00:00Z',
            reason: 'NodesPending',
            message: '1 of 2 nodes have not realized generation 3: node-b',
          },
        ],
        nodesDesired: 2,
        nodesRealized: 1,
        realized: '1/2',
        nodesPending: ['node-b'],
      }),
    );
    assert.deepEqual(parsePolicyStatus(JSON.parse(JSON.stringify(status))), status);
  });

  test('keeps the transition time of an unchanged condition across generations', () => {
    const p3 = policy(['node-a']);
    const first = buildPolicyStatus(p3, realize(p3, nodes), undefined, T0);
    const p4 = policy(['node-a'], 4);
    const second = buildPolicyStatus(p4, realize(p4, nodes), first.conditions, T0 + 60_000);
    assert.deepEqual(second.conditions.map((c) => [c.type, c.status, c.lastTransitionTime, c.observedGeneration]), [
      ['Accepted', 'True', '2025-06-01T12:00:00Z', 4],
      ['Enforced', 'False', '2025-06-01T12:01:00Z', 4],
    ]);
  });
});
