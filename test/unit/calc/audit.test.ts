import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Rule } from '../../../src/calc/index.ts';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import type { Namespace, RawNetworkPolicy } from '../../../src/model/types.ts';
import { AUDIT, EMPTY, MARKS, NODE, diff, newCalc, pod, policy, world } from './fixtures.ts';

const names = makeNames('cali');
const SERVER = pod('shop', 'server', { labels: { app: 'server' }, ip4: 1 });
const CLIENT = pod('shop', 'client', { labels: { app: 'client' }, ip4: 2 });
const allowClient = (annotations: Record<string, string> = {}): RawNetworkPolicy => ({
  ...policy('shop', 'allow-client', {
    podSelector: { matchLabels: { app: 'server' } },
    ingress: [{ from: [{ podSelector: { matchLabels: { app: 'client' } } }], ports: [{ port: 80, protocol: 'TCP' }] }, { from: [{ ipBlock: { cidr: '192.0.2.0/24' } }] }],
  }),
  annotations,
});

function calcOf(namespaces: Namespace[], policies: RawNetworkPolicy[]): Calculator {
  const c = newCalc();
  c.applyEvents(diff(EMPTY, world([SERVER, CLIENT], namespaces, policies)));
  return c;
}

const nflogs = (rules: readonly Rule[] | undefined) => (rules ?? []).filter((r) => r.action.kind === 'nflog');
const prefixOf = (r: Rule) => (r.action.kind === 'nflog' ? r.action.prefix : assert.fail('not an NFLOG rule'));
const serverIn = (c: Calculator) => c.desired.chains[4].get(names.toWorkload(SERVER.uid));
const policyIn = (c: Calculator) => c.desired.chains[4].get(names.policyIngress('shop/allow-client'));

