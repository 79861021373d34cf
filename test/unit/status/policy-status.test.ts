import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { buildPolicyStatus, parsePolicyStatus, policyConditionSpecs } from '../../../src/status/policy-status.ts';
import type { PolicyStatusInput, Realization } from '../../../src/status/policy-status.ts';
import { createRealizationTracker, digestOf } from '../../../src/status/realization.ts';
import { pendingOnNodeB } from './pending-conditions.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const policy = (desiredNodes: string[], generation = 3, accepted = { ok: true, message: '' }): PolicyStatusInput => ({
  namespace: 'shop',
  name: 'web',
  uid: 'u-web',
  generation,
  accepted,
  desiredNodes,
});
/** node-a holds web at generation 3, node-b at 2. (./realization.test.ts covers the rest.) */
const nodes = new Map([
  ['node-a', digestOf([{ uid: 'u-web', generation: 3 }])],
  ['node-b', digestOf([{ uid: 'u-web', generation: 2 }])],
]);
const realize = (p: PolicyStatusInput): Realization => createRealizationTracker().update([p], nodes).get(p.uid)!;

describe('policyConditionSpecs', () => {
  const cases: { name: string; input: PolicyStatusInput; expected: [string, string, string, string][] }[] = [
    {
      name: 'accepted and realized everywhere',
      input: policy(['node-a']),
      expected: [
        ['Accepted', 'True', 'Valid', 'the spec is valid and supported'],
        ['Enforced', 'True', 'AllNodesRealized', '1/1 nodes enforce generation 3'],
      ],
    },
    {
      name: 'an audit-only policy is never reported enforced, wherever its nodes stand',
      input: { ...policy(['node-a', 'node-b']), mode: 'audit' },
      expected: [
        ['Accepted', 'True', 'Valid', 'the spec is valid and supported'],
        ['Enforced', 'False', 'AuditOnly', 'audit-only (weir.dev/enforcement: audit), never enforced: 1/2 nodes log what generation 3 would drop'],
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
      const specs = policyConditionSpecs(c.input, realize(c.input));
      assert.deepEqual(
        specs.map((s) => [s.type, s.status, s.reason, s.message]),
        c.expected,
      );
    });
  }

  test('names at most ten pending nodes, then says how many more', () => {
    const many = Array.from({ length: 12 }, (_, i) => `n${String(i).padStart(2, '0')}`);
    const [, enforced] = policyConditionSpecs(policy(many), realize(policy(many)));
    assert.equal(enforced.message, `12 of 12 nodes have not realized generation 3: ${many.slice(0, 10).join(', ')} and 2 more`);
  });
});

describe('buildPolicyStatus', () => {
  test('builds the exact status JSON, with observedGeneration on the object and on each condition', () => {
    const p = policy(['node-a', 'node-b']);
    const status = buildPolicyStatus(p, realize(p), undefined, T0);
    assert.equal(
      JSON.stringify(status),
      JSON.stringify({
        observedGeneration: 3,
        conditions: pendingOnNodeB(3),
        nodesDesired: 2,
        nodesRealized: 1,
        realized: '1/2',
        nodesPending: ['node-b'],
        mode: 'enforce',
      }),
    );
    assert.deepEqual(parsePolicyStatus(JSON.parse(JSON.stringify(status))), status);
  });

  test('keeps the transition time of an unchanged condition across generations', () => {
    const p3 = policy(['node-a']);
    const first = buildPolicyStatus(p3, realize(p3), undefined, T0);
    const p4 = policy(['node-a'], 4);
    const second = buildPolicyStatus(p4, realize(p4), first.conditions, T0 + 60_000);
    assert.deepEqual(
      second.conditions.map((c) => [c.type, c.status, c.lastTransitionTime, c.observedGeneration]),
      [
        ['Accepted', 'True', '2025-06-01T12:00:00Z', 4],
        ['Enforced', 'False', '2025-06-01T12:01:00Z', 4],
      ],
    );
  });
});
