import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { buildClusterPolicyConditions, ownClusterPolicyConditions, sameConditions } from '../../../src/status/cluster-policy-status.ts';
import type { ClusterPolicyStatusInput } from '../../../src/status/cluster-policy-status.ts';
import type { Realization } from '../../../src/status/policy-status.ts';
import { createRealizationTracker, digestOf } from '../../../src/status/realization.ts';
import { pendingOnNodeB } from './pending-conditions.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const cnp = (desiredNodes: string[], generation = 2, accepted = { ok: true, message: '' }): ClusterPolicyStatusInput => ({
  name: 'db-only-from-backend',
  uid: 'u-cnp',
  generation,
  accepted,
  desiredNodes,
});
/** node-a holds the policy at generation 2, node-b at 1. */
const nodes = new Map([
  ['node-a', digestOf([{ uid: 'u-cnp', generation: 2 }])],
  ['node-b', digestOf([{ uid: 'u-cnp', generation: 1 }])],
]);
const realize = (p: ClusterPolicyStatusInput): Realization => createRealizationTracker().update([p], nodes).get(p.uid)!;

describe('buildClusterPolicyConditions', () => {
  test('Accepted and Enforced, each with the generation it describes, as metav1.Conditions', () => {
    const p = cnp(['node-a', 'node-b']);
    assert.deepEqual(buildClusterPolicyConditions(p, realize(p), undefined, T0), pendingOnNodeB(2));
  });

  test('an invalid policy is not Accepted, with every field error; Enforced still says whether its nodes hold it (it fails closed)', () => {
    const message = 'spec.egress[0].to[0].nodes: not supported by Weir';
    const p = cnp(['node-a'], 2, { ok: false, message });
    assert.deepEqual(
      buildClusterPolicyConditions(p, realize(p), undefined, T0).map((c) => [c.type, c.status, c.reason, c.message]),
      [
        ['Accepted', 'False', 'Invalid', message],
        ['Enforced', 'True', 'AllNodesRealized', '1/1 nodes enforce generation 2'],
      ],
    );
  });

  test('no pod in its subject: Enforced, NoPodsSelected', () => {
    const p = cnp([]);
    assert.deepEqual(
      buildClusterPolicyConditions(p, realize(p), undefined, T0).map((c) => [c.type, c.status, c.reason]),
      [
        ['Accepted', 'True', 'Valid'],
        ['Enforced', 'True', 'NoPodsSelected'],
      ],
    );
  });

  test('a condition whose status holds keeps its transition time; one that flips gets now', () => {
    const p = cnp(['node-a', 'node-b']);
    const first = buildClusterPolicyConditions(p, realize(p), undefined, T0);
    const q = cnp(['node-a']);
    const second = buildClusterPolicyConditions(q, realize(q), first, T0 + 60_000);
    assert.deepEqual(
      second.map((c) => [c.type, c.status, c.lastTransitionTime]),
      [
        ['Accepted', 'True', '2025-06-01T12:00:00Z'],
        ['Enforced', 'True', '2025-06-01T12:01:00Z'],
      ],
    );
  });
});

describe('ownClusterPolicyConditions', () => {
  test("reads back Weir's two conditions from a status it shares with other writers, sorted by type", () => {
    const p = cnp(['node-a']);
    const ours = buildClusterPolicyConditions(p, realize(p), undefined, T0);
    const other = { type: 'Ready', status: 'True', lastTransitionTime: '2025-06-01T11:00:00Z', reason: 'Other', message: 'another implementation' };
    const raw = JSON.parse(JSON.stringify({ conditions: [ours[1], other, ours[0], { type: 'Accepted' }] })) as unknown;
    assert.deepEqual(ownClusterPolicyConditions(raw), ours);
    assert.deepEqual(ownClusterPolicyConditions(undefined), []);
    assert.deepEqual(ownClusterPolicyConditions({ conditions: 'nope' }), []);
  });
});

describe('sameConditions', () => {
  const p = cnp(['node-a']);
  const c = buildClusterPolicyConditions(p, realize(p), undefined, T0);
  test('equal in any order', () => {
    assert.equal(sameConditions(c, [c[1], c[0]]), true);
  });
  test('any field differing, or a condition missing, is a difference', () => {
    for (const field of ['status', 'reason', 'message', 'lastTransitionTime', 'observedGeneration'] as const) {
      const changed = [{ ...c[0], [field]: field === 'observedGeneration' ? 3 : 'False' }, c[1]];
      assert.equal(sameConditions(c, changed), false, field);
    }
    assert.equal(sameConditions(c, [c[0]]), false);
  });
});
