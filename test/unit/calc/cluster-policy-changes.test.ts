// What a ClusterNetworkPolicy change costs calc: the chains of the pods its old or new version
// holds are rewritten, no other's, and each local pod is matched against the changed
// policies' subjects only, not against every policy's (and on a namespace's label change, its
// pods against the subjects it enters or leaves only); every step still equals a cold compile
// (the chains and sets, the audit tags, and the policies reported as holding a local pod).

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import type { Names } from '../../../src/calc/index.ts';
import type { Namespace, Pod, RawClusterNetworkPolicy } from '../../../src/model/types.ts';
import { AUDIT, auditTags, cold, coldCalc, EMPTY, MARKS, NODE, clusterPolicy, diff, newCalc, pod, policy, referencedSets, rng, snapshot, world } from './fixtures.ts';
import type { World } from './fixtures.ts';

const NAMESPACES: Namespace[] = [
  { name: 'a', labels: { team: 'a' } },
  { name: 'b', labels: { team: 'b' } },
];
const PODS: Pod[] = [
  ...[1, 2, 3].map((i) => pod('a', `web-${i}`, { labels: { app: 'web' }, ip4: i })),
  ...[4, 5, 6].map((i) => pod('b', `db-${i}`, { labels: { app: 'db' }, ip4: i })),
  pod('b', 'remote', { labels: { app: 'db' }, ip4: 7, nodeName: 'node-b' }),
];
const LOCAL = PODS.filter((p) => p.nodeName === NODE).length;
/** Policies whose subject holds no pod: what a change of another one must not walk. */
const BYSTANDERS = 40;

function cnp(name: string, priority: number, subject: unknown, port = 80, generation = 1): RawClusterNetworkPolicy {
  return clusterPolicy(
    name,
    { tier: 'Admin', priority, subject, ingress: [{ action: 'Deny', from: [{ networks: ['192.0.2.0/24'] }], protocols: [{ tcp: { destinationPort: { number: port } } }] }] },
    generation,
  );
}
const podsOf = (ns: string) => ({ namespaces: { matchLabels: { team: ns } } });
const NOBODY = { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'none' } } } };

function worldWith(cnps: RawClusterNetworkPolicy[]): World {
  return { ...world(PODS, NAMESPACES, []), clusterPolicies: new Map(cnps.map((p) => [p.name, p])) };
}

/** A calc that records the uids whose workload chains each batch writes, and counts the
 *  subject matches its cluster state answers. */
function countingCalc(): { calc: Calculator; written: Set<string>; matches: () => number } {
  const names = makeNames('cali');
  const written = new Set<string>();
  const fromWorkload = (uid: string) => {
    written.add(uid);
    return names.fromWorkload(uid);
  };
  const counting: Names = { ...names, fromWorkload };
  const calc = new Calculator({ nodeName: NODE, names: counting, families: [4, 6], marks: MARKS, podBridge: 'cni0', sourceBinding: true, audit: AUDIT });
  let n = 0;
  const cluster = calc.cluster;
  const match = cluster.peerMatchesPod.bind(cluster);
  cluster.peerMatchesPod = (peer, p) => {
    n++;
    return match(peer, p);
  };
  return { calc, written, matches: () => n };
}

