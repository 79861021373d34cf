// Merged peers: the rules of many policies that match the same ports become one rule whose set
// is the union of their peers, so a new connection's cost does not grow with the policy count.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Calculator, Rule } from '../../../src/calc/index.ts';
import { makeNames } from '../../../src/calc/index.ts';
import type { Pod, RawNetworkPolicy } from '../../../src/model/types.ts';
import { EMPTY, diff, newCalc, pod, policy, referencedSets, world } from './fixtures.ts';

const names = makeNames('cali');
const NS = [{ name: 'bench', labels: {} }];
const SERVER = pod('bench', 'server', { labels: { app: 'server' }, ip4: 1 });
const peers = (n: number): Pod[] => Array.from({ length: n }, (_, i) => pod('bench', `peer-${i}`, { labels: { peer: `p${i}` }, ip4: 10 + i, nodeName: 'node-b' }));
const allowFrom = (name: string, labels: Record<string, string>, port = 8080): RawNetworkPolicy =>
  policy('bench', name, { podSelector: { matchLabels: { app: 'server' } }, ingress: [{ from: [{ podSelector: { matchLabels: labels } }], ports: [{ protocol: 'TCP', port }] }] });

function calcWith(policyCount: number, pods: Pod[] = peers(50)): Calculator {
  const policies = Array.from({ length: policyCount }, (_, i) => allowFrom(`p${String(i).padStart(4, '0')}`, { peer: `p${i % 50}` }));
  const c = newCalc();
  c.applyEvents(diff(EMPTY, world([SERVER, ...pods], NS, policies)));
  return c;
}

const serverIn = (c: Calculator, f: 4 | 6 = 4): readonly Rule[] => c.desired.chains[f].get(names.toWorkload(SERVER.uid))!;
const allowing = (rules: readonly Rule[]) => rules.filter((r) => r.action.kind === 'setMark' && r.action.value !== 0);
const part = (f: 4 | 6, peer: string) => names.peerSet(f, `pods|ns=bench|peer in (${peer})`);
const setOf = (c: Calculator, r: Rule) => {
  const m = r.matches.find((x) => x.kind === 'set');
  assert.ok(m && m.kind === 'set');
  return c.desired.sets.get(m.set)!;
};

const dirtyAll = (sets: string[]) => new Map(sets.map((n) => [n, 'all' as const]));

