// The node reporter against a loopback fake API server (not a real kube-apiserver: see
// test/integration/status.test.ts for that): what it sends, how often, and what it does when
// the API server refuses.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { createNodeStatusReporter } from '../../../src/status/index.ts';
import type { NodeStatusInput, NodeStatusReporter, PassResult } from '../../../src/status/index.ts';
import { captureLog, FakeApi, FakeClock, Results, settle } from './fake-api.ts';
import { DIGEST_BUCKETS, digestOf, encodeDigest } from '../../../src/status/realization.ts';

const NODE = 'node-a';
const T0 = Date.parse('2025-06-01T12:00:00Z');
const STATUS_PATH = `/apis/weir.dev/v1alpha1/nodepolicystatuses/${NODE}/status`;
const OBJECT_PATH = `/apis/weir.dev/v1alpha1/nodepolicystatuses/${NODE}`;

const input = (rules: number, extra: Partial<NodeStatusInput> = {}): NodeStatusInput => ({
  synced: true,
  lastApply: { ok: true },
  lastSyncTime: T0,
  counts: { localPods: 2, policies: 1, sets: 2, chains: 5, rules },
  policies: [{ namespace: 'shop', name: 'web', uid: 'u-web', generation: 2 }],
  ...extra,
});

describe('node status reporter', () => {
  let api: FakeApi;
  let clock: FakeClock;
  let results: Results<PassResult>;
  let reporter: NodeStatusReporter | undefined;
  let logs: ReturnType<typeof captureLog>;

  beforeEach(async () => {
    api = new FakeApi();
    await api.start();
    api.put('/api/v1/nodes/node-a', { apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, uid: 'uid-node-a' } });
    clock = new FakeClock(T0);
    results = new Results();
    logs = captureLog();
  });
  afterEach(async () => {
    await reporter?.stop();
    reporter = undefined;
    await api.stop();
  });

  const start = (extra: { heartbeatMs?: number } = {}) => {
    reporter = createNodeStatusReporter({
      kubeConfig: api.kubeConfig(),
      nodeName: NODE,
      log: logs.log,
      clock,
      minIntervalMs: 1_000,
      retryMinMs: 1_000,
      retryMaxMs: 8_000,
      onWrite: results.push,
      ...extra,
    });
    return reporter;
  };
  /** Advances the fake clock and waits for the pass that falls due. */
  const pass = async (ms: number): Promise<PassResult> => {
    clock.advance(ms);
    return results.next();
  };

  test('the first write reads the Node, creates the object owned by it, then applies the status', async () => {
    const r = start();
    r.update(input(40));
    assert.equal(api.requests.length, 0, 'update() sends nothing on the caller stack');
    assert.equal(await pass(0), 'ok');

    assert.deepEqual(
      api.requests.map((q) => `${q.method} ${q.path}`),
      ['GET /api/v1/nodes/node-a', `GET ${OBJECT_PATH}`, `PATCH ${OBJECT_PATH}`, `PATCH ${STATUS_PATH}`],
    );
    for (const q of api.writes()) {
      assert.equal(q.contentType, 'application/apply-patch+yaml');
      assert.equal(q.query.get('fieldManager'), 'weir-agent-node-a');
      assert.equal(q.query.get('force'), 'true');
      assert.equal(q.authorization, 'Bearer test-token');
    }
    const [object, status] = api.writes();
    assert.deepEqual(object.body, {
      apiVersion: 'weir.dev/v1alpha1',
      kind: 'NodePolicyStatus',
      metadata: { name: NODE, ownerReferences: [{ apiVersion: 'v1', kind: 'Node', name: NODE, uid: 'uid-node-a' }] },
    });
    assert.deepEqual(status.body, {
      apiVersion: 'weir.dev/v1alpha1',
      kind: 'NodePolicyStatus',
      metadata: { name: NODE },
      status: {
        conditions: [
          { type: 'Ready', status: 'True', lastTransitionTime: '2025-06-01T12:00:00Z', reason: 'Synced', message: 'synced with the cluster; the kernel holds the latest policy state' },
          { type: 'Programmed', status: 'True', lastTransitionTime: '2025-06-01T12:00:00Z', reason: 'Applied', message: 'the last apply succeeded' },
          { type: 'Degraded', status: 'False', lastTransitionTime: '2025-06-01T12:00:00Z', reason: 'AsExpected', message: 'no problems' },
        ],
        lastSyncTime: '2025-06-01T12:00:00Z',
        counts: { localPods: 2, policies: 1, sets: 2, chains: 5, rules: 40, failingPolicies: 0 },
        failingPolicies: [],
        failingPoliciesOmitted: 0,
        applyFailures: [],
        policyDigest: { buckets: DIGEST_BUCKETS, digests: encodeDigest(digestOf([{ uid: 'u-web', generation: 2 }])) },
      },
    });
  });

  test('many updates within the interval make one write, with the latest input', async () => {
    const r = start();
    r.update(input(1));
    await pass(0);
    const before = api.writes().length;
    for (let i = 2; i <= 100; i++) r.update(input(i));
    clock.advance(999);
    await settle();
    assert.equal(api.writes().length, before, 'nothing before the interval is over');
    assert.equal(await pass(1), 'ok');
    const writes = api.writes().slice(before);
    assert.deepEqual(
      writes.map((q) => `${q.method} ${q.path}`),
      [`PATCH ${STATUS_PATH}`],
      'only the status, once',
    );
    assert.equal((writes[0].body as { status: { counts: { rules: number } } }).status.counts.rules, 100);
  });

  test('identical content is not written again', async () => {
    const r = start();
    r.update(input(5));
    await pass(0);
    const before = api.requests.length;
    r.update(input(5));
    assert.equal(await pass(1_000), 'skipped');
    assert.equal(api.requests.length, before, 'no request at all');
  });

  test('a restarted agent reads the stored status: unchanged content, no write, transition times kept', async () => {
    const first = start();
    first.update(input(5));
    await pass(0);
    await first.stop();
    const stored = api.get(OBJECT_PATH)!;

    clock.advance(3_600_000);
    const second = start();
    second.update(input(5));
    assert.equal(await pass(0), 'skipped');
    assert.deepEqual(api.get(OBJECT_PATH), stored);

    second.update(input(6));
    assert.equal(await pass(1_000), 'ok');
    const conditions = (api.get(OBJECT_PATH)!.status as { conditions: { lastTransitionTime: string }[] }).conditions;
    assert.deepEqual(
      conditions.map((c) => c.lastTransitionTime),
      Array(3).fill('2025-06-01T12:00:00Z'),
    );
  });

  test('a status change moves lastTransitionTime only for the conditions that changed', async () => {
    const r = start();
    r.update(input(5));
    await pass(0);
    r.update(input(5, { lastApply: { ok: false, message: 'iptables-restore: line 3 failed' } }));
    // The pass runs when the interval allows, at 12:00:01: that is when the transition is seen.
    assert.equal(await pass(90_000), 'ok');
    const status = api.get(OBJECT_PATH)!.status as { conditions: { type: string; status: string; lastTransitionTime: string }[] };
    assert.deepEqual(
      status.conditions.map((c) => [c.type, c.status, c.lastTransitionTime]),
      [
        ['Ready', 'False', '2025-06-01T12:00:01Z'],
        ['Programmed', 'False', '2025-06-01T12:00:01Z'],
        ['Degraded', 'True', '2025-06-01T12:00:01Z'],
      ],
    );
    r.update(input(5, { lastApply: { ok: false, message: 'another failure' } }));
    await pass(90_000);
    const again = api.get(OBJECT_PATH)!.status as typeof status;
    assert.notEqual(JSON.stringify(again), JSON.stringify(status), 'the message changed');
    assert.deepEqual(
      again.conditions.map((c) => c.lastTransitionTime),
      Array(3).fill('2025-06-01T12:00:01Z'),
    );
  });

  test('a lastSyncTime change alone is written only once the heartbeat is due', async () => {
    const r = start({ heartbeatMs: 60_000 });
    r.update(input(5));
    await pass(0);
    r.update(input(5, { lastSyncTime: T0 + 30_000 }));
    assert.equal(await pass(30_000), 'skipped');
    r.update(input(5, { lastSyncTime: T0 + 60_000 }));
    assert.equal(await pass(30_000), 'ok');
    assert.equal((api.get(OBJECT_PATH)!.status as { lastSyncTime: string }).lastSyncTime, '2025-06-01T12:01:00Z');
  });

  test('403 Forbidden: one warning, no throw, enforcement unaffected, retried until RBAC allows it', async () => {
    const r = start();
    const denial = api.fail({ method: 'PATCH', path: STATUS_PATH, status: 403, reason: 'Forbidden' });
    // The enforcement loop calls update() after each apply; every call must return at once.
    let applies = 0;
    const enforce = (i: number): void => {
      const returned: unknown = r.update(input(i));
      assert.equal(returned, undefined);
      applies++;
    };
    enforce(1);
    assert.equal(await pass(0), 'error');
    for (let i = 2; i <= 5; i++) enforce(i);
    assert.equal(await pass(1_000), 'error');
    assert.equal(await pass(2_000), 'error');
    assert.equal(await pass(4_000), 'error');
    assert.equal(applies, 5);

    const warnings = logs.warnings();
    assert.equal(warnings.length, 1, `one warning, got ${JSON.stringify(warnings)}`);
    assert.match(warnings[0].msg, /forbids the status write \(RBAC, or an admission policy\); enforcement continues/);
    assert.match(String(warnings[0].grant), /nodepolicystatuses\/status/);

    denial.times = 0;
    assert.equal(await pass(8_000), 'ok');
    assert.equal((api.get(OBJECT_PATH)!.status as { counts: { rules: number } }).counts.rules, 5);
    assert.ok(logs.lines.some((l) => l.level === 30 && /succeed again/.test(l.msg)));
  });

  test('a different failure after a 403 is warned about again', async () => {
    const r = start();
    const denial = api.fail({ method: 'PATCH', path: STATUS_PATH, status: 403, reason: 'Forbidden' });
    r.update(input(1));
    await pass(0);
    await pass(1_000);
    denial.times = 0;
    api.fail({ method: 'PATCH', path: STATUS_PATH, status: 500, reason: 'InternalError' });
    await pass(2_000);
    await pass(4_000);
    assert.deepEqual(
      logs.warnings().map((w) => /forbids/.test(w.msg)),
      [true, false],
    );
  });

  test('an object deleted behind its back is re-created on the retry', async () => {
    const r = start();
    r.update(input(1));
    await pass(0);
    api.fail({ method: 'PATCH', path: STATUS_PATH, status: 404, reason: 'NotFound', times: 1 });
    r.update(input(2));
    assert.equal(await pass(1_000), 'error');
    const before = api.requests.length;
    assert.equal(await pass(1_000), 'ok');
    assert.deepEqual(
      api.requests.slice(before).map((q) => `${q.method} ${q.path}`),
      ['GET /api/v1/nodes/node-a', `GET ${OBJECT_PATH}`, `PATCH ${STATUS_PATH}`],
      'reads the Node and the object again; the object still has its owner, so only the status is applied',
    );
  });

  test('a missing Node is an error that is retried, not a crash', async () => {
    const r = start();
    api.fail({ method: 'GET', path: '/api/v1/nodes/node-a', status: 404, reason: 'NotFound', times: 1 });
    r.update(input(1));
    assert.equal(await pass(0), 'error');
    assert.equal(await pass(1_000), 'ok');
  });

  test('stop() cancels a pending write', async () => {
    const r = start();
    r.update(input(1));
    await pass(0);
    r.update(input(2));
    await r.stop();
    reporter = undefined;
    clock.advance(10_000);
    await settle();
    assert.equal(results.all.length, 1);
    assert.equal(clock.pending(), 0);
  });
});
