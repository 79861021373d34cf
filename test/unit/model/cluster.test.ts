import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ClusterState } from '../../../src/model/cluster.ts';
import type { Labels, Pod, PodsPeer, Requirement, Selector } from '../../../src/model/types.ts';

const sel = (...requirements: Requirement[]): Selector => ({ key: JSON.stringify(requirements), requirements });
const inReq = (key: string, ...values: string[]): Requirement => ({ key, operator: 'In', values });
const notIn = (key: string, ...values: string[]): Requirement => ({ key, operator: 'NotIn', values });
const byNs = (nsSel: Selector, podSel: Selector): PodsPeer => ({ kind: 'pods', key: `pods|nssel=${nsSel.key}|${podSel.key}`, namespace: null, namespaceSelector: nsSel, podSelector: podSel });
const inNs = (namespace: string, podSel: Selector): PodsPeer => ({ kind: 'pods', key: `pods|ns=${namespace}|${podSel.key}`, namespace, namespaceSelector: null, podSelector: podSel });

function pod(name: string, namespace: string, labels: Labels): Pod {
  return { uid: `${namespace}/${name}`, namespace, name, labels, nodeName: 'n1', hostNetwork: false, phase: 'Running', terminating: false, ips: ['10.0.0.1'], ports: [] };
}
const names = (c: ClusterState, peer: PodsPeer) => [...c.podsMatching(peer)].map((p) => p.uid).sort();

function cluster(): ClusterState {
  const c = new ClusterState();
  c.upsertNamespace({ name: 'a', labels: { team: 'x', env: 'prod' } });
  c.upsertNamespace({ name: 'b', labels: { team: 'x', env: 'dev' } });
  c.upsertNamespace({ name: 'c', labels: { team: 'y', env: 'prod' } });
  for (const ns of ['a', 'b', 'c', 'unlisted']) {
    c.upsertPod(pod('web', ns, { tier: 'web' }));
    c.upsertPod(pod('db', ns, { tier: 'db' }));
  }
  return c;
}

test('podsMatching holds every requirement of the namespace selector and of the pod selector, whichever list it walks', () => {
  const c = cluster();
  assert.deepEqual(names(c, byNs(sel(inReq('team', 'x'), notIn('env', 'dev')), sel(inReq('tier', 'web')))), ['a/web']);
  assert.deepEqual(names(c, byNs(sel(inReq('team', 'x')), sel())), ['a/db', 'a/web', 'b/db', 'b/web']);
  assert.deepEqual(names(c, byNs(sel(notIn('env', 'prod')), sel(inReq('tier', 'db')))), ['b/db', 'unlisted/db'], 'a namespace known only from its pods has no labels but its name');
  assert.deepEqual(names(c, byNs(sel(), sel(inReq('tier', 'web')))), ['a/web', 'b/web', 'c/web', 'unlisted/web']);
  assert.deepEqual(names(c, byNs(sel(inReq('kubernetes.io/metadata.name', 'unlisted', 'c')), sel(notIn('tier', 'web')))), ['c/db', 'unlisted/db']);
  assert.deepEqual(names(c, byNs(sel(inReq('team', 'z')), sel())), []);
  assert.deepEqual(names(c, inNs('b', sel(inReq('tier', 'db', 'web')))), ['b/db', 'b/web']);
  assert.deepEqual(names(c, inNs('gone', sel())), []);
});

test('podsMatching answers anew after every change of pods and namespaces', () => {
  const c = cluster();
  const peer = byNs(sel(inReq('team', 'x')), sel(inReq('tier', 'web')));
  assert.deepEqual(names(c, peer), ['a/web', 'b/web']);
  c.upsertPod(pod('web2', 'b', { tier: 'web' }));
  assert.deepEqual(names(c, peer), ['a/web', 'b/web', 'b/web2'], 'a pod added');
  c.upsertPod(pod('web', 'a', { tier: 'db' }));
  assert.deepEqual(names(c, peer), ['b/web', 'b/web2'], 'a pod relabelled');
  c.deletePod('b/web2');
  assert.deepEqual(names(c, peer), ['b/web'], 'a pod deleted');
  c.upsertNamespace({ name: 'c', labels: { team: 'x' } });
  assert.deepEqual(names(c, peer), ['b/web', 'c/web'], 'a namespace relabelled');
  c.deleteNamespace('b');
  assert.deepEqual(names(c, peer), ['c/web'], 'a namespace deleted: its pods keep only their name label');
  assert.deepEqual(names(c, peer), ['c/web'], 'the same answer when nothing changed');
});

test("peerAddresses gives the peer's eligible pods' addresses of one family, an entry per pod, and answers anew after a pod changes", () => {
  const c = cluster();
  const peer = inNs('a', sel());
  const both = (p: Pod, ips: string[], extra: Partial<Pod> = {}): Pod => ({ ...p, ips, ...extra });
  c.upsertPod(both(pod('web', 'a', { tier: 'web' }), ['10.0.0.1', 'fd00::1']));
  c.upsertPod(both(pod('db', 'a', { tier: 'db' }), ['10.0.0.1']));
  c.upsertPod(both(pod('pending', 'a', {}), ['10.0.0.3', 'fd00::3'], { phase: 'Pending' }));
  c.upsertPod(both(pod('host', 'a', {}), ['192.168.0.1'], { hostNetwork: true }));
  const of = (f: 4 | 6) => [...c.peerAddresses(peer, f)].sort();
  assert.deepEqual(of(4), ['10.0.0.1', '10.0.0.1'], 'two pods sharing an address give it twice; pending and host-network pods none');
  assert.deepEqual(of(6), ['fd00::1']);
  c.upsertPod(both(pod('pending', 'a', {}), ['10.0.0.3', 'fd00::3']));
  assert.deepEqual(of(6), ['fd00::1', 'fd00::3'], 'the pending pod running');
  c.deletePod('a/web');
  assert.deepEqual([of(4), of(6)], [['10.0.0.1', '10.0.0.3'], ['fd00::3']], 'a pod deleted');
});
