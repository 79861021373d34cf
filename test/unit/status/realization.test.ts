import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { PolicyStatusInput, Realization } from '../../../src/status/policy-status.ts';
import { bucketOf, createRealizationTracker, decodeDigest, digestOf, DIGEST_BUCKETS, encodeDigest } from '../../../src/status/realization.ts';
import type { NodeDigest } from '../../../src/status/realization.ts';
import { rng } from '../../support/rng.ts';

const policy = (uid: string, generation: number, desiredNodes: string[]): PolicyStatusInput => ({
  namespace: 'shop',
  name: uid,
  uid,
  generation,
  accepted: { ok: true, message: '' },
  desiredNodes,
});

/** What each node's NodePolicyStatus says: the digest of the (uid, generation) pairs it holds. */
const reports = (held: Record<string, Record<string, number>>): Map<string, NodeDigest> =>
  new Map(Object.entries(held).map(([node, ps]) => [node, digestOf(Object.entries(ps).map(([uid, generation]) => ({ uid, generation })))]));

/** Two uids that share a bucket, and one that does not. */
function sameBucket(): [string, string, string] {
  const first = 'u-web';
  let mate = '';
  let other = '';
  for (let i = 0; mate === '' || other === ''; i++) {
    const uid = `u-${i}`;
    if (bucketOf(uid) === bucketOf(first)) mate ||= uid;
    else other ||= uid;
  }
  return [first, mate, other];
}

describe('digests', () => {
  test('the same set gives the same digest in any order; a generation or a member changes it', () => {
    const a = encodeDigest(
      digestOf([
        { uid: 'u1', generation: 1 },
        { uid: 'u2', generation: 5 },
      ]),
    );
    assert.equal(
      a,
      encodeDigest(
        digestOf([
          { uid: 'u2', generation: 5 },
          { uid: 'u1', generation: 1 },
        ]),
      ),
    );
    assert.notEqual(
      a,
      encodeDigest(
        digestOf([
          { uid: 'u1', generation: 2 },
          { uid: 'u2', generation: 5 },
        ]),
      ),
    );
    assert.notEqual(a, encodeDigest(digestOf([{ uid: 'u1', generation: 1 }])));
    assert.equal(a.length, DIGEST_BUCKETS * 16);
  });

  test('reads back what it writes; malformed text proves nothing', () => {
    const d = digestOf([{ uid: 'u1', generation: 1 }]);
    assert.deepEqual(decodeDigest(d.buckets, encodeDigest(d)), d);
    assert.equal(decodeDigest(DIGEST_BUCKETS, 'zz'), null);
    assert.equal(decodeDigest(DIGEST_BUCKETS, encodeDigest(d).toUpperCase().replace(/[0-9]/g, 'G')), null);
    assert.equal(decodeDigest('128', encodeDigest(d)), null);
    assert.equal(decodeDigest(DIGEST_BUCKETS, encodeDigest(d).slice(1)), null);
  });
});

