// The audit tag catalog: a prefix stays readable while any owner's rules still log under it.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { AuditTag } from '../../../src/calc/audit-tags.ts';
import { TagCatalog } from '../../../src/calc/tag-catalog.ts';

const tag: AuditTag = { verdict: 'deny', direction: 'ingress', policy: { kind: 'ClusterNetworkPolicy', name: 'guard', tier: 'Admin', rule: 0 } };

test('a tag two owners log stays live when one releases it, however many others retire meanwhile', () => {
  const catalog = new TagCatalog(77);
  const a: string[] = [];
  const b: string[] = [];
  const log = catalog.log('TDI', 'guard\ningress\n0', tag, a);
  catalog.log('TDI', 'guard\ningress\n0', tag, b);
  assert.equal(log.kind, 'nflog');
  const prefix = a[0];
  catalog.release(a);
  // Churn: enough rules come and go to push anything retired out of the bounded retired map.
  for (let i = 0; i < 5000; i++) {
    const owned: string[] = [];
    catalog.log('DI', `pod-${i}`, { ...tag, policy: null }, owned);
    catalog.release(owned);
  }
  assert.deepEqual(catalog.lookup(prefix), tag, 'b still writes rules under it');
  catalog.release(b);
  assert.deepEqual(catalog.lookup(prefix), tag, 'retired: an event logged just before may still come');
});

test('own() adds an owner to prefixes already logged, so reused rules keep their tags alive', () => {
  const catalog = new TagCatalog(77);
  const first: string[] = [];
  catalog.log('TDI', 'guard\ningress\n0', tag, first);
  const reuse: string[] = [];
  catalog.own(first, reuse);
  catalog.release(first);
  for (let i = 0; i < 5000; i++) {
    const owned: string[] = [];
    catalog.log('DI', `pod-${i}`, { ...tag, policy: null }, owned);
    catalog.release(owned);
  }
  assert.deepEqual(catalog.lookup(reuse[0]), tag);
});
