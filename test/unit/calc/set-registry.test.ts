// The set registry alone: what enters and leaves the kernel, how unions follow their parts,
// and that pod and namespace changes reach the sets whose selectors they may satisfy.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Changes } from '../../../src/calc/changes.ts';
import type { Dirty } from '../../../src/calc/desired.ts';
import { makeNames } from '../../../src/calc/names.ts';
import type { SetSpec } from '../../../src/calc/rules.ts';
import { SetRegistry } from '../../../src/calc/set-registry.ts';
import { ClusterState } from '../../../src/model/cluster.ts';
import type { Labels } from '../../../src/model/types.ts';
import { byNamespaceLabels, inNamespace, prefixes, union } from './set-specs.ts';
import { pod } from './fixtures.ts';

function setup() {
  const cluster = new ClusterState();
  const changes = new Changes();
  const registry = new SetRegistry(cluster, makeNames('cali'), changes);
  return { cluster, changes, registry };
}

const members = (registry: SetRegistry, name: string) => [...(registry.kernelSets.get(name)?.members ?? [])].sort();
const dirtyOf = (d: Dirty, name: string) => {
  const v = d.sets.get(name);
  return v === 'all' || v === undefined ? v : [...v].sort();
};

test('a set enters the kernel whole on its first rule reference and leaves on its last', () => {
  const { cluster, changes, registry } = setup();
  cluster.upsertPod(pod('a', 'web', { ip4: 5, labels: { app: 'web' } }));
  const s = registry.acquire(inNamespace('a', { app: 'web' }));
  assert.deepEqual(members(registry, s.name), ['10.244.1.5']);
  assert.equal(dirtyOf(changes.take(), s.name), 'all');
  assert.equal(registry.acquire(inNamespace('a', { app: 'web' })), s, 'equal specs share one set');
  assert.equal(changes.take().sets.size, 0, 'a second reference changes nothing in the kernel');
  registry.release(s);
  assert.ok(registry.kernelSets.has(s.name), 'one reference is left');
  registry.release(s);
  assert.equal(registry.kernelSets.has(s.name), false);
  assert.equal(dirtyOf(changes.take(), s.name), 'all');
  assert.equal(registry.liveCount, 0);
});

test('a pod change records only the members it adds or removes, in the sets its labels satisfy', () => {
  const { cluster, changes, registry } = setup();
  const web = registry.acquire(inNamespace('a', { app: 'web' }));
  const db = registry.acquire(inNamespace('a', { app: 'db' }));
  changes.take();
  const before = pod('a', 'p', { ip4: 7, labels: { app: 'web' } });
  registry.podChanged(cluster.upsertPod(before), before);
  let d = changes.take();
  assert.deepEqual(dirtyOf(d, web.name), ['10.244.1.7']);
  assert.equal(d.sets.has(db.name), false);
  const after = { ...before, labels: { app: 'db' } };
  registry.podChanged(cluster.upsertPod(after), after);
  d = changes.take();
  assert.deepEqual(members(registry, web.name), []);
  assert.deepEqual(members(registry, db.name), ['10.244.1.7']);
  assert.deepEqual(dirtyOf(d, web.name), ['10.244.1.7']);
  assert.deepEqual(dirtyOf(d, db.name), ['10.244.1.7']);
  const elsewhere = pod('b', 'q', { ip4: 9, labels: { app: 'web' } });
  registry.podChanged(cluster.upsertPod(elsewhere), elsewhere);
  assert.equal(changes.take().sets.size, 0, 'a pod of another namespace is in neither set');
});

test('a namespace relabel adds and removes its pods in sets selecting namespaces by label', () => {
  const { cluster, changes, registry } = setup();
  cluster.upsertNamespace({ name: 'b', labels: {} });
  const p = pod('b', 'api', { ip4: 3, labels: { app: 'api' } });
  cluster.upsertPod(p);
  const s = registry.acquire(byNamespaceLabels({ team: 'x' }, { app: 'api' }));
  assert.deepEqual(members(registry, s.name), []);
  changes.take();
  const relabel = (labels: Labels) => registry.namespaceLabelsChanged('b', cluster.upsertNamespace({ name: 'b', labels }), cluster.namespaceLabels('b'));
  relabel({ team: 'x' });
  assert.deepEqual(members(registry, s.name), ['10.244.1.3']);
  assert.deepEqual(dirtyOf(changes.take(), s.name), ['10.244.1.3']);
  relabel({ team: 'y' });
  assert.deepEqual(members(registry, s.name), []);
  assert.deepEqual(dirtyOf(changes.take(), s.name), ['10.244.1.3']);
});

test('a union follows its parts; a member two parts hold stays while either does', () => {
  const { cluster, changes, registry } = setup();
  const pods = inNamespace('a', { app: 'web' });
  const block = prefixes('10.244.1.5/32');
  const u = registry.acquire(union(pods, block));
  assert.deepEqual(members(registry, u.name), ['10.244.1.5']);
  assert.equal(registry.kernelSets.size, 1, "a union's parts stay out of the kernel");
  const p = pod('a', 'web', { ip4: 5, labels: { app: 'web' } });
  registry.podChanged(cluster.upsertPod(p), p);
  const q = pod('a', 'web2', { ip4: 6, labels: { app: 'web' } });
  registry.podChanged(cluster.upsertPod(q), q);
  assert.deepEqual(members(registry, u.name), ['10.244.1.5', '10.244.1.6']);
  assert.deepEqual([...changes.take().sets.keys()], [u.name], 'only the union is in the kernel to be told');
  registry.podChanged(cluster.deletePod(p.uid), undefined);
  assert.deepEqual(members(registry, u.name), ['10.244.1.5', '10.244.1.6'], 'the block still holds .5');
  assert.equal(changes.take().sets.size, 0);
  registry.podChanged(cluster.deletePod(q.uid), undefined);
  assert.deepEqual(members(registry, u.name), ['10.244.1.5']);
  assert.deepEqual(dirtyOf(changes.take(), u.name), ['10.244.1.6']);
});

test('releasing a union releases its parts, unless a rule still holds one', () => {
  const { registry } = setup();
  const a = inNamespace('a', { app: 'web' });
  const b = prefixes('192.0.2.0/24');
  const held = registry.acquire(a);
  const u = registry.acquire(union(a, b));
  assert.equal(registry.liveCount, 3);
  registry.release(u);
  assert.equal(registry.liveCount, 1, 'the part a rule holds lives on');
  assert.ok(registry.kernelSets.has(held.name));
  registry.release(held);
  assert.equal(registry.liveCount, 0);
});

test('a named-port set holds address,protocol:port of the pods that name that port', () => {
  const { cluster, registry } = setup();
  const spec: SetSpec = { ...inNamespace('a', {}), namedPort: { protocol: 'TCP', name: 'http' } };
  cluster.upsertPod(pod('a', 'named', { ip4: 4, ports: [{ name: 'http', port: 8080, protocol: 'TCP' }] }));
  cluster.upsertPod(pod('a', 'udp', { ip4: 8, ports: [{ name: 'http', port: 80, protocol: 'UDP' }] }));
  const s = registry.acquire(spec);
  assert.equal(s.type, 'hash:ip,port');
  assert.deepEqual(members(registry, s.name), ['10.244.1.4,tcp:8080']);
});