describe('realization tracker', () => {
  const one = (policies: PolicyStatusInput[], held: Record<string, Record<string, number>>, uid = policies[0].uid): Realization => createRealizationTracker().update(policies, reports(held)).get(uid)!;

  const cases: { name: string; desired: string[]; held: Record<string, Record<string, number>>; expected: Realization }[] = [
    { name: 'a node holding the current generation has realized it', desired: ['a'], held: { a: { 'u-web': 3 } }, expected: { desired: 1, realized: 1, pending: [] } },
    { name: 'a node at an older generation is pending', desired: ['a'], held: { a: { 'u-web': 2 } }, expected: { desired: 1, realized: 0, pending: ['a'] } },
    {
      name: 'a node at a later generation is pending until the aggregator sees that generation too',
      desired: ['a'],
      held: { a: { 'u-web': 4 } },
      expected: { desired: 1, realized: 0, pending: ['a'] },
    },
    { name: 'a node that does not hold the policy is pending', desired: ['a'], held: { a: {} }, expected: { desired: 1, realized: 0, pending: ['a'] } },
    { name: 'a node without a NodePolicyStatus is pending', desired: ['x'], held: {}, expected: { desired: 1, realized: 0, pending: ['x'] } },
    { name: 'no desired nodes: nothing to realize', desired: [], held: { a: { 'u-web': 3 } }, expected: { desired: 0, realized: 0, pending: [] } },
    {
      name: 'duplicate desired nodes count once; pending is sorted',
      desired: ['x', 'b', 'a', 'b'],
      held: { a: { 'u-web': 3 }, b: { 'u-web': 1 } },
      expected: { desired: 3, realized: 1, pending: ['b', 'x'] },
    },
  ];
  for (const c of cases) test(c.name, () => assert.deepEqual(one([policy('u-web', 3, c.desired)], c.held), c.expected));

  test('a node that holds a policy it should not enforce proves nothing else in that bucket', () => {
    const [web, mate] = sameBucket();
    const r = createRealizationTracker().update([policy(web, 1, ['a']), policy(mate, 1, [])], reports({ a: { [web]: 1, [mate]: 1 } }));
    assert.deepEqual(r.get(web), { desired: 1, realized: 0, pending: ['a'] });
  });

  test('a node catching up with one policy keeps what it proved for the others of the same bucket', () => {
    const [web, mate, other] = sameBucket();
    const t = createRealizationTracker();
    const v1 = [policy(web, 1, ['a']), policy(mate, 1, ['a']), policy(other, 1, ['a'])];
    const r1 = t.update(v1, reports({ a: { [web]: 1, [mate]: 1, [other]: 1 } }));
    assert.deepEqual(
      [...r1.values()].map((r) => r.realized),
      [1, 1, 1],
    );

    // mate moves to generation 2; node a still holds 1: its bucket no longer matches.
    const v2 = [policy(web, 1, ['a']), policy(mate, 2, ['a']), policy(other, 1, ['a'])];
    const r2 = t.update(v2, reports({ a: { [web]: 1, [mate]: 1, [other]: 1 } }));
    assert.deepEqual(r2.get(web), { desired: 1, realized: 1, pending: [] }, 'web was proven at generation 1 and still is');
    assert.deepEqual(r2.get(mate), { desired: 1, realized: 0, pending: ['a'] });

    const r3 = t.update(v2, reports({ a: { [web]: 1, [mate]: 2, [other]: 1 } }));
    assert.deepEqual(
      [...r3.values()].map((r) => r.realized),
      [1, 1, 1],
    );
  });

  test('a new generation needs a new proof, and so does a node that becomes desired', () => {
    const t = createRealizationTracker();
    t.update([policy('u-web', 1, ['a'])], reports({ a: { 'u-web': 1 }, b: {} }));
    assert.deepEqual(t.update([policy('u-web', 2, ['a'])], reports({ a: { 'u-web': 1 }, b: {} })).get('u-web'), { desired: 1, realized: 0, pending: ['a'] });
    assert.deepEqual(t.update([policy('u-web', 2, ['a', 'b'])], reports({ a: { 'u-web': 2 }, b: {} })).get('u-web'), { desired: 2, realized: 1, pending: ['b'] });
    assert.deepEqual(t.update([policy('u-web', 2, ['a'])], reports({ a: { 'u-web': 2 }, b: {} })).get('u-web'), { desired: 1, realized: 1, pending: [] }, 'b is no longer desired');
  });

  test('a forgotten node (its NodePolicyStatus deleted) must prove everything again', () => {
    const [web, mate] = sameBucket();
    const t = createRealizationTracker();
    t.update([policy(web, 1, ['a']), policy(mate, 1, ['a'])], reports({ a: { [web]: 1, [mate]: 1 } }));
    t.forgetNode('a');
    const r = t.update([policy(web, 1, ['a']), policy(mate, 2, ['a'])], reports({ a: { [web]: 1, [mate]: 1 } }));
    assert.deepEqual(r.get(web), { desired: 1, realized: 0, pending: ['a'] });
  });

  test('a node reporting another number of buckets proves nothing', () => {
    const r = createRealizationTracker().update([policy('u-web', 1, ['a'])], new Map([['a', digestOf([{ uid: 'u-web', generation: 1 }], 64)]]));
    assert.deepEqual(r.get('u-web'), { desired: 1, realized: 0, pending: ['a'] });
  });

  test('random walks: never realized unless the node holds the current generation; everything realized once every node caught up', () => {
    for (let seed = 1; seed <= 20; seed++) {
      const rnd = rng(seed);
      const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)];
      const nodes = ['a', 'b', 'c', 'd'];
      // Few buckets, so that policies share them as they do at 20k policies.
      const buckets = 4;
      const t = createRealizationTracker(buckets);
      const gen = new Map<string, number>();
      const desired = new Map<string, string[]>();
      const uids = Array.from({ length: 12 }, (_, i) => `p${seed}-${i}`);
      for (const u of uids) {
        gen.set(u, 1);
        desired.set(
          u,
          nodes.filter(() => rnd() < 0.5),
        );
      }
      const held = new Map(nodes.map((n) => [n, new Map<string, number>()]));
      const input = () => uids.map((u) => policy(u, gen.get(u)!, desired.get(u)!));
      const digests = () =>
        new Map(
          nodes.map((n) => [
            n,
            digestOf(
              [...held.get(n)!].map(([uid, generation]) => ({ uid, generation })),
              buckets,
            ),
          ]),
        );
      /** A node applies: it holds every policy desired on it, at the current generation. */
      const apply = (n: string) => {
        const h = held.get(n)!;
        h.clear();
        for (const u of uids) if (desired.get(u)!.includes(n)) h.set(u, gen.get(u)!);
      };
      for (let step = 0; step < 200; step++) {
        const r = rnd();
        if (r < 0.3) {
          const u = pick(uids);
          gen.set(u, gen.get(u)! + 1);
        } else if (r < 0.5)
          desired.set(
            pick(uids),
            nodes.filter(() => rnd() < 0.5),
          );
        else apply(pick(nodes));
        const got = t.update(input(), digests());
        for (const u of uids) {
          const truth = desired.get(u)!.filter((n) => held.get(n)!.get(u) !== gen.get(u));
          const pending = got.get(u)!.pending;
          for (const n of truth) assert.ok(pending.includes(n), `seed ${seed} step ${step}: ${u} claimed realized on ${n}`);
        }
      }
      for (const n of nodes) apply(n);
      const got = t.update(input(), digests());
      for (const u of uids) assert.deepEqual(got.get(u)!.pending, [], `seed ${seed}: ${u} after every node caught up`);
    }
  });
});
