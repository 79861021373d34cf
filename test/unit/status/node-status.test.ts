import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { buildNodeStatus, nodeConditionSpecs, nodeStatusNeedsWrite, parseNodeStatus } from '../../../src/status/node-status.ts';
import type { NodeStatusInput } from '../../../src/status/node-status.ts';
import { REASON_PATTERN } from '../../../src/status/conditions.ts';
import { nodeStatusBody } from '../../../src/status/bodies.ts';
import { DIGEST_BUCKETS, digestOf, encodeDigest } from '../../../src/status/realization.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const counts = { localPods: 3, policies: 2, sets: 4, chains: 9, rules: 40 };
const healthy: NodeStatusInput = {
  synced: true,
  lastApply: { ok: true },
  lastSyncTime: T0,
  counts,
  policies: [
    { namespace: 'shop', name: 'web', uid: 'u-web', generation: 3 },
    { namespace: 'default', name: 'deny', uid: 'u-deny', generation: 1 },
  ],
};
const invalid = (n: number) =>
  Array.from({ length: n }, (_, i) => ({ namespace: 'ns', name: `bad-${i}`, uid: `u-bad-${i}`, generation: 1, error: `spec.ingress[${i}].ports[0].port: must be 1-65535` }));

describe('nodeConditionSpecs', () => {
  const cases: { name: string; input: NodeStatusInput; expected: [string, string, string][] }[] = [
    {
      name: 'before the source synced: not ready, nothing applied yet',
      input: { ...healthy, synced: false, lastApply: null, lastSyncTime: null },
      expected: [
        ['Ready', 'False', 'WaitingForSync'],
        ['Programmed', 'Unknown', 'NotYetApplied'],
        ['Degraded', 'False', 'AsExpected'],
      ],
    },
    {
      name: 'synced but no apply yet',
      input: { ...healthy, lastApply: null },
      expected: [
        ['Ready', 'False', 'NotYetApplied'],
        ['Programmed', 'Unknown', 'NotYetApplied'],
        ['Degraded', 'False', 'AsExpected'],
      ],
    },
    {
      name: 'synced and applied: ready, programmed, not degraded',
      input: healthy,
      expected: [
        ['Ready', 'True', 'Synced'],
        ['Programmed', 'True', 'Applied'],
        ['Degraded', 'False', 'AsExpected'],
      ],
    },
    {
      name: 'a failed apply: not ready, not programmed, degraded',
      input: { ...healthy, lastApply: { ok: false, message: 'iptables-restore: line 4 failed' } },
      expected: [
        ['Ready', 'False', 'ApplyFailed'],
        ['Programmed', 'False', 'ApplyFailed'],
        ['Degraded', 'True', 'ApplyFailed'],
      ],
    },
    {
      name: 'invalid policies degrade a node that is otherwise ready',
      input: { ...healthy, policies: [...healthy.policies, ...invalid(1)] },
      expected: [
        ['Ready', 'True', 'Synced'],
        ['Programmed', 'True', 'Applied'],
        ['Degraded', 'True', 'InvalidPolicies'],
      ],
    },
    {
      name: 'a host problem degrades the node with its own reason',
      input: { ...healthy, problems: [{ reason: 'BrNetfilterDisabled', message: 'bridge-nf-call-iptables is 0' }] },
      expected: [
        ['Ready', 'True', 'Synced'],
        ['Programmed', 'True', 'Applied'],
        ['Degraded', 'True', 'BrNetfilterDisabled'],
      ],
    },
    {
      name: 'a problem reason that is not CamelCase is replaced, so the write cannot be rejected',
      input: { ...healthy, problems: [{ reason: 'br_netfilter off!', message: 'x' }] },
      expected: [
        ['Ready', 'True', 'Synced'],
        ['Programmed', 'True', 'Applied'],
        ['Degraded', 'True', 'NodeProblem'],
      ],
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const specs = nodeConditionSpecs(c.input);
      assert.deepEqual(
        specs.map((s) => [s.type, s.status, s.reason]),
        c.expected,
      );
      for (const s of specs) assert.match(s.reason, REASON_PATTERN);
    });
  }

  test('Degraded lists every problem, apply failure first, and names at most five invalid policies', () => {
    const input: NodeStatusInput = {
      ...healthy,
      lastApply: { ok: false, message: 'boom' },
      policies: invalid(7),
      problems: [{ reason: 'BrNetfilterDisabled', message: 'br_netfilter is off' }],
    };
    const degraded = nodeConditionSpecs(input)[2];
    assert.equal(degraded.reason, 'ApplyFailed');
    assert.equal(
      degraded.message,
      'apply failed: boom; 7 invalid policies isolate their pods: ' +
        [0, 1, 2, 3, 4].map((i) => `ns/bad-${i} (spec.ingress[${i}].ports[0].port: must be 1-65535)`).join(', ') +
        ' and 2 more; br_netfilter is off',
    );
  });

  test('an invalid ClusterNetworkPolicy (cluster-scoped: namespace empty) is named by its kind in Degraded', () => {
    const cnp = { namespace: '', name: 'db-only', uid: 'u-cnp', generation: 2, error: 'spec.egress[0].to[0].nodes: not supported by Weir' };
    const degraded = nodeConditionSpecs({ ...healthy, policies: [...healthy.policies, cnp, ...invalid(1)] })[2];
    assert.equal(
      degraded.message,
      '2 invalid policies isolate their pods: ClusterNetworkPolicy db-only (spec.egress[0].to[0].nodes: not supported by Weir), ns/bad-0 (spec.ingress[0].ports[0].port: must be 1-65535)',
    );
  });
});

