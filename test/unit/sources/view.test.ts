import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { manifestRevision, mergeFiles } from '../../../src/sources/manifests/merge.ts';
import { diffViews, sameJson } from '../../../src/sources/view.ts';
import type { ModelUpsert } from '../../../src/sources/view.ts';
import { isPeerEligible, isPoliced } from '../../../src/model/cluster.ts';
import type { ModelEvent, Pod, RawNetworkPolicy } from '../../../src/model/types.ts';

function pod(name: string, labels: Record<string, string> = {}, namespace = 'default', phase = 'Running'): ModelUpsert {
  const object: Pod = {
    uid: `${namespace}/${name}`,
    namespace,
    name,
    labels,
    nodeName: 'n1',
    hostNetwork: false,
    phase,
    terminating: false,
    ips: ['10.0.0.1'],
    ports: [],
  };
  return { kind: 'Pod', op: 'upsert', object };
}
const ns = (name: string, labels: Record<string, string> = {}): ModelUpsert => ({ kind: 'Namespace', op: 'upsert', object: { name, labels } });
const node = (name: string): ModelUpsert => ({ kind: 'Node', op: 'upsert', object: { name, podCIDRs: [] } });
const policy = (namespace: string, name: string, spec: unknown): ModelUpsert => ({
  kind: 'NetworkPolicy',
  op: 'upsert',
  object: { namespace, name, uid: `${namespace}/${name}`, generation: 1, spec },
});

test('mergeFiles: for a key defined twice the file that sorts last wins, and both files are named', () => {
  const { view, duplicates } = mergeFiles([
    { name: 'b.yaml', items: [pod('web', { v: 'b' })] },
    { name: 'a.yaml', items: [pod('web', { v: 'a' }), ns('x')] },
  ]);
  assert.deepEqual(view.get('Pod/default/web')?.upsert, pod('web', { v: 'b' }));
  assert.equal(view.get('Pod/default/web')?.file, 'b.yaml');
  assert.deepEqual(duplicates, [{ key: 'Pod/default/web', ref: 'Pod default/web', loser: 'a.yaml', winner: 'b.yaml' }]);
  assert.equal(view.size, 2);
});

test('mergeFiles: within one file the later document wins', () => {
  const { view, duplicates } = mergeFiles([{ name: 'a.yaml', items: [ns('x', { v: '1' }), ns('x', { v: '2' })] }]);
  assert.deepEqual(view.get('Namespace/x')?.upsert, ns('x', { v: '2' }));
  assert.deepEqual(
    duplicates.map((d) => [d.loser, d.winner]),
    [['a.yaml', 'a.yaml']],
  );
});

const podIn = (view: ReturnType<typeof mergeFiles>['view'], uid: string): Pod => {
  const e = view.get(`Pod/${uid}`)?.upsert;
  assert.ok(e?.kind === 'Pod', `no pod ${uid}`);
  return e.object;
};

test('mergeFiles: the pods of a namespace whose Namespace cannot be read stay policed but are no peer', () => {
  const { view } = mergeFiles([
    { name: 'a.yaml', items: [ns('x', { team: 'a' }), ns('y'), pod('p', {}, 'x'), pod('q', {}, 'y'), pod('done', {}, 'x', 'Succeeded')] },
    // A later file's unreadable definition of x wins over the readable one.
    { name: 'b.yaml', items: [{ kind: 'UnreadableNamespace', name: 'x' }] },
  ]);
  assert.equal(view.has('Namespace/x'), false, 'no labels are made up for x');
  assert.ok(isPoliced(podIn(view, 'x/p')) && !isPeerEligible(podIn(view, 'x/p')));
  assert.ok(isPeerEligible(podIn(view, 'y/q')));
  assert.equal(podIn(view, 'x/done').phase, 'Succeeded');

  // Without the unreadable definition, x and its pods are back as they were.
  const fixed = mergeFiles([{ name: 'a.yaml', items: [ns('x', { team: 'a' }), pod('p', {}, 'x')] }]).view;
  assert.ok(fixed.has('Namespace/x') && isPeerEligible(podIn(fixed, 'x/p')));
});

test('mergeFiles: a Namespace whose name cannot be read makes every pod of a namespace without a readable Namespace no peer', () => {
  const { view } = mergeFiles([{ name: 'a.yaml', items: [ns('x'), pod('p', {}, 'x'), pod('q', {}, 'y'), { kind: 'UnreadableNamespace', name: null }] }]);
  assert.ok(isPeerEligible(podIn(view, 'x/p')), 'x is known');
  assert.ok(isPoliced(podIn(view, 'y/q')) && !isPeerEligible(podIn(view, 'y/q')), 'y may be the unreadable one');
});

