import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { decideLease, leaseBody, nextLeaseSpec, observe, parseLease } from '../../../src/controller/lease.ts';
import type { LeaseRecord } from '../../../src/controller/lease.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const rec = (holder: string | null, extra: Partial<LeaseRecord> = {}): LeaseRecord => ({
  holder,
  leaseDurationSeconds: 15,
  acquireTime: '2025-06-01T11:00:00.000000Z',
  renewTime: '2025-06-01T11:59:59.000000Z',
  leaseTransitions: 2,
  resourceVersion: '7',
  ...extra,
});

describe('decideLease', () => {
  const cases: { name: string; rec: LeaseRecord | null; seenSince: number | null; now: number; expected: ReturnType<typeof decideLease> }[] = [
    { name: 'no Lease: create it', rec: null, seenSince: null, now: T0, expected: { kind: 'create' } },
    { name: 'ours: renew', rec: rec('me'), seenSince: T0 - 60_000, now: T0, expected: { kind: 'renew' } },
    { name: 'released (no holder): take it', rec: rec(null), seenSince: T0, now: T0, expected: { kind: 'take' } },
    { name: 'another holder, just seen: wait the whole duration', rec: rec('other'), seenSince: T0, now: T0, expected: { kind: 'wait', holder: 'other', expiresInMs: 15_000 } },
    { name: 'another holder, unchanged for 10 s: wait 5 s more', rec: rec('other'), seenSince: T0 - 10_000, now: T0, expected: { kind: 'wait', holder: 'other', expiresInMs: 5_000 } },
    { name: 'another holder, unchanged for the duration: expired, take it', rec: rec('other'), seenSince: T0 - 15_000, now: T0, expected: { kind: 'take' } },
    {
      name: "the holder's own duration counts, not ours",
      rec: rec('other', { leaseDurationSeconds: 60 }),
      seenSince: T0 - 15_000,
      now: T0,
      expected: { kind: 'wait', holder: 'other', expiresInMs: 45_000 },
    },
    {
      name: 'an old renewTime does not matter, only how long we have seen it unchanged (clock skew)',
      rec: rec('other', { renewTime: '2000-01-01T00:00:00.000000Z' }),
      seenSince: T0,
      now: T0 + 1_000,
      expected: { kind: 'wait', holder: 'other', expiresInMs: 14_000 },
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const obs = c.seenSince === null || c.rec === null ? null : { ...observe(null, c.rec, c.seenSince) };
      assert.deepEqual(decideLease(c.rec, obs, 'me', c.now, 15), c.expected);
    });
  }
});

describe('observe', () => {
  test('keeps the first-seen time while the record is unchanged, restarts it on a renewal', () => {
    const a = observe(null, rec('other'), T0);
    assert.equal(observe(a, rec('other', { resourceVersion: '8' }), T0 + 5_000).sinceMs, T0, 'resourceVersion alone is no renewal');
    assert.equal(observe(a, rec('other', { renewTime: '2025-06-01T12:00:04.000000Z' }), T0 + 5_000).sinceMs, T0 + 5_000);
    assert.equal(observe(a, rec('third'), T0 + 5_000).sinceMs, T0 + 5_000);
  });
});

describe('nextLeaseSpec and leaseBody', () => {
  const cases: { name: string; action: 'create' | 'renew' | 'take' | 'release'; expected: object }[] = [
    {
      name: 'create: ours, no transitions yet',
      action: 'create',
      expected: { holderIdentity: 'me', leaseDurationSeconds: 15, acquireTime: '2025-06-01T12:00:00.000000Z', renewTime: '2025-06-01T12:00:00.000000Z', leaseTransitions: 0 },
    },
    {
      name: 'renew: keeps acquireTime and transitions, moves renewTime',
      action: 'renew',
      expected: { holderIdentity: 'me', leaseDurationSeconds: 15, acquireTime: '2025-06-01T11:00:00.000000Z', renewTime: '2025-06-01T12:00:00.000000Z', leaseTransitions: 2 },
    },
    {
      name: 'take: a new term, one more transition',
      action: 'take',
      expected: { holderIdentity: 'me', leaseDurationSeconds: 15, acquireTime: '2025-06-01T12:00:00.000000Z', renewTime: '2025-06-01T12:00:00.000000Z', leaseTransitions: 3 },
    },
    {
      name: 'release: no holder, so the next agent takes it at once',
      action: 'release',
      expected: { leaseDurationSeconds: 15, renewTime: '2025-06-01T12:00:00.000000Z', leaseTransitions: 2 },
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const body = leaseBody('kube-system', 'weir-policy-status', nextLeaseSpec(c.action, rec('me'), 'me', 15, T0), '7');
      assert.equal(
        JSON.stringify(body),
        JSON.stringify({
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: { name: 'weir-policy-status', namespace: 'kube-system', resourceVersion: '7' },
          spec: c.expected,
        }),
      );
    });
  }
  test('a create body has no resourceVersion', () => {
    const body = leaseBody('kube-system', 'l', nextLeaseSpec('create', null, 'me', 15, T0)) as { metadata: object };
    assert.deepEqual(body.metadata, { name: 'l', namespace: 'kube-system' });
  });
});

describe('parseLease', () => {
  test('reads a Lease; empty holderIdentity means free', () => {
    const raw = {
      metadata: { resourceVersion: '42' },
      spec: { holderIdentity: '', leaseDurationSeconds: 15, renewTime: '2025-06-01T12:00:00.000000Z', leaseTransitions: 4 },
    };
    assert.deepEqual(parseLease(raw), {
      holder: null,
      leaseDurationSeconds: 15,
      acquireTime: null,
      renewTime: '2025-06-01T12:00:00.000000Z',
      leaseTransitions: 4,
      resourceVersion: '42',
    });
  });
});
