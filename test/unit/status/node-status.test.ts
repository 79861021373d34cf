import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { buildNodeStatus, nodeConditionSpecs, nodeStatusNeedsWrite, parseNodeStatus } from '../../../src/status/node-status.ts';
import type { NodeStatusInput } from '../../../src/status/node-status.ts';
import { REASON_PATTERN } from '../../../src/status/conditions.ts';

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
      expected: [['Ready', 'False', 'WaitingForSync'], ['Programmed', 'Unknown', 'NotYetApplied'], ['Degraded', 'False', 'AsExpected']],
    },
    {
      name: 'synced but no apply yet',
      input: { ...healthy, lastApply: null },
      expected: [['Ready', 'False', 'NotYetApplied'], ['Programmed', 'Unknown', 'NotYetApplied'], ['Degraded', 'False', 'AsExpected']],
    },
    {
      name: 'synced and applied: ready, programmed, not degraded',
      input: healthy,
      expected: [['Ready', 'True', 'Synced'], ['Programmed', 'True', 'Applied'], ['Degraded', 'False', 'AsExpected']],
    },
    {
      name: 'a failed apply: not ready, not programmed, degraded',
      input: { ...healthy, lastApply: { ok: false, message: 'iptables-restore: line 4 failed' } },
      expected: [['Ready', 'False', 'ApplyFailed'], ['Programmed', 'False', 'ApplyFailed'], ['Degraded', 'True', 'ApplyFailed']],
    },
    {
      name: 'invalid policies degrade a node that is otherwise ready',
      input: { ...healthy, policies: [...healthy.policies, ...invalid(1)] },
      expected: [['Ready', 'True', 'Synced'], ['Programmed', 'True', 'Applied'], ['Degraded', 'True', 'InvalidPolicies']],
    },
    {
      name: 'a host problem degrades the node with its own reason',
      input: { ...healthy, problems: [{ reason: 'BrNetfilterDisabled', message: 'bridge-nf-call-iptables is 0' }] },
      expected: [['Ready', 'True', 'Synced'], ['Programmed', 'True', 'Applied'], ['Degraded', 'True', 'BrNetfilterDisabled']],
    },
    {
      name: 'a problem reason that is not CamelCase is replaced, so the write cannot be rejected',
      input: { ...healthy, problems: [{ reason: 'br_netfilter off!', message: 'x' }] },
      expected: [['Ready', 'True', 'Synced'], ['Programmed', 'True', 'Applied'], ['Degraded', 'True', 'NodeProblem']],
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const specs = nodeConditionSpecs(c.input);
      assert.deepEqual(specs.map((s) => [s.type, s.status, s.reason]), c.expected);
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
});

describe('buildNodeStatus', () => {
  test('builds the exact status JSON: policies sorted, timestamps in seconds', () => {
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
        counts: { localPods: 3, policies: 2, sets: 4, chains: 9, rules: 40 },
        policies: [
          { namespace: 'default', name: 'deny', uid: 'u-deny', generation: 1 },
          { namespace: 'ns', name: 'bad-0', uid: 'u-bad-0', generation: 1, error: 'spec.ingress[0].ports[0].port: must be 1-65535' },
          { namespace: 'shop', name: 'web', uid: 'u-web', generation: 3 },
        ],
      }),
    );
  });

  test('leaves lastSyncTime out before the first sync', () => {
    assert.equal(Object.hasOwn(buildNodeStatus({ ...healthy, lastSyncTime: null }, undefined, T0), 'lastSyncTime'), false);
  });

  test('reads back what it writes', () => {
    const status = buildNodeStatus({ ...healthy, policies: invalid(2) }, undefined, T0);
    assert.deepEqual(parseNodeStatus(JSON.parse(JSON.stringify(status))), status);
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