describe('buildNodeStatus', () => {
  test('builds the exact status JSON: counts, failing policies, the digest of every enforced policy, timestamps in seconds', () => {
    const status = buildNodeStatus({ ...healthy, policies: [...healthy.policies, ...invalid(1)] }, undefined, T0 + 5_000);
    assert.equal(
      JSON.stringify(status),
      JSON.stringify({
        conditions: [
          { type: 'Ready', status: 'True', lastTransitionTime: '2025-06-01T12:00:05Z', reason: 'Synced', message: 'synced with the cluster; the kernel holds the latest policy state' },
          { type: 'Programmed', status: 'True', lastTransitionTime: '2025-06-01T12:00:05Z', reason: 'Applied', message: 'the last apply succeeded' },
          {
            type: 'Degraded',
            status: 'True',
            lastTransitionTime: '2025-06-01T12:00:05Z',
            reason: 'InvalidPolicies',
            message: '1 invalid policy isolates its pods: ns/bad-0 (spec.ingress[0].ports[0].port: must be 1-65535)',
          },
        ],
        lastSyncTime: '2025-06-01T12:00:00Z',
        counts: { localPods: 3, policies: 2, sets: 4, chains: 9, rules: 40, failingPolicies: 1 },
        failingPolicies: [{ namespace: 'ns', name: 'bad-0', uid: 'u-bad-0', generation: 1, error: 'spec.ingress[0].ports[0].port: must be 1-65535' }],
        failingPoliciesOmitted: 0,
        applyFailures: [],
        policyDigest: { buckets: DIGEST_BUCKETS, digests: encodeDigest(digestOf([...healthy.policies, ...invalid(1)])) },
      }),
    );
  });

  test('leaves lastSyncTime out before the first sync', () => {
    assert.equal(Object.hasOwn(buildNodeStatus({ ...healthy, lastSyncTime: null }, undefined, T0), 'lastSyncTime'), false);
  });

  test('lists the first 20 failing policies, sorted, and counts the rest', () => {
    const status = buildNodeStatus({ ...healthy, policies: [...healthy.policies, ...invalid(25).reverse()] }, undefined, T0);
    assert.equal(status.counts.failingPolicies, 25);
    assert.equal(status.failingPoliciesOmitted, 5);
    assert.deepEqual(
      status.failingPolicies.map((p) => p.name),
      invalid(25)
        .map((p) => p.name)
        .sort()
        .slice(0, 20),
    );
  });

  test('lists the policies a failing apply carried, and drops them once an apply succeeds', () => {
    const carried = invalid(25).map((p) => ({ ...p, error: 'iptables-restore: line 4 failed' }));
    const failing = buildNodeStatus({ ...healthy, lastApply: { ok: false, message: 'iptables-restore: line 4 failed' }, applyFailures: carried }, undefined, T0);
    assert.equal(failing.applyFailures.length, 20);
    assert.equal(failing.applyFailures[0]?.error, 'iptables-restore: line 4 failed');
    assert.deepEqual(failing.failingPolicies, [], 'an apply failure is not an invalid policy');
    assert.deepEqual(buildNodeStatus({ ...healthy, applyFailures: carried }, undefined, T0).applyFailures, []);
    assert.deepEqual(buildNodeStatus({ ...healthy, lastApply: null, applyFailures: carried }, undefined, T0).applyFailures, []);
  });

  test('after an uninstall removed the rules: not ready, not programmed (Removed), nothing enforced, the token kept', () => {
    const status = buildNodeStatus({ ...healthy, policies: [], removedFor: '20261128123000-abcdef' }, undefined, T0);
    assert.deepEqual(
      status.conditions.map((c) => [c.type, c.status, c.reason]),
      [
        ['Ready', 'False', 'Removed'],
        ['Programmed', 'False', 'Removed'],
        ['Degraded', 'False', 'AsExpected'],
      ],
    );
    assert.match(status.conditions[1]!.message, /uninstall 20261128123000-abcdef: every chain, hook rule and ipset/);
    assert.equal(status.removedFor, '20261128123000-abcdef');
    assert.deepEqual(parseNodeStatus(JSON.parse(JSON.stringify(status))), status);
    assert.equal(Object.hasOwn(buildNodeStatus(healthy, undefined, T0), 'removedFor'), false);
  });

  test('reads back what it writes', () => {
    const status = buildNodeStatus({ ...healthy, policies: invalid(2), lastApply: { ok: false, message: 'x' }, applyFailures: invalid(1) }, undefined, T0);
    assert.equal(status.applyFailures.length, 1);
    assert.deepEqual(parseNodeStatus(JSON.parse(JSON.stringify(status))), status);
  });
});

