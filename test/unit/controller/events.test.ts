// The event recorder against a loopback fake API server: one write per (policy, reason) per
// window, repeats counted, never blocking or throwing.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { createEventRecorder } from '../../../src/controller/events.ts';
import type { EventRecorder } from '../../../src/controller/events.ts';
import { captureLog, FakeApi, FakeClock, Results, settle } from '../status/fake-api.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const web = { namespace: 'shop', name: 'web', uid: 'u-web' };
const EVENTS = '/api/v1/namespaces/shop/events';

describe('event recorder', () => {
  let api: FakeApi;
  let clock: FakeClock;
  let results: Results<'ok' | 'error'>;
  let logs: ReturnType<typeof captureLog>;
  let recorder: EventRecorder;

  beforeEach(async () => {
    api = new FakeApi();
    await api.start();
    clock = new FakeClock(T0);
    results = new Results();
    logs = captureLog();
    recorder = createEventRecorder({
      kubeConfig: api.kubeConfig(),
      component: 'weir-agent',
      host: 'node-a',
      log: logs.log,
      clock,
      windowMs: 60_000,
      onWrite: results.push,
    });
  });
  afterEach(async () => {
    await recorder.stop();
    await api.stop();
  });

  test('the first event is created at once, on the NetworkPolicy', async () => {
    recorder.record(web, 'Warning', 'PolicyRejected', 'spec.ingress[0].from[0]: bad selector');
    assert.equal(api.requests.length, 0, 'record() sends nothing on the caller stack');
    assert.equal(await results.next(), 'ok');
    const [post] = api.writes();
    assert.equal(`${post.method} ${post.path}`, `POST ${EVENTS}`);
    const body = post.body as Record<string, unknown> & { metadata: { name: string } };
    assert.match(body.metadata.name, /^web\.[0-9a-f]+$/);
    assert.deepEqual(
      { ...body, metadata: { ...body.metadata, name: 'x' } },
      {
        apiVersion: 'v1',
        kind: 'Event',
        metadata: { name: 'x', namespace: 'shop' },
        involvedObject: { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', namespace: 'shop', name: 'web', uid: 'u-web' },
        type: 'Warning',
        reason: 'PolicyRejected',
        message: 'spec.ingress[0].from[0]: bad selector',
        source: { component: 'weir-agent', host: 'node-a' },
        reportingComponent: 'weir-agent',
        reportingInstance: 'node-a',
        firstTimestamp: '2025-06-01T12:00:00Z',
        lastTimestamp: '2025-06-01T12:00:00Z',
        count: 1,
      },
    );
  });

  test('repeats within the window are counted and written once when it ends', async () => {
    recorder.record(web, 'Warning', 'ApplyFailed', 'first');
    await results.next();
    const name = (api.writes()[0].body as { metadata: { name: string } }).metadata.name;
    for (let i = 1; i <= 20; i++) {
      clock.advance(1_000);
      recorder.record(web, 'Warning', 'ApplyFailed', `failure ${i}`);
    }
    await settle();
    assert.equal(api.writes().length, 1, 'nothing more within the window');
    clock.advance(40_000);
    assert.equal(await results.next(), 'ok');
    const repeat = api.writes()[1];
    assert.equal(`${repeat.method} ${repeat.path}`, `PATCH ${EVENTS}/${name}`);
    assert.equal(repeat.contentType, 'application/merge-patch+json');
    assert.deepEqual(repeat.body, { count: 21, lastTimestamp: '2025-06-01T12:00:20Z', message: 'failure 20' });
    assert.equal(api.get(`${EVENTS}/${name}`)?.count, 21);
  });

  test('another reason or another policy is its own series, written at once', async () => {
    recorder.record(web, 'Warning', 'ApplyFailed', 'a');
    recorder.record(web, 'Warning', 'PolicyRejected', 'b');
    recorder.record({ ...web, name: 'api', uid: 'u-api' }, 'Warning', 'ApplyFailed', 'c');
    for (let i = 0; i < 3; i++) assert.equal(await results.next(), 'ok');
    assert.deepEqual(
      api.writes().map((r) => [r.method, (r.body as { message: string }).message]),
      [
        ['POST', 'a'],
        ['POST', 'b'],
        ['POST', 'c'],
      ],
    );
  });

  test('an expired Event (404 on the repeat) starts a new one', async () => {
    recorder.record(web, 'Warning', 'ApplyFailed', 'a');
    await results.next();
    api.fail({ method: 'PATCH', path: /\/events\//, status: 404, reason: 'NotFound', times: 1 });
    clock.advance(1_000);
    recorder.record(web, 'Warning', 'ApplyFailed', 'b');
    clock.advance(59_000);
    assert.equal(await results.next(), 'ok');
    assert.deepEqual(
      api.writes().map((r) => r.method),
      ['POST', 'PATCH', 'POST'],
    );
    assert.equal((api.writes()[2].body as { count: number }).count, 1);
  });

  test('a quiet series writes its next event at once', async () => {
    recorder.record(web, 'Normal', 'PolicyAccepted', 'a');
    await results.next();
    clock.advance(60_000);
    recorder.record(web, 'Normal', 'PolicyAccepted', 'b');
    assert.equal(await results.next(), 'ok');
    assert.deepEqual(
      api.writes().map((r) => r.method),
      ['POST', 'PATCH'],
    );
  });

  test('403: record() still returns at once and never throws; one warning', async () => {
    api.fail({ method: 'POST', path: EVENTS, status: 403, reason: 'Forbidden' });
    for (let i = 0; i < 5; i++) {
      const returned: unknown = recorder.record({ ...web, name: `p${i}`, uid: `u${i}` }, 'Warning', 'PolicyRejected', 'x');
      assert.equal(returned, undefined);
    }
    for (let i = 0; i < 5; i++) assert.equal(await results.next(), 'error');
    assert.equal(logs.warnings().length, 1);
    assert.match(logs.warnings()[0].msg, /forbids the status write \(RBAC, or an admission policy\)/);
  });
});