describe('audit rules follow the annotations', () => {
  test('level all: each allowing rule logs first, new connections only, not yet allowed, rate limit last; the tag names policy and rule', () => {
    const c = calcOf([{ name: 'shop', labels: {}, audit: 'all' }], [allowClient()]);
    const rules = policyIn(c)!;
    const logs = nflogs(rules);
    assert.equal(logs.length, 2);
    const first = logs[0];
    assert.deepEqual(first.matches[0], { kind: 'ctstate', states: ['NEW'] });
    assert.deepEqual(first.matches[1], { kind: 'mark', value: 0, mask: MARKS.accept });
    assert.deepEqual(first.matches.at(-1), { kind: 'limit', name: 'cali-an', perSecond: AUDIT.perSecond, burst: AUDIT.burst });
    assert.deepEqual(first.action, { kind: 'nflog', group: AUDIT.group, prefix: prefixOf(first), size: 128 });
    // Each NFLOG rule sits right before the allowing rule whose matches it repeats.
    const i = rules.indexOf(first);
    assert.deepEqual(first.matches.slice(2, -1), rules[i + 1].matches);
    assert.equal(rules[i + 1].action.kind, 'setMark');
    assert.match(prefixOf(first), /^weir:AI:[A-Za-z0-9_-]{20}$/);
    assert.deepEqual(c.auditCatalog.lookup(prefixOf(first)), { verdict: 'allow', direction: 'ingress', policy: { namespace: 'shop', name: 'allow-client', rule: 0 } });
    assert.deepEqual(c.auditCatalog.lookup(prefixOf(logs[1]))?.policy, { namespace: 'shop', name: 'allow-client', rule: 1 });
    // And the default drop of the isolated pod logs too, naming who isolates it.
    const deny = nflogs(serverIn(c));
    assert.equal(deny.length, 1);
    assert.deepEqual(c.auditCatalog.lookup(prefixOf(deny[0])), {
      verdict: 'deny',
      direction: 'ingress',
      policy: null,
      reason: 'default-deny',
      isolatedBy: [{ namespace: 'shop', name: 'allow-client' }],
    });
    const drop = serverIn(c)!.at(-1)!;
    assert.equal(drop.action.kind, 'drop');
    assert.equal(serverIn(c)!.at(-2), deny[0]);
  });

  test('level deny logs the default drop only; off and no annotation log nothing', () => {
    const deny = calcOf([{ name: 'shop', labels: {}, audit: 'deny' }], [allowClient()]);
    assert.equal(nflogs(policyIn(deny)).length, 0);
    assert.equal(nflogs(serverIn(deny)).length, 1);
    for (const ns of [
      { name: 'shop', labels: {} },
      { name: 'shop', labels: {}, audit: 'off' },
    ]) {
      const c = calcOf([ns], [allowClient()]);
      assert.equal(nflogs(policyIn(c)).length + nflogs(serverIn(c)).length, 0, JSON.stringify(ns));
    }
  });

  test("a policy's annotation overrides its namespace's, both ways", () => {
    const quiet = calcOf([{ name: 'shop', labels: {}, audit: 'all' }], [allowClient({ 'weir.dev/audit': 'off' })]);
    assert.equal(nflogs(policyIn(quiet)).length + nflogs(serverIn(quiet)).length, 0);
    const loud = calcOf([{ name: 'shop', labels: {} }], [allowClient({ 'weir.dev/audit': 'all' })]);
    assert.equal(nflogs(policyIn(loud)).length, 2);
    assert.equal(nflogs(serverIn(loud)).length, 1);
  });

  test('a namespace annotation change rewrites only that namespace’s policy and workload chains', () => {
    const c = calcOf([{ name: 'shop', labels: {} }], [allowClient()]);
    const dirty = c.applyEvents([{ kind: 'Namespace', op: 'upsert', object: { name: 'shop', labels: {}, audit: 'all' } }]);
    assert.deepEqual([...dirty.chains[4]].sort(), [names.policyIngress('shop/allow-client'), names.toWorkload(SERVER.uid)].sort());
    assert.equal(dirty.sets.size, 0);
    assert.equal(nflogs(policyIn(c)).length, 2);
    const back = c.applyEvents([{ kind: 'Namespace', op: 'upsert', object: { name: 'shop', labels: {} } }]);
    assert.equal(back.chains[4].size, 2);
    assert.equal(nflogs(policyIn(c)).length, 0);
  });

  test('the tag of a removed rule stays readable for events already on their way', () => {
    const c = calcOf([{ name: 'shop', labels: {}, audit: 'all' }], [allowClient()]);
    const prefix = prefixOf(nflogs(policyIn(c))[0]);
    c.applyEvents([{ kind: 'NetworkPolicy', op: 'delete', namespace: 'shop', name: 'allow-client' }]);
    assert.equal(policyIn(c), undefined);
    assert.equal(c.auditCatalog.lookup(prefix)?.policy?.name, 'allow-client');
    assert.equal(c.auditCatalog.lookup('weir:AI:never-written'), undefined);
  });

  test('with a per-source bucket, every audit rule ends with the node bucket and then one bucket per source, the same for all, in a table sized so that it never fills', () => {
    const c = new Calculator({ nodeName: NODE, names, families: [4, 6], marks: MARKS, audit: { ...AUDIT, perSource: { perSecond: 10, burst: 20 } } });
    c.applyEvents(diff(EMPTY, world([SERVER, CLIENT], [{ name: 'shop', labels: {}, audit: 'all' }], [allowClient()])));
    const limits = [4, 6].flatMap((f) => [...c.desired.chains[f as 4 | 6].values()].flatMap((rules) => nflogs(rules).map((r) => r.matches.at(-1))));
    assert.ok(limits.length >= 4, `${limits.length} audit rules`);
    // A source is forgotten once its bucket would be full again (20 at 10/s: 2 s); only what
    // the node bucket lets through reaches the table, and an address stays at most that long
    // plus one sweep (1 s) after its last packet: 100/s for 3 s, plus the node's burst of 200.
    const want = { kind: 'limit', name: 'cali-an', perSecond: 100, burst: 200, perSource: { name: 'cali-as', perSecond: 10, burst: 20, expireMs: 2000, tableMax: 500 } };
    for (const l of limits) assert.deepEqual(l, want);
  });

  test('a per-source table the kernel could not hold is refused, not silently cut', () => {
    assert.throws(
      () => new Calculator({ nodeName: 'node-a', names, families: [4], marks: MARKS, audit: { ...AUDIT, perSecond: 1_000_000, burst: 1_000_000, perSource: { perSecond: 10, burst: 20 } } }),
      /audit per-source table of 4000000 addresses is more than the kernel's 1048576/,
    );
  });

  test('without audit config no NFLOG rule is ever written', () => {
    const c = new Calculator({ nodeName: 'node-a', names, families: [4], marks: MARKS });
    c.applyEvents(diff(EMPTY, world([SERVER, CLIENT], [{ name: 'shop', labels: {}, audit: 'all' }], [allowClient({ 'weir.dev/enforcement': 'audit' })])));
    for (const rules of c.desired.chains[4].values()) assert.equal(nflogs(rules).length, 0);
  });
});