describe('the size of a NodePolicyStatus', () => {
  // etcd refuses objects over 1.5 MB, and every NodePolicyStatus write goes to the aggregator's
  // watch: the object must not grow with the policies the node enforces.
  const BOUND = 64 * 1024;
  const many = (n: number, bad: number) =>
    Array.from({ length: n }, (_, i) => ({
      namespace: `namespace-${String(i % 500).padStart(40, '0')}`,
      name: `policy-${String(i).padStart(200, 'x')}`,
      uid: `0000${String(i).padStart(8, '0')}-aaaa-bbbb-cccc-dddddddddddd`,
      generation: 1 + (i % 7),
      ...(i < bad ? { error: `spec.ingress[0].from[${i}].ipBlock.cidr: ${'invalid CIDR '.repeat(60)}` } : {}),
    }));

  test(`20,000 policies on the node, 500 of them invalid: the status body stays under ${BOUND} bytes`, () => {
    const input: NodeStatusInput = { ...healthy, counts: { ...counts, policies: 20_000 }, policies: many(20_000, 500) };
    const bytes = Buffer.byteLength(JSON.stringify(nodeStatusBody('node-a', buildNodeStatus(input, undefined, T0))));
    assert.ok(bytes < BOUND, `${bytes} bytes`);
  });

  test('the same bound holds with 20 policies as with 20,000 (it does not grow with the count)', () => {
    const size = (n: number) => Buffer.byteLength(JSON.stringify(buildNodeStatus({ ...healthy, policies: many(n, 0) }, undefined, T0)));
    assert.ok(size(20_000) - size(20) < 64, `${size(20)} vs ${size(20_000)} bytes`);
  });
});

describe('nodeStatusNeedsWrite', () => {
  const HEARTBEAT = 300_000;
  const stored = buildNodeStatus(healthy, undefined, T0);
  const at = (input: NodeStatusInput, now = T0 + 1_000) => buildNodeStatus(input, stored.conditions, now);
  const cases: { name: string; stored: typeof stored | null; next: typeof stored; expected: boolean }[] = [
    { name: 'nothing stored yet', stored: null, next: stored, expected: true },
    { name: 'identical content', stored, next: at(healthy), expected: false },
    { name: 'a count changed', stored, next: at({ ...healthy, counts: { ...counts, rules: 41 } }), expected: true },
    { name: 'a policy generation changed', stored, next: at({ ...healthy, policies: [{ ...healthy.policies[0], generation: 4 }, healthy.policies[1]] }), expected: true },
    { name: 'a condition changed', stored, next: at({ ...healthy, lastApply: { ok: false, message: 'x' } }), expected: true },
    { name: 'only lastSyncTime moved, less than the heartbeat', stored, next: at({ ...healthy, lastSyncTime: T0 + HEARTBEAT - 1_000 }), expected: false },
    { name: 'only lastSyncTime moved, by the heartbeat', stored, next: at({ ...healthy, lastSyncTime: T0 + HEARTBEAT }), expected: true },
    { name: 'the first lastSyncTime', stored: buildNodeStatus({ ...healthy, lastSyncTime: null }, undefined, T0), next: at(healthy), expected: true },
  ];
  for (const c of cases) {
    test(c.name, () => assert.equal(nodeStatusNeedsWrite(c.stored, c.next, HEARTBEAT), c.expected));
  }
});
