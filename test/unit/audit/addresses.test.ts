import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AddressBook } from '../../../src/audit/addresses.ts';
import type { ModelEvent } from '../../../src/model/types.ts';
import { pod, up, del } from './fixtures.ts';

function book(opts: { deletedMax?: number; deletedTtlMs?: number } = {}) {
  let now = 1_000; // lru-cache takes an entry set at time 0 for one without a TTL
  const b = new AddressBook({ ...opts, now: () => now });
  return { b, advance: (ms: number) => (now += ms) };
}

test('a pod is named by each of its IPs, IPv4 and IPv6; other addresses by nothing', () => {
  const { b } = book();
  b.apply([up(pod('shop', 'web-1', ['10.244.1.5', 'fd00:10:244:1::5']))]);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'shop', pod: 'web-1' });
  assert.deepEqual(b.lookup('fd00:10:244:1::5'), { namespace: 'shop', pod: 'web-1' });
  assert.equal(b.lookup('10.244.1.6'), undefined);
  assert.equal(b.lookup('203.0.113.9'), undefined);
});

test('a deleted pod is still named by its IPs for a while, then forgotten', () => {
  const { b, advance } = book({ deletedTtlMs: 60_000 });
  const web = pod('shop', 'web-1', ['10.244.1.5']);
  b.apply([up(web)]);
  b.apply([del(web)]);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'shop', pod: 'web-1' });
  advance(59_000);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'shop', pod: 'web-1' });
  advance(2_000);
  assert.equal(b.lookup('10.244.1.5'), undefined);
});

test('the cache of deleted pods is bounded: the oldest deletions are forgotten first', () => {
  const { b } = book({ deletedMax: 3 });
  const pods = [1, 2, 3, 4, 5].map((i) => pod('ns', `p${i}`, [`10.0.0.${i}`]));
  b.apply(pods.map(up));
  b.apply(pods.map(del));
  assert.deepEqual(
    pods.map((p) => b.lookup(p.ips[0])?.pod),
    [undefined, undefined, 'p3', 'p4', 'p5'],
  );
  assert.equal(b.deletedSize, 3);
});

test('a reused IP names its current pod, also while the deleted one is still remembered', () => {
  const { b } = book();
  const old = pod('shop', 'web-1', ['10.244.1.5']);
  const next = pod('bank', 'api-7', ['10.244.1.5']);
  b.apply([up(old)]);
  b.apply([del(old)]);
  b.apply([up(next)]);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'bank', pod: 'api-7' });
  // And the current pod's deletion names it, not the older one.
  b.apply([del(next)]);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'bank', pod: 'api-7' });
});

test('while a terminating pod still holds an IP that a new pod got, the new pod is named', () => {
  const { b } = book();
  const old = pod('shop', 'web-1', ['10.244.1.5']);
  b.apply([up(old), up(pod('bank', 'api-7', ['10.244.1.5'])), up({ ...old, terminating: true })]);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'bank', pod: 'api-7' });
  // Two live claims (an update still on its way): the latest one.
  b.apply([up(pod('bank', 'api-8', ['10.244.1.5']))]);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'bank', pod: 'api-8' });
});

test('an IP a pod gives up (finished, or changed) is remembered like a deletion', () => {
  const { b } = book();
  const job = pod('batch', 'job-1', ['10.244.1.9']);
  b.apply([up(job), up({ ...job, phase: 'Succeeded' })]);
  assert.deepEqual(b.lookup('10.244.1.9'), { namespace: 'batch', pod: 'job-1' });
  const moved = pod('shop', 'web-2', ['10.244.1.10']);
  b.apply([up(moved), up({ ...moved, ips: ['10.244.1.11'] })]);
  assert.deepEqual(b.lookup('10.244.1.10'), { namespace: 'shop', pod: 'web-2' });
  assert.deepEqual(b.lookup('10.244.1.11'), { namespace: 'shop', pod: 'web-2' });
  assert.equal(b.size, 1);
});

test("hostNetwork pods are never named: their address is the node's", () => {
  const { b } = book();
  b.apply([up(pod('kube-system', 'kube-proxy-x', ['172.18.0.2'], { hostNetwork: true }))]);
  assert.equal(b.lookup('172.18.0.2'), undefined);
});

test('other kinds of events change nothing; the same batch replayed changes nothing', () => {
  const { b } = book();
  const web = pod('shop', 'web-1', ['10.244.1.5']);
  const batch: ModelEvent[] = [up(web), { kind: 'Namespace', op: 'upsert', object: { name: 'shop', labels: {} } }, { kind: 'Node', op: 'delete', name: 'x' }];
  b.apply(batch);
  b.apply(batch);
  assert.deepEqual(b.lookup('10.244.1.5'), { namespace: 'shop', pod: 'web-1' });
  assert.equal(b.size, 1);
  assert.equal(b.deletedSize, 0);
});