describe('audit-only policies (weir.dev/enforcement: audit)', () => {
  test('do not isolate: the pod stays open, and what no audit-only policy allows is logged as would-deny', () => {
    const c = calcOf([{ name: 'shop', labels: {} }], [allowClient({ 'weir.dev/enforcement': 'audit' })]);
    const rules = serverIn(c)!;
    assert.equal(
      rules.some((r) => r.action.kind === 'drop'),
      false,
      'an audit-only policy must never drop',
    );
    assert.deepEqual(rules.at(-1)!.action, { kind: 'setMark', value: MARKS.accept, mask: MARKS.accept });
    const would = nflogs(rules);
    assert.equal(would.length, 1);
    assert.match(prefixOf(would[0]), /^weir:WI:/);
    assert.deepEqual(c.auditCatalog.lookup(prefixOf(would[0])), {
      verdict: 'would-deny',
      direction: 'ingress',
      policy: null,
      reason: 'default-deny',
      isolatedBy: [{ namespace: 'shop', name: 'allow-client' }],
    });
    // The policy's own chain is consulted first, so what it allows returns before the log.
    const jump = rules.findIndex((r) => r.action.kind === 'jump' && r.action.chain === names.policyIngress('shop/allow-client'));
    assert.ok(jump >= 0 && jump < rules.indexOf(would[0]));
    const report = c.policyReports().find((p) => p.key === 'shop/allow-client')!;
    assert.deepEqual([report.enforcement, report.localPods], ['audit', 1]);
  });

  test('beside an enforced policy they change nothing: the enforced one decides and no would-deny is logged', () => {
    const enforced = policy('shop', 'enforced', { podSelector: { matchLabels: { app: 'server' } }, ingress: [{}] });
    const c = calcOf([{ name: 'shop', labels: {} }], [allowClient({ 'weir.dev/enforcement': 'audit' }), enforced]);
    const rules = serverIn(c)!;
    assert.equal(nflogs(rules).length, 0);
    // The enforced policy allows everything: one merged rule with no match; nothing jumps to
    // the audit-only policy.
    const jumps = rules.filter((r) => r.action.kind === 'jump' && r.action.chain !== names.workloadCommon);
    assert.deepEqual(jumps, []);
    assert.deepEqual(
      rules.filter((r) => r.action.kind === 'setMark' && r.action.value !== 0).map((r) => r.matches),
      [[]],
    );
    assert.equal(rules.at(-1)!.action.kind, 'drop');
  });

  test('removing the annotation enforces the policy', () => {
    const c = calcOf([{ name: 'shop', labels: {} }], [allowClient({ 'weir.dev/enforcement': 'audit' })]);
    c.applyEvents([{ kind: 'NetworkPolicy', op: 'upsert', object: allowClient() }]);
    assert.equal(serverIn(c)!.at(-1)!.action.kind, 'drop');
    assert.equal(nflogs(serverIn(c)).length, 0);
  });
});