describe('merged peers', () => {
  test('a pod selected by 1,000 policies consults as many rules as one selected by 2: one per port signature, no policy chain', () => {
    const few = calcWith(2);
    const many = calcWith(1000);
    assert.equal(serverIn(many).length, serverIn(few).length);
    const [rule] = allowing(serverIn(many));
    assert.equal(allowing(serverIn(many)).length, 1);
    assert.ok(!serverIn(many).some((r) => r.action.kind === 'jump' && r.action.chain.startsWith('cali-pi-')));
    assert.equal(many.desired.chains[4].get(names.policyIngress('bench/p0001')), undefined);
    assert.deepEqual(rule.matches.slice(1), [{ kind: 'proto', protocol: 'TCP', dports: [{ from: 8080, to: 8080 }] }]);
    // The union holds every peer pod's address, once.
    assert.deepEqual(
      [...setOf(many, rule).members].sort(),
      peers(50)
        .map((p) => p.ips[0])
        .sort(),
    );
  });

  test('the union follows its parts: a pod joining, leaving and held by two parts', () => {
    const c = calcWith(3, peers(3));
    const union = () => setOf(c, allowing(serverIn(c))[0]);
    const newcomer = pod('bench', 'new', { labels: { peer: 'p1' }, ip4: 99, nodeName: 'node-b' });
    let dirty = c.applyEvents([{ kind: 'Pod', op: 'upsert', object: newcomer }]);
    assert.ok(union().members.has('10.244.2.99'));
    assert.deepEqual(dirty.sets.get(union().name), new Set(['10.244.2.99']), 'one member added, not the set rebuilt');
    // Two pods briefly share an address across two parts: the member stays until both go.
    const twin = pod('bench', 'twin', { labels: { peer: 'p2' }, ips: newcomer.ips, nodeName: 'node-b' });
    c.applyEvents([{ kind: 'Pod', op: 'upsert', object: twin }]);
    c.applyEvents([{ kind: 'Pod', op: 'delete', uid: newcomer.uid }]);
    assert.ok(union().members.has('10.244.2.99'));
    dirty = c.applyEvents([{ kind: 'Pod', op: 'delete', uid: twin.uid }]);
    assert.ok(!union().members.has('10.244.2.99'));
    assert.deepEqual(dirty.sets.get(union().name), new Set(['10.244.2.99']));
  });

  test('the kernel gets only the sets rules reference: the union, not its parts', () => {
    const c = newCalc();
    const dirty = c.applyEvents(diff(EMPTY, world([SERVER, ...peers(3)], NS, [allowFrom('a', { peer: 'p0' }), allowFrom('b', { peer: 'p1' }), allowFrom('c', { peer: 'p2' })])));
    const unions = ([4, 6] as const).map((f) => setOf(c, allowing(serverIn(c, f))[0]).name).sort();
    assert.deepEqual([...c.desired.sets.keys()].sort(), unions);
    assert.deepEqual(referencedSets(c.desired), unions);
    assert.deepEqual([...dirty.sets.keys()].sort(), unions, 'no part is created in the kernel');
    assert.ok(!c.desired.sets.has(part(4, 'p0')));
    assert.deepEqual([...setOf(c, allowing(serverIn(c))[0]).members].sort(), ['10.244.2.10', '10.244.2.11', '10.244.2.12']);
    assert.deepEqual([...setOf(c, allowing(serverIn(c, 6))[0]).members].sort(), ['fd00::a', 'fd00::b', 'fd00::c']);
  });

  test('a group left with one part uses the part: it enters the kernel whole, the union leaves, and back', () => {
    const pols = [allowFrom('a', { peer: 'p0' }), allowFrom('b', { peer: 'p1' })];
    const c = newCalc();
    c.applyEvents(diff(EMPTY, world([SERVER, ...peers(2)], NS, pols)));
    const unions = [4, 6].map((f) => setOf(c, allowing(serverIn(c, f as 4 | 6))[0]).name);
    let dirty = c.applyEvents([{ kind: 'NetworkPolicy', op: 'delete', namespace: 'bench', name: 'b' }]);
    assert.deepEqual([...c.desired.sets.keys()].sort(), [part(4, 'p0'), part(6, 'p0')].sort());
    assert.equal(setOf(c, allowing(serverIn(c))[0]).name, part(4, 'p0'));
    assert.deepEqual([...c.desired.sets.get(part(4, 'p0'))!.members], ['10.244.2.10']);
    assert.deepEqual([...c.desired.sets.get(part(6, 'p0'))!.members], ['fd00::a']);
    assert.deepEqual(dirty.sets, dirtyAll([part(4, 'p0'), part(6, 'p0'), ...unions]), 'the part is created, the union destroyed; the released part p1 was never in the kernel');
    // The policy comes back: the part is only in a union again, and leaves the kernel.
    dirty = c.applyEvents([{ kind: 'NetworkPolicy', op: 'upsert', object: pols[1] }]);
    assert.deepEqual([...c.desired.sets.keys()].sort(), [...unions].sort());
    assert.deepEqual(dirty.sets, dirtyAll([part(4, 'p0'), part(6, 'p0'), ...unions]));
  });

  test('a set both a union and a policy chain use is in the kernel; only while a rule uses it', () => {
    const loud = { ...allowFrom('c', { peer: 'p0' }), annotations: { 'weir.dev/audit': 'all' } };
    const c = newCalc();
    c.applyEvents(diff(EMPTY, world([SERVER, ...peers(2)], NS, [allowFrom('a', { peer: 'p0' }), allowFrom('b', { peer: 'p1' }), loud])));
    const union = setOf(c, allowing(serverIn(c))[0]).name;
    assert.ok(c.desired.sets.has(part(4, 'p0')), 'the audited policy chain matches on the part');
    assert.deepEqual([...c.desired.sets.keys()].sort(), referencedSets(c.desired));
    // Audited no longer: its rule merges into the same union, and the part leaves the kernel.
    const dirty = c.applyEvents([{ kind: 'NetworkPolicy', op: 'upsert', object: { ...loud, annotations: {} } }]);
    assert.equal(setOf(c, allowing(serverIn(c))[0]).name, union);
    assert.ok(!c.desired.sets.has(part(4, 'p0')));
    assert.deepEqual([...c.desired.sets.keys()].sort(), referencedSets(c.desired));
    assert.equal(dirty.sets.get(part(4, 'p0')), 'all');
    assert.equal(dirty.sets.get(union), undefined, 'the union did not change');
  });

  test('a peer only in a union changing labels dirties the union member, not the part', () => {
    const c = calcWith(2, peers(2));
    const unions = ([4, 6] as const).map((f) => setOf(c, allowing(serverIn(c, f))[0]).name);
    const [p0] = peers(1);
    const dirty = c.applyEvents([{ kind: 'Pod', op: 'upsert', object: { ...p0, labels: { peer: 'gone' } } }]);
    assert.deepEqual(
      dirty.sets,
      new Map([
        [unions[0], new Set(['10.244.2.10'])],
        [unions[1], new Set(['fd00::a'])],
      ]),
    );
    assert.ok(!setOf(c, allowing(serverIn(c))[0]).members.has('10.244.2.10'));
  });

  test('rules of other ports, excepts and named ports stay apart; the union is shared by pods with the same policies', () => {
    const other = pod('bench', 'server-2', { labels: { app: 'server' }, ip4: 2 });
    const blocks = policy('bench', 'blocks', { podSelector: { matchLabels: { app: 'server' } }, ingress: [{ from: [{ ipBlock: { cidr: '192.0.2.0/24', except: ['192.0.2.7/32'] } }] }] });
    const c = newCalc();
    c.applyEvents(diff(EMPTY, world([SERVER, other, ...peers(2)], NS, [allowFrom('a', { peer: 'p0' }), allowFrom('b', { peer: 'p1' }), allowFrom('c', { peer: 'p1' }, 9090), blocks])));
    const rules = serverIn(c);
    const merged = allowing(rules);
    assert.equal(merged.length, 2, 'one rule for 8080 (a and b), one for 9090 (c)');
    assert.ok(
      rules.some((r) => r.action.kind === 'jump' && r.action.chain === names.policyIngress('bench/blocks')),
      'the except block keeps its chain',
    );
    const twin = allowing(c.desired.chains[4].get(names.toWorkload(other.uid))!);
    assert.deepEqual(
      twin.map((r) => setOf(c, r).name),
      merged.map((r) => setOf(c, r).name),
    );
  });

  test('an address both a /32 block and a pod give the union stays in it when the pod leaves: it is counted once for each', () => {
    const [peer] = peers(1);
    const block = policy('bench', 'block', {
      podSelector: { matchLabels: { app: 'server' } },
      ingress: [{ from: [{ ipBlock: { cidr: `${peer.ips[0]}/32` } }], ports: [{ protocol: 'TCP', port: 8080 }] }],
    });
    const c = newCalc();
    c.applyEvents(diff(EMPTY, world([SERVER, peer], NS, [allowFrom('a', { peer: 'p0' }), block])));
    const union = () => setOf(c, allowing(serverIn(c))[0]);
    assert.deepEqual([...union().members], [peer.ips[0]], 'one member, in the form the kernel prints it');
    const dirty = c.applyEvents([{ kind: 'Pod', op: 'upsert', object: { ...peer, labels: { peer: 'gone' } } }]);
    assert.deepEqual([...union().members], [peer.ips[0]], 'the block still holds it');
    assert.equal(dirty.sets.get(union().name), undefined, 'nothing to write: the kernel keeps the address');
  });
});