test('mergeFiles: a policy whose namespace cannot be read stands in every namespace of the view', () => {
  const broken: RawNetworkPolicy = { namespace: '', name: '(unreadable)', uid: '/(unreadable)', generation: 1, spec: { podSelector: {} } };
  const { view, duplicates } = mergeFiles([
    { name: 'a.yaml', items: [ns('x'), pod('p', {}, 'y'), policy('z', 'valid', {})] },
    { name: 'b.yaml', items: [{ kind: 'AnyNamespacePolicy', policy: broken }] },
  ]);
  const copies = [...view.values()].flatMap((e) => (e.upsert.kind === 'NetworkPolicy' && e.upsert.object.name === '(unreadable)' ? [e.upsert.object] : []));
  assert.deepEqual(
    copies.map((o) => [o.namespace, o.uid, o.spec]),
    [
      ['x', 'x/(unreadable)', { podSelector: {} }],
      ['y', 'y/(unreadable)', { podSelector: {} }],
    ],
  );
  assert.deepEqual(duplicates, []);
});

test('diffViews emits exactly the changes between two views', async (t) => {
  const view = (...u: ModelUpsert[]) => mergeFiles([{ name: 'f', items: u }]).view;
  const cases: { name: string; prev: ModelUpsert[]; next: ModelUpsert[]; expected: ModelEvent[] }[] = [
    { name: 'unchanged: nothing', prev: [pod('a'), ns('x')], next: [pod('a'), ns('x')], expected: [] },
    { name: 'a label change: one upsert', prev: [pod('a'), pod('b')], next: [pod('a', { l: '1' }), pod('b')], expected: [pod('a', { l: '1' })] },
    {
      name: 'key order inside a spec is not a change',
      prev: [policy('n', 'p', { podSelector: {}, policyTypes: ['Ingress'] })],
      next: [policy('n', 'p', { policyTypes: ['Ingress'], podSelector: {} })],
      expected: [],
    },
    {
      name: 'deletes of every kind carry their identity',
      prev: [pod('a'), ns('x'), node('n1'), policy('x', 'p', {})],
      next: [],
      expected: [
        { kind: 'NetworkPolicy', op: 'delete', namespace: 'x', name: 'p' },
        { kind: 'Pod', op: 'delete', uid: 'default/a' },
        { kind: 'Node', op: 'delete', name: 'n1' },
        { kind: 'Namespace', op: 'delete', name: 'x' },
      ],
    },
    {
      name: 'deletes first, then upserts with namespaces before pods and policies',
      prev: [pod('old')],
      next: [policy('x', 'p', {}), pod('new'), ns('x')],
      expected: [{ kind: 'Pod', op: 'delete', uid: 'default/old' }, ns('x'), pod('new'), policy('x', 'p', {})],
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => assert.deepEqual(diffViews(view(...c.prev), view(...c.next)), c.expected));
  }
});

test('sameJson: equal as JSON whatever the key order, at every depth; array order counts', () => {
  assert.ok(sameJson({ b: [{ d: 1, c: 2 }], a: null }, { a: null, b: [{ c: 2, d: 1 }] }));
  assert.ok(sameJson({ a: 1, gone: undefined }, { a: 1 }), 'an undefined value is no key, as in JSON');
  assert.ok(sameJson({ at: new Date(0) }, { at: new Date(0) }));
  const differ: [unknown, unknown][] = [
    [{ b: [1, 2] }, { b: [2, 1] }],
    [{ a: 1 }, { a: 1, b: 2 }],
    [{ a: 1, b: 2 }, { a: 1 }],
    [{ a: { x: '1' } }, { a: { x: 1 } }],
    [{ a: [] }, { a: {} }],
    [{ a: null }, { a: {} }],
    [{ a: [{}] }, { a: [] }],
    [{ at: new Date(0) }, { at: new Date(1) }],
  ];
  for (const [a, b] of differ) assert.equal(sameJson(a, b), false, `${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
});

test('an upsert whose object only changed key order is no event; a changed label is one', () => {
  const view = (...u: ModelUpsert[]) => mergeFiles([{ name: 'f', items: u }]).view;
  const a = pod('p', { x: '1', y: '2' });
  const reordered = pod('p', { y: '2', x: '1' });
  assert.deepEqual(diffViews(view(a), view(reordered)), []);
  assert.deepEqual(diffViews(view(a), view(pod('p', { x: '1', y: '3' }))), [pod('p', { x: '1', y: '3' })]);
});

test('manifestRevision is a sha256 over the name-sorted files, independent of input order', () => {
  const a = { name: 'a.yaml', content: 'x: 1\n' };
  const b = { name: 'b.yaml', content: 'y: 2\n' };
  const expected = createHash('sha256')
    .update(
      JSON.stringify([
        ['a.yaml', 'x: 1\n'],
        ['b.yaml', 'y: 2\n'],
      ]),
    )
    .digest('hex');
  assert.equal(manifestRevision([b, a]), expected);
  assert.equal(manifestRevision([a, b]), expected);
  assert.notEqual(manifestRevision([a, { ...b, content: 'y: 3\n' }]), expected);
  // Moving text between files is a different input.
  assert.notEqual(
    manifestRevision([
      { name: 'a.yaml', content: 'x: 1\ny: 2\n' },
      { name: 'b.yaml', content: '' },
    ]),
    expected,
  );
});