describe('a namespace label change while ClusterNetworkPolicies exist', () => {
  test('matches the local pods of that namespace against only the policies whose subject it enters or leaves', () => {
    const { calc, matches, written } = countingCalc();
    const nobody = Array.from({ length: BYSTANDERS }, (_, i) => cnp(`bystander-${i}`, i, NOBODY));
    const everyPod = Array.from({ length: BYSTANDERS }, (_, i) => cnp(`all-${i}`, BYSTANDERS + i, { namespaces: {} }));
    const focus = [
      cnp('team-a', 100, podsOf('a')),
      cnp('team-c', 101, podsOf('c')),
      cnp('webs-of-a', 102, { pods: { namespaceSelector: { matchLabels: { team: 'a' } }, podSelector: { matchLabels: { app: 'web' } } } }),
      cnp('named-a', 103, { namespaces: { matchLabels: { 'kubernetes.io/metadata.name': 'a' } } }),
    ];
    const withA = (a: Namespace | undefined): World => {
      const w = worldWith([...nobody, ...everyPod, ...focus]);
      const namespaces = new Map(w.namespaces);
      if (a) namespaces.set('a', a);
      else namespaces.delete('a');
      return { ...w, namespaces };
    };
    let prev = withA(NAMESPACES[0]);
    calc.applyEvents(diff(EMPTY, prev));
    const localInA = PODS.filter((p) => p.nodeName === NODE && p.namespace === 'a');
    const inA = localInA.map((p) => p.uid).sort();
    const step = (a: Namespace | undefined, flipped: number, what: string): string[] => {
      const w = withA(a);
      const n = matches();
      written.clear();
      calc.applyEvents(diff(prev, w));
      prev = w;
      const made = matches() - n;
      assert.ok(made <= localInA.length * flipped, `${what}: ${made} subject matches for ${localInA.length} local pods and ${flipped} policies it flips`);
      assert.equal(snapshot(calc.desired), cold(w), `${what}: incremental differs from cold`);
      return [...written].sort();
    };
    assert.deepEqual(step({ name: 'a', labels: { team: 'a', extra: 'x' } }, 0, 'a label no subject reads'), [], 'a label no subject reads');
    assert.deepEqual(step({ name: 'a', labels: { team: 'c', extra: 'x' } }, 3, 'a move from team a to team c'), inA, 'a move from team a to team c');
    assert.deepEqual(step(undefined, 1, 'the namespace deleted'), inA, 'the namespace deleted');
    assert.deepEqual(step({ name: 'a', labels: {} }, 0, 'the namespace created without labels'), [], 'the namespace created without labels');
    assert.deepEqual(step(NAMESPACES[0], 2, 'its team label back'), inA, 'its team label back');
  });
});

describe('a NetworkPolicy change while ClusterNetworkPolicies exist', () => {
  test('matches no pod against any ClusterNetworkPolicy subject: it cannot change which of them hold a pod', () => {
    const { calc, matches } = countingCalc();
    const everyPod = Array.from({ length: BYSTANDERS }, (_, i) => cnp(`all-${i}`, i, { namespaces: {} }));
    let prev = worldWith(everyPod);
    calc.applyEvents(diff(EMPTY, prev));
    const step = (policies: World['policies'], what: string) => {
      const w = { ...prev, policies };
      const n = matches();
      calc.applyEvents(diff(prev, w));
      prev = w;
      assert.equal(matches() - n, 0, `${what}: subject matches`);
      assert.equal(snapshot(calc.desired), cold(w), `${what}: incremental differs from cold`);
    };
    const webOnly = policy('a', 'web-only', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 80 }] }] });
    step(new Map([['a/web-only', webOnly]]), 'a policy created');
    const webOnly2 = policy('a', 'web-only', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 443 }] }] }, 2);
    step(new Map([['a/web-only', webOnly2]]), 'its port changed');
    step(new Map(), 'the policy deleted');
  });
});

