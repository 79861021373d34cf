// The policy status aggregator against a loopback fake API server (not a real kube-apiserver:
// see test/integration/status.test.ts for that): Lease election, and the NetworkPolicyStatus
// objects only the holder writes.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { createPolicyStatusAggregator } from '../../../src/controller/aggregator.ts';
import type { PolicyStatusAggregator } from '../../../src/controller/aggregator.ts';
import type { ClusterPolicyStatusInput } from '../../../src/status/cluster-policy-status.ts';
import type { PassResult, PolicyStatusInput } from '../../../src/status/index.ts';
import { buildNodeStatus } from '../../../src/status/node-status.ts';
import { captureLog, FakeApi, FakeClock, isList, Results, settle, until } from '../status/fake-api.ts';
import { pendingOnNodeB } from '../status/pending-conditions.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const LEASE = '/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/weir-policy-status';
const LEASES = '/apis/coordination.k8s.io/v1/namespaces/kube-system/leases';
const NPS = (node: string) => `/apis/weir.dev/v1alpha1/nodepolicystatuses/${node}`;
const POLSTATUS = (ns: string, name: string) => `/apis/weir.dev/v1alpha1/namespaces/${ns}/networkpolicystatuses/${name}`;
const CNP = (name: string) => `/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies/${name}`;

const web = (generation: number, desiredNodes: string[]): PolicyStatusInput => ({
  namespace: 'shop',
  name: 'web',
  uid: 'u-web',
  generation,
  accepted: { ok: true, message: '' },
  desiredNodes,
});
const bad: PolicyStatusInput = {
  namespace: 'shop',
  name: 'bad',
  uid: 'u-bad',
  generation: 1,
  accepted: { ok: false, message: 'spec.ingress[0].ports[0].port: must be between 1 and 65535' },
  desiredNodes: [],
};

const guard = (generation: number, desiredNodes: string[], uid = 'u-guard'): ClusterPolicyStatusInput => ({
  name: 'guard',
  uid,
  generation,
  accepted: { ok: true, message: '' },
  desiredNodes,
});

/** A ClusterNetworkPolicy as somebody (kubectl) writes it. */
function clusterPolicy(api: FakeApi, generation: number, more: { uid?: string; labels?: Record<string, string>; status?: unknown } = {}): string {
  const o = api.put(CNP('guard'), {
    apiVersion: 'policy.networking.k8s.io/v1beta1',
    kind: 'ClusterNetworkPolicy',
    metadata: { name: 'guard', uid: more.uid ?? 'u-guard', generation, ...(more.labels ? { labels: more.labels } : {}) },
    spec: { tier: 'Admin', priority: 1, subject: { namespaces: {} } },
    ...(more.status ? { status: more.status } : {}),
  });
  return o.metadata.resourceVersion as string;
}

/** The NodePolicyStatus a node's reporter writes when it enforces `policies`. */
function nodeStatus(api: FakeApi, node: string, policies: { uid: string; generation: number }[]): void {
  const status = buildNodeStatus(
    {
      synced: true,
      lastApply: { ok: true },
      lastSyncTime: T0,
      counts: { localPods: 1, policies: policies.length, sets: 0, chains: 0, rules: 0 },
      policies: policies.map((p) => ({ namespace: 'shop', name: p.uid.slice(2), ...p })),
    },
    undefined,
    T0,
  );
  api.put(NPS(node), { apiVersion: 'weir.dev/v1alpha1', kind: 'NodePolicyStatus', metadata: { name: node }, status: JSON.parse(JSON.stringify(status)) as unknown });
}

function lease(api: FakeApi, holder: string | null, renewMs: number, transitions = 1): void {
  api.put(LEASE, {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name: 'weir-policy-status', namespace: 'kube-system' },
    spec: {
      ...(holder === null ? {} : { holderIdentity: holder }),
      leaseDurationSeconds: 15,
      acquireTime: new Date(T0 - 3_600_000).toISOString(),
      renewTime: new Date(renewMs).toISOString(),
      leaseTransitions: transitions,
    },
  });
}

const leaseSpec = (api: FakeApi) => api.get(LEASE)?.spec as { holderIdentity?: string; leaseTransitions: number; renewTime: string; acquireTime?: string };

