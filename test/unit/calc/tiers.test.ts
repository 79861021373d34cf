// ClusterNetworkPolicy tiers in calc: where the tier chains sit in a workload chain, and that
// a pod's Admin chain stays as short with 1,000 policies as with 2 when their rules share an
// action and ports (a new connection's cost does not grow with the policy count).

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Calculator, Rule } from '../../../src/calc/index.ts';
import { makeNames } from '../../../src/calc/index.ts';
import type { Pod, RawClusterNetworkPolicy } from '../../../src/model/types.ts';
import { EMPTY, clusterPolicy, diff, newCalc, pod, policy, world } from './fixtures.ts';

const names = makeNames('cali');
const NS = [{ name: 'bench', labels: {} }];
const SERVER = pod('bench', 'server', { labels: { app: 'server' }, ip4: 1 });
const peers = (n: number): Pod[] => Array.from({ length: n }, (_, i) => pod('bench', `peer-${i}`, { labels: { peer: `p${i}` }, ip4: 10 + i, nodeName: 'node-b' }));
const denyFrom = (i: number, action = 'Deny'): RawClusterNetworkPolicy =>
  clusterPolicy(`deny-${String(i).padStart(4, '0')}`, {
    tier: 'Admin',
    priority: i % 7,
    subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'server' } } } },
    ingress: [{ action, from: [{ pods: { namespaceSelector: {}, podSelector: { matchLabels: { peer: `p${i % 50}` } } } }], protocols: [{ tcp: { destinationPort: { number: 8080 } } }] }],
  });

function calcWith(cnps: RawClusterNetworkPolicy[], extra: object[] = []): Calculator {
  const c = newCalc();
  c.applyEvents(diff(EMPTY, { ...world([SERVER, ...peers(50)], NS, extra as never[]), clusterPolicies: new Map(cnps.map((p) => [p.name, p])) }));
  return c;
}

const chain = (c: Calculator, name: string, f: 4 | 6 = 4): readonly Rule[] | undefined => c.desired.chains[f].get(name);
const adminIn = (c: Calculator) => chain(c, names.tierChain('admin', 'ingress', SERVER.uid));

describe('ClusterNetworkPolicy tiers', () => {
  test('a pod under 1,000 Admin policies of one action and port has an Admin chain as short as under 2', () => {
    const few = calcWith([denyFrom(0), denyFrom(1)]);
    const many = calcWith(Array.from({ length: 1000 }, (_, i) => denyFrom(i)));
    assert.equal(adminIn(many)?.length, 1);
    assert.equal(adminIn(few)?.length, 1);
    const [rule] = adminIn(many) ?? [];
    assert.deepEqual(rule.action, { kind: 'drop' });
    const set = rule.matches.find((m) => m.kind === 'set');
    assert.ok(set && set.kind === 'set');
    assert.equal(many.desired.sets.get(set.set)?.members.size, 50, 'one union of every peer');
  });

  test('alternating actions keep their order: each run of one action is one rule', () => {
    const c = calcWith([denyFrom(0), { ...denyFrom(1, 'Accept'), name: 'z-accept' }, denyFrom(2)].map((p, i) => ({ ...p, spec: { ...(p.spec as object), priority: i } })));
    assert.deepEqual(
      adminIn(c)?.map((r) => r.action),
      [{ kind: 'drop' }, { kind: 'goto', chain: names.tierAccept }, { kind: 'drop' }],
    );
  });

  test('the workload chain consults Admin before NetworkPolicies, and Baseline only when none isolates the pod', () => {
    const baseline = clusterPolicy('b', { tier: 'Baseline', priority: 1, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] });
    const jumps = (c: Calculator) => (chain(c, names.toWorkload(SERVER.uid)) ?? []).flatMap((r) => (r.action.kind === 'jump' ? [r.action.chain] : []));
    const admin = names.tierChain('admin', 'ingress', SERVER.uid);
    const base = names.tierChain('baseline', 'ingress', SERVER.uid);
    const open = calcWith([denyFrom(0), baseline]);
    assert.deepEqual(jumps(open), [names.workloadCommon, admin, base]);
    const isolated = calcWith([denyFrom(0), baseline], [policy('bench', 'iso', { podSelector: {}, policyTypes: ['Ingress'] })]);
    assert.deepEqual(jumps(isolated), [names.workloadCommon, admin]);
    assert.equal(chain(isolated, base), undefined, 'no Baseline chain while a NetworkPolicy isolates the pod');
  });

  test('audit: level deny logs Deny rules, level all Accept too, Pass never; the tag names policy, tier and rule', () => {
    const audited = (level: string) => ({
      ...clusterPolicy('guard', {
        tier: 'Admin',
        priority: 1,
        subject: { namespaces: {} },
        ingress: [
          { action: 'Pass', from: [{ namespaces: { matchLabels: { team: 'x' } } }] },
          { action: 'Accept', from: [{ namespaces: { matchLabels: { team: 'y' } } }] },
          { action: 'Deny', from: [{ namespaces: {} }] },
        ],
      }),
      annotations: { 'weir.dev/audit': level },
    });
    const logged = (c: Calculator) => (adminIn(c) ?? []).flatMap((r) => (r.action.kind === 'nflog' ? [c.auditCatalog.lookup(r.action.prefix)] : []));
    const tag = (verdict: string, rule: number) => ({ verdict, direction: 'ingress', policy: { kind: 'ClusterNetworkPolicy', name: 'guard', tier: 'Admin', rule } });
    assert.deepEqual(logged(calcWith([audited('deny')])), [tag('deny', 2)]);
    assert.deepEqual(logged(calcWith([audited('all')])), [tag('allow', 1), tag('deny', 2)]);
    assert.deepEqual(logged(calcWith([audited('off')])), []);
  });
});