describe('a ClusterNetworkPolicy change', () => {
  const bystanders = Array.from({ length: BYSTANDERS }, (_, i) => cnp(`bystander-${i}`, i, NOBODY));

  test('rewrites the chains of the pods its old or new subject holds, and no other pod', () => {
    const { calc, written } = countingCalc();
    let prev = worldWith([...bystanders, cnp('focus', 50, podsOf('a'))]);
    calc.applyEvents(diff(EMPTY, prev));
    const step = (cnps: RawClusterNetworkPolicy[]): string[] => {
      const w = worldWith([...bystanders, ...cnps]);
      written.clear();
      calc.applyEvents(diff(prev, w));
      prev = w;
      assert.equal(snapshot(calc.desired), cold(w), 'incremental differs from cold');
      return [...written].sort();
    };
    const inA = ['a/web-1', 'a/web-2', 'a/web-3'];
    const inB = ['b/db-4', 'b/db-5', 'b/db-6'];
    const dbs = { pods: { namespaceSelector: {}, podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['db'] }] } } };
    assert.deepEqual(step([cnp('focus', 7, podsOf('a'), 80, 2)]), inA, 'a priority change');
    assert.deepEqual(step([cnp('focus', 7, podsOf('a'), 443, 3)]), inA, 'a rule change');
    assert.deepEqual(step([cnp('focus', 7, dbs, 443, 4)]), [...inA, ...inB], 'a subject that moves from a to b');
    assert.deepEqual(step([cnp('focus', 7, { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } } }, 443, 5)]), inB, 'the same subject, spelt otherwise');
    const emptied = cnp('focus', 7, NOBODY, 443, 6);
    assert.deepEqual(step([emptied]), inB, 'its subject emptied');
    assert.deepEqual(step([emptied, cnp('bystander-1', 3, NOBODY, 8080, 2)]), [], 'a change of a policy that holds no pod, before or after');
    assert.deepEqual(step([]), [], 'deleting a policy that holds no pod');
    assert.deepEqual(step([cnp('focus', 1, podsOf('b'))]), inB, 'a policy created');
  });

  test('matches each local pod against the changed policy only, not against every policy', () => {
    const { calc, matches } = countingCalc();
    const everyPod = Array.from({ length: BYSTANDERS }, (_, i) => cnp(`all-${i}`, i, { namespaces: {} }));
    const before = worldWith([...bystanders, ...everyPod]);
    calc.applyEvents(diff(EMPTY, before));
    for (const [i, changed] of [cnp('bystander-3', 500, NOBODY, 80, 2), cnp('all-3', 500, { namespaces: {} }, 80, 2), cnp('all-4', 4, { namespaces: {} }, 8080, 2)].entries()) {
      const after = worldWith([...bystanders, ...everyPod].map((p) => (p.name === changed.name ? changed : p)));
      const n = matches();
      calc.applyEvents(diff(before, after));
      assert.ok(matches() - n <= LOCAL, `change ${i} (${changed.name}): ${matches() - n} subject matches for ${LOCAL} local pods and one changed policy`);
      assert.equal(snapshot(calc.desired), cold(after));
      calc.applyEvents(diff(after, before));
      assert.equal(snapshot(calc.desired), cold(before));
    }
  });

  test('pods that share a list of policies share one array after a change too (their tier rules are built once)', () => {
    const { calc } = countingCalc();
    const everyPod = Array.from({ length: 5 }, (_, i) => cnp(`all-${i}`, i, { namespaces: {} }));
    const w0 = worldWith(everyPod);
    calc.applyEvents(diff(EMPTY, w0));
    const w1 = worldWith(everyPod.map((p, i) => (i === 2 ? cnp('all-2', 9, { namespaces: {} }, 80, 2) : p)));
    calc.applyEvents(diff(w0, w1));
    const lists = PODS.filter((p) => p.nodeName === NODE).map((p) => calc.selection(p.uid)?.tiers.admin);
    assert.equal(lists[0]?.length, 5);
    assert.deepEqual(
      lists[0]?.map((p) => p.name),
      ['all-0', 'all-1', 'all-3', 'all-4', 'all-2'],
    );
    for (const l of lists) assert.equal(l, lists[0]);
  });
});

/** ClusterNetworkPolicies a walk changes in every way: subject, tier, priority (ties), rules. */
const SUBJECTS: unknown[] = [
  podsOf('a'),
  podsOf('b'),
  { namespaces: {} },
  NOBODY,
  { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'web' } } } },
  { pods: { namespaceSelector: { matchLabels: { team: 'b' } }, podSelector: { matchLabels: { app: 'db' } } } },
  { namespaces: { matchExpressions: [{ key: 'team', operator: 'DoesNotExist' }] } },
];
const ACTIONS = ['Accept', 'Deny', 'Pass'];