describe('policy status aggregator', () => {
  let api: FakeApi;
  let clock: FakeClock;
  let running: PolicyStatusAggregator[];
  let logs: ReturnType<typeof captureLog>;

  beforeEach(async () => {
    api = new FakeApi();
    await api.start();
    clock = new FakeClock(T0);
    running = [];
    passStarts = [];
    logs = captureLog();
  });
  afterEach(async () => {
    for (const a of running) await a.stop();
    await api.stop();
  });

  const start = (identity: string, results?: Results<PassResult>, random?: () => number) => {
    const a = createPolicyStatusAggregator({
      kubeConfig: api.kubeConfig(`token-${identity}`),
      identity,
      log: logs.log,
      clock,
      leaseDurationSeconds: 15,
      minIntervalMs: 2_000,
      retryMinMs: 1_000,
      retryMaxMs: 8_000,
      ...(results ? { onWrite: results.push } : {}),
      ...(random ? { random } : {}),
    });
    running.push(a);
    a.start();
    return a;
  };
  /** node-a started and, once the clock has run its first lease tick, the lease's holder. */
  const holder = async (results?: Results<PassResult>, random?: () => number) => {
    const a = start('node-a', results, random);
    clock.advance(0);
    await until(() => a.isHolder(), 'node-a holds the lease');
    return a;
  };
  const leaseCalls = () => api.requests.filter((r) => r.path.startsWith(LEASES));
  /** When the latest pass started (the clock time of its last status request). */
  let passStarts: number[] = [];
  const lastPass = () => passStarts[passStarts.length - 1] ?? T0;
  /** Waits until a pass is scheduled at `at` (the lists it waits for are real I/O), then moves
   *  the clock there. */
  const passAt = async (at: number) => {
    await until(() => clock.hasTimerAt(at), `a pass scheduled at +${at - T0} ms`);
    clock.advance(at - clock.now());
    passStarts.push(at);
  };
  /** Advances to the next lease tick, waits until it has made `n` lease requests in all and
   *  has scheduled the tick after it (one third of the 15 s duration later). */
  const leaseTick = async (ms: number, n: number) => {
    clock.advance(ms);
    await until(() => leaseCalls().length >= n, `${n} lease requests`);
    await until(() => clock.hasTimerAt(clock.now() + 5_000), 'the next lease tick');
  };

  describe('Lease', () => {
    test('creates a missing Lease, renews it every third of its duration, releases it on stop', async () => {
      const a = await holder();
      assert.deepEqual(
        leaseCalls().map((r) => `${r.method} ${r.path}`),
        [`GET ${LEASE}`, `POST ${LEASES}`],
      );
      const created = leaseSpec(api);
      assert.deepEqual(created, {
        holderIdentity: 'node-a',
        leaseDurationSeconds: 15,
        acquireTime: '2025-06-01T12:00:00.000000Z',
        renewTime: '2025-06-01T12:00:00.000000Z',
        leaseTransitions: 0,
      });

      await leaseTick(5_000, 4);
      const renew = leaseCalls()[3];
      assert.equal(renew.method, 'PUT');
      assert.equal((renew.body as { metadata: { resourceVersion?: string } }).metadata.resourceVersion !== undefined, true, 'a renewal is a compare-and-swap');
      assert.deepEqual(leaseSpec(api), { ...created, renewTime: '2025-06-01T12:00:05.000000Z' });
      assert.equal(a.isHolder(), true);

      await a.stop();
      running = [];
      const released = leaseSpec(api);
      assert.equal(released.holderIdentity, undefined);
      assert.equal(released.leaseTransitions, 0);
    });

    test('waits while another agent renews, takes over one lease duration after the renewals stop', async () => {
      lease(api, 'node-b', T0);
      const a = start('node-a');
      await leaseTick(0, 1);
      assert.equal(a.isHolder(), false);
      await leaseTick(5_000, 2);
      lease(api, 'node-b', T0 + 7_000); // node-b renews at 12:00:07...
      await leaseTick(5_000, 3); // ...seen at 12:00:10: expiry moves to 12:00:25
      await leaseTick(5_000, 4);
      await leaseTick(5_000, 5);
      assert.equal(a.isHolder(), false, 'not before 12:00:25');
      assert.equal(leaseCalls().filter((r) => r.method !== 'GET').length, 0, 'never wrote the Lease while node-b held it');
      await leaseTick(5_000, 7);
      await until(() => a.isHolder(), 'node-a takes over');
      assert.deepEqual(
        { holder: leaseSpec(api).holderIdentity, transitions: leaseSpec(api).leaseTransitions, acquired: leaseSpec(api).acquireTime },
        { holder: 'node-a', transitions: 2, acquired: '2025-06-01T12:00:25.000000Z' },
      );
    });

    test('a released Lease is taken at the next try', async () => {
      lease(api, null, T0, 3);
      await holder();
      assert.equal(leaseSpec(api).leaseTransitions, 4);
    });

    test('a write conflict (409) is resolved by reading the Lease again', async () => {
      lease(api, 'node-b', T0);
      const a = start('node-a');
      for (let i = 1; i <= 3; i++) await leaseTick(i === 1 ? 0 : 5_000, i);
      // At 12:00:15 node-a will take the expired Lease, but node-c gets there first.
      api.fail({ method: 'PUT', path: LEASE, status: 409, reason: 'Conflict', times: 1, onHit: () => lease(api, 'node-c', T0 + 15_000, 2) });
      await leaseTick(5_000, 6);
      assert.deepEqual(
        leaseCalls()
          .slice(3)
          .map((r) => r.method),
        ['GET', 'PUT', 'GET'],
      );
      assert.equal(a.isHolder(), false);
      assert.equal(leaseSpec(api).holderIdentity, 'node-c');
      assert.equal(logs.warnings().length, 0, 'a lost race is no failure');
    });

    test('two agents starting together: exactly one holds the Lease', async () => {
      const a = start('node-a');
      const b = start('node-b');
      clock.advance(0);
      await until(() => a.isHolder() || b.isHolder(), 'somebody holds the lease');
      await until(() => leaseCalls().length >= 5, 'both tried');
      await settle(20);
      assert.notEqual(a.isHolder(), b.isHolder());
      assert.equal(leaseSpec(api).holderIdentity, a.isHolder() ? 'node-a' : 'node-b');
    });
  });

  describe('NetworkPolicyStatus', () => {
    const statusWrites = () => api.writes().filter((r) => r.path.includes('/networkpolicystatuses/'));

    test('the holder writes each policy status with server-side apply, diffed, and deletes orphans', async () => {
      nodeStatus(api, 'node-a', [{ uid: 'u-web', generation: 2 }]);
      nodeStatus(api, 'node-b', [{ uid: 'u-web', generation: 1 }]);
      const orphan = api.put(POLSTATUS('shop', 'gone'), { apiVersion: 'weir.dev/v1alpha1', kind: 'NetworkPolicyStatus', metadata: { name: 'gone', namespace: 'shop' } });
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: [web(2, ['node-a', 'node-b']), bad] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');

      // Policies are written side by side; each one's object before its status; orphans last.
      const order = statusWrites().map((r) => `${r.method} ${r.path}`);
      assert.deepEqual([...order].sort(), [
        `DELETE ${POLSTATUS('shop', 'gone')}`,
        `PATCH ${POLSTATUS('shop', 'bad')}`,
        `PATCH ${POLSTATUS('shop', 'bad')}/status`,
        `PATCH ${POLSTATUS('shop', 'web')}`,
        `PATCH ${POLSTATUS('shop', 'web')}/status`,
      ]);
      for (const name of ['bad', 'web']) assert.ok(order.indexOf(`PATCH ${POLSTATUS('shop', name)}`) < order.indexOf(`PATCH ${POLSTATUS('shop', name)}/status`));
      assert.equal(order[4], `DELETE ${POLSTATUS('shop', 'gone')}`);
      const deletion = statusWrites().find((r) => r.method === 'DELETE')!;
      for (const r of statusWrites().filter((w) => w.method === 'PATCH')) {
        assert.equal(r.contentType, 'application/apply-patch+yaml');
        assert.equal(r.query.get('fieldManager'), 'weir-aggregator');
        assert.equal(r.query.get('force'), 'true');
      }
      assert.deepEqual(deletion.body, { apiVersion: 'v1', kind: 'DeleteOptions', preconditions: { uid: orphan.metadata.uid } });
      assert.equal(api.get(POLSTATUS('shop', 'gone')), undefined);

      const webObj = api.get(POLSTATUS('shop', 'web'))!;
      assert.deepEqual(webObj.metadata.ownerReferences, [{ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', name: 'web', uid: 'u-web' }]);
      assert.deepEqual(webObj.status, {
        observedGeneration: 2,
        conditions: pendingOnNodeB(2),
        nodesDesired: 2,
        nodesRealized: 1,
        realized: '1/2',
        nodesPending: ['node-b'],
        mode: 'enforce',
      });
      const badStatus = api.get(POLSTATUS('shop', 'bad'))!.status as { conditions: { type: string; status: string; message: string }[] };
      assert.deepEqual(badStatus.conditions[0], {
        type: 'Accepted',
        status: 'False',
        observedGeneration: 1,
        lastTransitionTime: '2025-06-01T12:00:00Z',
        reason: 'Invalid',
        message: 'spec.ingress[0].ports[0].port: must be between 1 and 65535',
      });

      // node-b catches up; its watch event brings a pass (no new input) at the next interval.
      nodeStatus(api, 'node-b', [{ uid: 'u-web', generation: 2 }]);
      const before = statusWrites().length;
      await passAt(T0 + 2_000);

      assert.equal(await results.next(), 'ok');
      assert.deepEqual(
        statusWrites()
          .slice(before)
          .map((r) => `${r.method} ${r.path}`),
        [`PATCH ${POLSTATUS('shop', 'web')}/status`],
      );
      const enforced = api.get(POLSTATUS('shop', 'web'))!.status as { conditions: { type: string; status: string; lastTransitionTime: string }[]; realized: string };
      assert.equal(enforced.realized, '2/2');
      assert.deepEqual(
        enforced.conditions.map((c) => [c.type, c.status, c.lastTransitionTime]),
        [
          ['Accepted', 'True', '2025-06-01T12:00:00Z'],
          ['Enforced', 'True', '2025-06-01T12:00:02Z'],
        ],
      );
    });

    test('once watching, the holder lists nothing more: a pass runs only when a node status or the input changes', async () => {
      nodeStatus(api, 'node-a', [{ uid: 'u-web', generation: 1 }]);
      nodeStatus(api, 'node-b', [{ uid: 'u-web', generation: 1 }]);
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: [web(2, ['node-a', 'node-b'])] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');
      assert.equal((api.get(POLSTATUS('shop', 'web'))!.status as { realized: string }).realized, '0/2');
      const lists = api.requests.filter(isList).length;
      assert.equal(lists, 2, 'one list of each kind');
      const passes = results.all.length;

      // A minute of lease renewals with nothing new: no list, no pass.
      for (let i = 0; i < 12; i++) await leaseTick(5_000, leaseCalls().length + 2);
      assert.equal(a.isHolder(), true);
      assert.equal(api.requests.filter(isList).length, lists, 'no list while watching');
      assert.equal(results.all.length, passes, 'no pass without a change');

      // The nodes catch up one after the other; each change arrives by the watch.
      nodeStatus(api, 'node-a', [{ uid: 'u-web', generation: 2 }]);
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');
      assert.equal((api.get(POLSTATUS('shop', 'web'))!.status as { realized: string }).realized, '1/2');
      nodeStatus(api, 'node-b', [{ uid: 'u-web', generation: 2 }]);
      await passAt(lastPass() + 2_000);

      assert.equal(await results.next(), 'ok');
      assert.equal((api.get(POLSTATUS('shop', 'web'))!.status as { realized: string }).realized, '2/2');
      assert.equal(api.requests.filter(isList).length, lists, 'still no list');
    });

    test('a watch that gets 410 Gone relists, and changes keep arriving', async () => {
      nodeStatus(api, 'node-a', [{ uid: 'u-web', generation: 1 }]);
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: [web(2, ['node-a'])] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');
      await until(() => api.openWatches() === 3, 'every kind watched');
      const lists = api.requests.filter(isList).length;

      api.compact(); // ends the watches; resuming them gets 410
      nodeStatus(api, 'node-a', [{ uid: 'u-web', generation: 2 }]);
      for (let i = 0; i < 10 && api.requests.filter(isList).length < lists + 2; i++) {
        await settle(20);
        clock.advance(1_000); // the reflectors' backoff runs on the injected clock
      }
      assert.equal(api.requests.filter(isList).length, lists + 2, 'each kind relisted once');
      await until(() => results.all.includes('ok', 1), 'a pass after the relist');
      assert.equal((api.get(POLSTATUS('shop', 'web'))!.status as { realized: string }).realized, '1/1');
    });

    test('the holder retries a failed list after an equal-jitter backoff drawn from the injected random', async () => {
      api.fail({ method: 'GET', path: /\/nodepolicystatuses$/, status: 500, reason: 'InternalError', times: 1 });
      await holder(undefined, () => 0);
      // With random 0 the retry waits half of the 1 s first step: replicas that fail together
      // spread their retries over the second half of the step instead of retrying in step.
      await until(() => clock.hasTimerAt(T0 + 500), 'the list retry scheduled at +500 ms');
      const lists = api.requests.filter((r) => isList(r) && r.path.endsWith('/nodepolicystatuses')).length;
      clock.advance(500);
      await until(() => api.requests.filter((r) => isList(r) && r.path.endsWith('/nodepolicystatuses')).length > lists, 'the list retried');
    });

    test('a node catching up with one policy keeps the others it holds enforced', async () => {
      // Many policies, so that some share a digest bucket with the one that changes.
      const many = Array.from({ length: 400 }, (_, i): PolicyStatusInput => ({ ...web(1, ['node-a']), name: `p${i}`, uid: `u-p${i}` }));
      nodeStatus(
        api,
        'node-a',
        many.map((p) => ({ uid: p.uid, generation: 1 })),
      );
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: many });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');
      const enforced = () => many.filter((p) => (api.get(POLSTATUS('shop', p.name))!.status as { realized: string }).realized === '1/1').map((p) => p.name);
      assert.equal(enforced().length, 400);

      // p0 moves to generation 2; node-a has not applied it yet.
      const next = many.map((p, i) => (i === 0 ? { ...p, generation: 2 } : p));
      a.update({ policies: next });
      await passAt(lastPass() + 2_000);
      assert.equal(await results.next(), 'ok');
      assert.deepEqual(
        many.filter((p) => !enforced().includes(p.name)).map((p) => p.name),
        ['p0'],
        'only p0 is pending',
      );

      nodeStatus(
        api,
        'node-a',
        next.map((p) => ({ uid: p.uid, generation: p.generation })),
      );
      await passAt(lastPass() + 2_000);

      assert.equal(await results.next(), 'ok');
      assert.equal(enforced().length, 400);
    });

    test('a re-created NetworkPolicy (new uid) gets its ownerReference re-applied', async () => {
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: [web(1, [])] });
      await passAt(clock.now());
      await results.next();
      a.update({ policies: [{ ...web(1, []), uid: 'u-web-2' }] });
      await passAt(lastPass() + 2_000);
      assert.equal(await results.next(), 'ok');
      assert.deepEqual(
        (api.get(POLSTATUS('shop', 'web'))!.metadata.ownerReferences as { uid: string }[]).map((r) => r.uid),
        ['u-web-2'],
      );
    });

    test('only the holder writes; after it releases the Lease the other agent takes over the writing', async () => {
      nodeStatus(api, 'node-a', [{ uid: 'u-web', generation: 1 }]);
      const ra = new Results<PassResult>();
      const rb = new Results<PassResult>();
      const a = await holder(ra);
      const b = start('node-b', rb);
      clock.advance(0);
      await until(() => leaseCalls().some((r) => r.authorization === 'Bearer token-node-b'), 'node-b tried the lease');
      const input = { policies: [web(1, ['node-a'])] };
      a.update(input);
      b.update(input);
      await passAt(clock.now());
      assert.equal(await ra.next(), 'ok');
      await settle(20);
      assert.deepEqual(rb.all, [], 'a non-holder runs no pass');
      assert.equal(b.isHolder(), false);
      assert.ok(statusWrites().length > 0);
      assert.ok(
        statusWrites().every((r) => r.authorization === 'Bearer token-node-a'),
        'every status write came from the holder',
      );

      await a.stop();
      running = running.filter((x) => x !== a);
      const before = statusWrites().length;
      clock.advance(5_000);
      await until(() => b.isHolder(), 'node-b takes over the released lease');
      b.update({ policies: [web(2, ['node-a'])] });
      await passAt(clock.now());
      await until(() => statusWrites().length > before, 'node-b writes');
      assert.ok(
        statusWrites()
          .slice(before)
          .every((r) => r.authorization === 'Bearer token-node-b'),
      );
      assert.equal((api.get(POLSTATUS('shop', 'web'))!.status as { observedGeneration: number }).observedGeneration, 2);
    });

    test('nothing is written or deleted before the first update', async () => {
      api.put(POLSTATUS('shop', 'old'), { apiVersion: 'weir.dev/v1alpha1', kind: 'NetworkPolicyStatus', metadata: { name: 'old', namespace: 'shop' } });
      await holder();
      clock.advance(10_000);
      await settle(50);
      assert.equal(statusWrites().length, 0);
      assert.notEqual(api.get(POLSTATUS('shop', 'old')), undefined);
    });

    test('403 on the status writes: one warning, the Lease is still held, writes resume when allowed', async () => {
      const results = new Results<PassResult>();
      const a = await holder(results);
      const denial = api.fail({ method: 'PATCH', path: /networkpolicystatuses/, status: 403, reason: 'Forbidden' });
      a.update({ policies: [web(1, [])] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'error');
      await passAt(lastPass() + 2_000); // the retry: backoff, but never sooner than the interval
      assert.equal(await results.next(), 'error');
      assert.equal(logs.warnings().length, 1);
      assert.match(logs.warnings()[0].msg, /forbids the status write \(RBAC, or an admission policy\)/);
      denial.times = 0;
      await passAt(lastPass() + 2_000);
      assert.equal(await results.next(), 'ok');
    });
  });
  describe('ClusterNetworkPolicy status', () => {
    const cnpWrites = () => api.writes().filter((r) => r.path.startsWith('/apis/policy.networking.k8s.io/'));
    const conditions = () =>
      (api.get(CNP('guard'))!.status as { conditions: { type: string; status: string; observedGeneration: number; lastTransitionTime: string; reason: string; message: string }[] }).conditions;

    test("the holder applies Weir's two conditions to the policy's own status, on the version it read, only when they change", async () => {
      const rv = clusterPolicy(api, 2);
      nodeStatus(api, 'node-a', [
        { uid: 'u-web', generation: 1 },
        { uid: 'u-guard', generation: 2 },
      ]);
      nodeStatus(api, 'node-b', [{ uid: 'u-web', generation: 1 }]);
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: [web(1, ['node-a', 'node-b'])], clusterPolicies: [guard(2, ['node-a', 'node-b'])] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');

      assert.deepEqual(
        cnpWrites().map((r) => `${r.method} ${r.path}`),
        [`PATCH ${CNP('guard')}/status`],
      );
      const [w] = cnpWrites();
      assert.equal(w.contentType, 'application/apply-patch+yaml');
      assert.equal(w.query.get('fieldManager'), 'weir-aggregator');
      assert.equal(w.query.get('force'), 'true');
      assert.deepEqual((w.body as { metadata: unknown }).metadata, { name: 'guard', resourceVersion: rv });
      assert.deepEqual(conditions(), pendingOnNodeB(2));
      // One digest per node covers both kinds: node-b holds web though it lacks the other.
      assert.equal((api.get(POLSTATUS('shop', 'web'))!.status as { realized: string }).realized, '2/2');

      // node-b takes it up; its report, by the watch, brings a pass.
      nodeStatus(api, 'node-b', [
        { uid: 'u-web', generation: 1 },
        { uid: 'u-guard', generation: 2 },
      ]);
      await passAt(T0 + 2_000);
      assert.equal(await results.next(), 'ok');
      assert.deepEqual(
        conditions().map((c) => [c.type, c.status, c.reason, c.lastTransitionTime]),
        [
          ['Accepted', 'True', 'Valid', '2025-06-01T12:00:00Z'],
          ['Enforced', 'True', 'AllNodesRealized', '2025-06-01T12:00:02Z'],
        ],
      );
      assert.equal(cnpWrites().length, 2);

      // The watch brings both writes back as ours: no pass, nothing written.
      const passes = results.all.length;
      for (let i = 0; i < 3; i++) await leaseTick(5_000, leaseCalls().length + 2);
      assert.equal(results.all.length, passes, 'no pass without a change');
      assert.equal(cnpWrites().length, 2);
    });

    test('an invalid policy is not Accepted, with its field errors', async () => {
      clusterPolicy(api, 1);
      const results = new Results<PassResult>();
      const a = await holder(results);
      const message = 'spec.priority: must be an integer from 0 to 1000, got 2000';
      a.update({ policies: [], clusterPolicies: [{ ...guard(1, []), accepted: { ok: false, message } }] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');
      assert.deepEqual(
        conditions().map((c) => [c.type, c.status, c.reason, c.message]),
        [
          ['Accepted', 'False', 'Invalid', message],
          ['Enforced', 'True', 'NoPodsSelected', 'no node runs a pod this policy selects'],
        ],
      );
    });

    test('writes only on the version the watch holds, of the same uid and the generation described; a write that meets a newer version (409) waits for its watch event', async () => {
      clusterPolicy(api, 1);
      const results = new Results<PassResult>();
      const a = await holder(results);

      // The model is at generation 2, the watch still at 1: conditions about 2 would land on 1.
      a.update({ policies: [], clusterPolicies: [guard(2, [])] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'skipped');
      assert.equal(cnpWrites().length, 0);

      // Generation 2 arrives by the watch and brings a pass; just before its write somebody
      // labels the policy: 409, no failure, and the watch event of the label brings the pass
      // that writes on the version after it.
      let labelled = '';
      api.fail({ method: 'PATCH', path: `${CNP('guard')}/status`, status: 409, reason: 'Conflict', times: 1, onHit: () => (labelled = clusterPolicy(api, 2, { labels: { owner: 'sec' } })) });
      clusterPolicy(api, 2);
      await passAt(T0 + 2_000);
      assert.equal(await results.next(), 'skipped', 'a conflict is no failure');
      await passAt(T0 + 4_000);
      assert.equal(await results.next(), 'ok');
      assert.equal(logs.warnings().length, 0);
      const last = cnpWrites()[cnpWrites().length - 1];
      assert.equal((last.body as { metadata: { resourceVersion: string } }).metadata.resourceVersion, labelled);
      assert.deepEqual(
        conditions().map((c) => [c.type, c.observedGeneration]),
        [
          ['Accepted', 2],
          ['Enforced', 2],
        ],
      );

      // Deleted and created again under the same name: nothing about the old uid lands on it.
      const before = cnpWrites().length;
      api.remove(CNP('guard'));
      clusterPolicy(api, 1, { uid: 'u-guard-2' });
      await passAt(T0 + 6_000);
      assert.equal(await results.next(), 'skipped');
      assert.equal(cnpWrites().length, before);
      a.update({ policies: [], clusterPolicies: [guard(1, [], 'u-guard-2')] });
      await passAt(T0 + 8_000);
      assert.equal(await results.next(), 'ok');
      assert.deepEqual(
        conditions().map((c) => [c.type, c.status, c.observedGeneration]),
        [
          ['Accepted', 'True', 1],
          ['Enforced', 'True', 1],
        ],
      );
    });

    test('a cluster that does not serve ClusterNetworkPolicy (404) still gets its NetworkPolicyStatus', async () => {
      api.fail({ method: 'GET', path: /\/clusternetworkpolicies$/, status: 404, reason: 'NotFound' });
      const results = new Results<PassResult>();
      const a = await holder(results);
      a.update({ policies: [web(1, [])] });
      await passAt(clock.now());
      assert.equal(await results.next(), 'ok');
      assert.notEqual(api.get(POLSTATUS('shop', 'web')), undefined);
      assert.equal(cnpWrites().length, 0);
    });
  });
});
