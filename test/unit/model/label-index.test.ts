import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LabelIndex } from '../../../src/model/label-index.ts';
import type { Requirement, Selector } from '../../../src/model/types.ts';

const sel = (...requirements: Requirement[]): Selector => ({ key: JSON.stringify(requirements), requirements });
const ids = (c: { size: number; ids: Iterable<string> } | null) => (c === null ? null : { size: c.size, ids: [...c.ids].sort() });

test('LabelIndex lists the smallest candidate list of In and Exists requirements, and forgets removed objects', () => {
  const index = new LabelIndex<string>();
  index.add('a', { app: 'web', tier: 'front' });
  index.add('b', { app: 'web', tier: 'back' });
  index.add('c', { app: 'db' });
  index.add('d', { team: 'x' });

  assert.deepEqual(ids(index.candidates(sel({ key: 'app', operator: 'In', values: ['web', 'db'] }))), { size: 3, ids: ['a', 'b', 'c'] });
  assert.deepEqual(ids(index.candidates(sel({ key: 'app', operator: 'Exists', values: [] }))), { size: 3, ids: ['a', 'b', 'c'] });
  assert.deepEqual(ids(index.candidates(sel({ key: 'app', operator: 'Exists', values: [] }, { key: 'tier', operator: 'In', values: ['back'] }))), { size: 1, ids: ['b'] }, 'the smaller list');
  assert.deepEqual(ids(index.candidates(sel({ key: 'app', operator: 'In', values: ['nope'] }))), { size: 0, ids: [] });
  assert.deepEqual(ids(index.candidates(sel({ key: 'gone', operator: 'Exists', values: [] }))), { size: 0, ids: [] });
  assert.equal(index.candidates(sel({ key: 'app', operator: 'NotIn', values: ['web'] })), null, 'NotIn narrows nothing');
  assert.equal(index.candidates(sel()), null);

  index.remove('a', { app: 'web', tier: 'front' });
  index.remove('c', { app: 'db' });
  assert.deepEqual(ids(index.candidates(sel({ key: 'app', operator: 'Exists', values: [] }))), { size: 1, ids: ['b'] });
  assert.deepEqual(ids(index.candidates(sel({ key: 'tier', operator: 'In', values: ['front', 'back'] }))), { size: 1, ids: ['b'] });
  index.remove('b', { app: 'web', tier: 'back' });
  assert.deepEqual(ids(index.candidates(sel({ key: 'app', operator: 'Exists', values: [] }))), { size: 0, ids: [] });
  assert.deepEqual(ids(index.candidates(sel({ key: 'team', operator: 'Exists', values: [] }))), { size: 1, ids: ['d'] });
});

test('LabelIndex: Exists on a key with a value an object (a StatefulSet pod-name label) holds at 200k objects', () => {
  const index = new LabelIndex<number>();
  for (let i = 0; i < 200_000; i++) index.add(i, { 'statefulset.kubernetes.io/pod-name': `db-${i}` });
  assert.equal(index.candidates(sel({ key: 'statefulset.kubernetes.io/pod-name', operator: 'Exists', values: [] }))?.size, 200_000);
});
