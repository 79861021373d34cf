import assert from 'node:assert/strict';
import { test } from 'node:test';
import { toPod } from '../../../src/sources/convert.ts';
import { ValueInterner } from '../../../src/sources/intern.ts';

const rawPod = (name: string, labels: Record<string, string>, ports: { name: string; containerPort: number; protocol?: string }[]) => ({
  metadata: { name, namespace: 'shop', uid: `uid-${name}`, labels },
  spec: { nodeName: 'node-a', containers: [{ ports }] },
  status: { phase: 'Running', podIPs: [{ ip: `10.0.0.${name.length}` }] },
});

test('replicas share their labels, ports and repeated strings; what differs is never shared', () => {
  const intern = new ValueInterner();
  const a = toPod(rawPod('a', { app: 'web', tier: 'front' }, [{ name: 'http', containerPort: 8080 }]), undefined, intern);
  const b = toPod(rawPod('bb', { app: 'web', tier: 'front' }, [{ name: 'http', containerPort: 8080 }]), undefined, intern);
  assert.equal(a.labels, b.labels);
  assert.equal(a.ports, b.ports);
  assert.deepEqual(b, toPod(rawPod('bb', { app: 'web', tier: 'front' }, [{ name: 'http', containerPort: 8080 }])), 'the same pod as without interning');

  const other = toPod(rawPod('c', { app: 'web', tier: 'back' }, [{ name: 'http', containerPort: 8081 }]), undefined, intern);
  assert.deepEqual(other.labels, { app: 'web', tier: 'back' });
  assert.deepEqual(other.ports, [{ name: 'http', port: 8081, protocol: 'TCP' }]);
  // Keys that would run together in a naive key ("a" + "b=c" against "a=b" + "c") stay apart.
  const x = toPod(rawPod('x', { 'a.io/b': 'c-d' }, []), undefined, intern);
  const y = toPod(rawPod('y', { 'a.io/b-c': 'd' }, []), undefined, intern);
  assert.deepEqual(x.labels, { 'a.io/b': 'c-d' });
  assert.deepEqual(y.labels, { 'a.io/b-c': 'd' });
});

test('a full pool starts afresh: values handed out stay as they were', () => {
  const intern = new ValueInterner(3);
  const first = intern.labels({ n: '0' });
  for (let i = 1; i < 10; i++) intern.labels({ n: String(i) });
  assert.deepEqual(first, { n: '0' });
  const again = intern.labels({ n: '0' });
  assert.deepEqual(again, { n: '0' });
  assert.equal(intern.labels({ n: '0' }), again);
});
