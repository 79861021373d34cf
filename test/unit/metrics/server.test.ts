import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ConfigError } from '../../../src/errors.ts';
import { createMetrics } from '../../../src/metrics/index.ts';
import { parseHostPort, startHealthServer, type Health } from '../../../src/metrics/server.ts';

describe('metrics address', () => {
  const cases = [
    { name: 'no host means loopback, never every interface', addr: ':9476', expected: { host: '127.0.0.1', port: 9476 } },
    { name: 'explicit loopback', addr: '127.0.0.1:9476', expected: { host: '127.0.0.1', port: 9476 } },
    { name: 'every interface only when asked for', addr: '0.0.0.0:9476', expected: { host: '0.0.0.0', port: 9476 } },
    { name: 'an IPv6 address in brackets', addr: '[::1]:9476', expected: { host: '::1', port: 9476 } },
    { name: 'a node address', addr: '10.0.0.5:0', expected: { host: '10.0.0.5', port: 0 } },
  ];
  for (const c of cases) test(c.name, () => assert.deepEqual(parseHostPort(c.addr), c.expected));

  for (const bad of ['9476', 'localhost', ':99999', '[::1]9476', '']) {
    test(`"${bad}" is refused with an example`, () => {
      assert.throws(
        () => parseHostPort(bad),
        (e: unknown) => e instanceof ConfigError && /HOST:PORT, e\.g\. 127\.0\.0\.1:9476/.test(e.message),
      );
    });
  }
});

describe('health server', () => {
  async function serve(health: Health) {
    const s = await startHealthServer(':0', createMetrics({ defaultMetrics: false }).registry, health);
    const get = async (path: string) => {
      const r = await fetch(`http://127.0.0.1:${s.port}${path}`);
      return { status: r.status, body: await r.text() };
    };
    return { ...s, get, close: () => new Promise<void>((resolve) => s.server.close(() => resolve())) };
  }

  test('":PORT" listens on loopback only', async () => {
    const s = await serve({ health: () => ({ healthy: true, reason: 'Ok' }), readiness: () => ({ ready: true, revision: 'r1', reason: 'Ready' }) });
    try {
      const a = s.server.address();
      assert.ok(a && typeof a === 'object');
      assert.equal(a.address, '127.0.0.1');
      assert.equal((await s.get('/healthz')).status, 200);
    } finally {
      await s.close();
    }
  });

  test('/readyz and /healthz answer with codes and the revision only, whatever else the loop knows', async () => {
    // Whatever the loop hands over, only the named fields go out: a payload line or stderr in
    // a field added later must not reach whoever asks.
    const leak = 'iptables-restore: line 2: -A cali-pi-db -s 10.9.8.7/32 -m comment --comment "ns/allow-db" failed';
    const s = await serve({
      health: () => ({ healthy: false, reason: 'NoWriteSucceeded', error: 'WEIR_RESTORE_FAILED', detail: leak }) as ReturnType<Health['health']>,
      readiness: () => ({ ready: false, revision: 'r7', reason: 'ApplyFailed', error: 'WEIR_RESTORE_FAILED', message: leak }) as ReturnType<Health['readiness']>,
    });
    try {
      const ready = await s.get('/readyz');
      assert.equal(ready.status, 503);
      assert.deepEqual(JSON.parse(ready.body), { ready: false, revision: 'r7', reason: 'ApplyFailed', error: 'WEIR_RESTORE_FAILED' });
      const health = await s.get('/healthz');
      assert.equal(health.status, 503);
      assert.deepEqual(JSON.parse(health.body), { healthy: false, reason: 'NoWriteSucceeded', error: 'WEIR_RESTORE_FAILED' });
      for (const body of [ready.body, health.body]) for (const secret of ['10.9.8.7', 'cali-pi-db', 'allow-db', 'line']) assert.ok(!body.includes(secret), body);
    } finally {
      await s.close();
    }
  });
});