function randomPolicy(r: () => number, name: string, generation: number): RawClusterNetworkPolicy {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
  const audit = pick([undefined, undefined, 'deny', 'all']);
  const p = clusterPolicy(
    name,
    {
      tier: pick(['Admin', 'Admin', 'Baseline']),
      priority: pick([1, 2, 3]),
      subject: pick(SUBJECTS),
      ingress: [{ action: pick(ACTIONS), from: [{ namespaces: pick([{}, { matchLabels: { team: 'a' } }]) }], protocols: [{ tcp: { destinationPort: { number: pick([80, 443]) } } }] }],
      egress: r() < 0.5 ? [{ action: pick(ACTIONS), to: [{ networks: [pick(['10.0.0.0/8', '192.0.2.0/24', 'fd00::/8'])] }] }] : undefined,
    },
    generation,
  );
  return audit ? { ...p, annotations: { 'weir.dev/audit': audit } } : p;
}

describe('ClusterNetworkPolicy changes over random walks', () => {
  for (const seed of [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]) {
    test(`every step of walk ${seed} (policies, pod labels, namespace labels and deletions, in batches of one or more) equals a cold compile`, () => {
      const r = rng(seed);
      const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
      let w: World = worldWith([]);
      const c = newCalc();
      c.applyEvents(diff(EMPTY, w));
      let generation = 1;
      for (let i = 0; i < 80; i++) {
        const next = { pods: new Map(w.pods), namespaces: new Map(w.namespaces), policies: w.policies, clusterPolicies: new Map(w.clusterPolicies) };
        // One to three changes per batch, so that pods and policies change in the same batch.
        for (let k = 1 + Math.floor(r() * 3); k > 0; k--) {
          const choice = r();
          if (choice < 0.55) {
            const name = `p${Math.floor(r() * 8)}`;
            if (next.clusterPolicies.has(name) && r() < 0.25) next.clusterPolicies.delete(name);
            else next.clusterPolicies.set(name, randomPolicy(r, name, generation++));
          } else if (choice < 0.75) {
            const p = pick([...next.pods.values()]);
            next.pods.set(p.uid, { ...p, labels: { app: pick(['web', 'db', 'none']) } });
          } else if (choice < 0.85) {
            const n = pick(NAMESPACES);
            // Deleted too: its pods' namespace labels fall back to its name alone.
            if (next.namespaces.has(n.name) && r() < 0.25) next.namespaces.delete(n.name);
            else next.namespaces.set(n.name, { name: n.name, labels: { team: pick(['a', 'b', 'c']) } });
          } else if (choice < 0.93) {
            const n = 20 + Math.floor(r() * 6);
            const p = pod(pick(['a', 'b']), `new-${n}`, { labels: { app: pick(['web', 'db']) }, ip4: n, nodeName: pick([NODE, 'node-b']) });
            if (next.pods.has(p.uid)) next.pods.delete(p.uid);
            else next.pods.set(p.uid, p);
          } else {
            const p = pick([...next.pods.values()]);
            next.pods.set(p.uid, { ...p, phase: pick(['Running', 'Succeeded']) });
          }
        }
        c.applyEvents(diff(w, next));
        w = next;
        const want = coldCalc(w);
        assert.equal(snapshot(c.desired), snapshot(want.desired), `seed ${seed} step ${i}: incremental differs from cold`);
        assert.deepEqual(auditTags(c), auditTags(want), `seed ${seed} step ${i}: audit tags differ from cold`);
        assert.deepEqual([...c.desired.sets.keys()].sort(), referencedSets(c.desired), `seed ${seed} step ${i}: desired sets are not the sets rules reference`);
        assert.deepEqual(
          c.enforcedClusterPolicyReports().map((p) => p.name),
          want.enforcedClusterPolicyReports().map((p) => p.name),
          `seed ${seed} step ${i}: the policies whose subject holds a local pod differ from cold`,
        );
      }
    });
  }
});
