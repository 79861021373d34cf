import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ListSplitter } from '../../../src/kube/list-splitter.ts';

const tricky = [
  { metadata: { name: 'a', labels: { 'x/y': 'with "quotes" and {braces} [brackets]' } }, spec: { items: [{ nested: true }] } },
  { metadata: { name: 'b\\', annotations: { note: 'ends in a backslash \\', other: '\\"' } }, status: { podIPs: [{ ip: '10.0.0.1' }] } },
  { metadata: { name: 'ünï©ødé ☃' }, data: '"items":[' },
];

function splitAll(body: string, chunkSize: number): { items: unknown[]; rest: unknown } {
  const s = new ListSplitter();
  const items: unknown[] = [];
  for (let i = 0; i < body.length; i += chunkSize) for (const t of s.push(body.slice(i, i + chunkSize))) items.push(JSON.parse(t));
  return { items, rest: s.finish() };
}

test('a list body is split into its items, at every chunk size, and the rest keeps kind and metadata', () => {
  const body = JSON.stringify({ kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: '42', continue: 'abc' }, items: tricky });
  for (let size = 1; size <= body.length; size++) {
    const { items, rest } = splitAll(body, size);
    assert.deepEqual(items, tricky, `chunk size ${size}`);
    assert.deepEqual(rest, { kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: '42', continue: 'abc' }, items: [] }, `chunk size ${size}`);
  }
});

test('metadata after the items, whitespace between tokens and an empty list are read too', () => {
  const pretty = JSON.stringify({ items: tricky, metadata: { resourceVersion: '7' }, kind: 'List' }, null, 2);
  for (const size of [1, 3, 7, 64, pretty.length]) {
    const { items, rest } = splitAll(pretty, size);
    assert.deepEqual(items, tricky);
    assert.deepEqual(rest, { items: [], metadata: { resourceVersion: '7' }, kind: 'List' });
  }
  assert.deepEqual(splitAll('{"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]}', 5), { items: [], rest: { kind: 'PodList', metadata: { resourceVersion: '1' }, items: [] } });
});

test('only the top-level items array is split: a nested "items" key is part of its item', () => {
  const body = JSON.stringify({ metadata: { items: [{ not: 'an item' }] }, items: [{ spec: { items: [{ deep: 1 }] } }] });
  const { items, rest } = splitAll(body, 4);
  assert.deepEqual(items, [{ spec: { items: [{ deep: 1 }] } }]);
  assert.deepEqual(rest, { metadata: { items: [{ not: 'an item' }] }, items: [] });
});

test('a body cut short, or not JSON, fails at the end instead of passing as a shorter list', () => {
  const body = JSON.stringify({ kind: 'PodList', metadata: {}, items: tricky });
  for (const cut of [body.length - 1, body.length - 3, Math.floor(body.length / 2), 20]) {
    const s = new ListSplitter();
    s.push(body.slice(0, cut));
    assert.throws(() => s.finish(), SyntaxError, `cut at ${cut}`);
  }
  const s = new ListSplitter();
  s.push('<html>502 Bad Gateway</html>');
  assert.throws(() => s.finish(), SyntaxError);
});
