// weir explain's answers: which policies and rules stand behind each direction's verdict
// (merged rules, policy chains, tiers, audit), the chain, position and sets that decide it,
// and a clear refusal of input it cannot answer.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { makeNames } from '../../../src/calc/index.ts';
import type { DirectionResult, ExplainConfig, Explanation, ExplainRequest } from '../../../src/explain/explain.ts';
import { explain } from '../../../src/explain/explain.ts';
import { formatExplanation } from '../../../src/explain/format.ts';
import { ExplainInputError } from '../../../src/explain/resolve.ts';
import type { ModelEvent, Pod } from '../../../src/model/types.ts';

const names = makeNames('cali');
const CFG: ExplainConfig = { names, families: [4, 6], marks: { accept: 0x10000, pass: 0x20000 }, podBridge: 'cni0', allowAction: 'ACCEPT', sourceBinding: true };
const AUDIT_ON: ExplainConfig = { ...CFG, audit: { group: 77, defaultLevel: 'off', perSecond: 100, burst: 200 } };

function pod(key: string, node: string, ips: string[], labels: Record<string, string> = {}, o: Partial<Pod> = {}): Pod {
  const [namespace, name] = key.split('/');
  return { uid: `uid-${key}`, namespace, name, labels, nodeName: node, hostNetwork: false, phase: 'Running', terminating: false, ips, ports: [], ...o };
}

/** Namespaces a {team: a} and b {team: b}, nodes a and b; a/p and a/q on node-a, b/r on node-b. */
function cluster(extra: ModelEvent[] = [], pods: Pod[] = []): ModelEvent[] {
  return [
    { kind: 'Namespace', op: 'upsert', object: { name: 'a', labels: { team: 'a' } } },
    { kind: 'Namespace', op: 'upsert', object: { name: 'b', labels: { team: 'b' } } },
    { kind: 'Node', op: 'upsert', object: { name: 'node-a', podCIDRs: ['10.244.1.0/24', 'fd00:1::/64'] } },
    { kind: 'Node', op: 'upsert', object: { name: 'node-b', podCIDRs: ['10.244.2.0/24'] } },
    ...[
      pod('a/p', 'node-a', ['10.244.1.10', 'fd00:1::10'], { app: 'web' }, { ports: [{ name: 'http', port: 8080, protocol: 'TCP' }] }),
      pod('a/q', 'node-a', ['10.244.1.11'], { app: 'x' }),
      pod('b/r', 'node-b', ['10.244.2.20'], { app: 'y' }),
      ...pods,
    ].map((object): ModelEvent => ({ kind: 'Pod', op: 'upsert', object })),
    ...extra,
  ];
}

const np = (ns: string, name: string, spec: unknown, annotations?: Record<string, string>): ModelEvent => ({
  kind: 'NetworkPolicy',
  op: 'upsert',
  object: { namespace: ns, name, uid: `np-${ns}-${name}`, generation: 1, spec, ...(annotations ? { annotations } : {}) },
});
const cnp = (name: string, spec: unknown): ModelEvent => ({ kind: 'ClusterNetworkPolicy', op: 'upsert', object: { name, uid: `cnp-${name}`, generation: 1, spec } });

const ask = (events: ModelEvent[], req: Partial<ExplainRequest> & Pick<ExplainRequest, 'source' | 'destination'>, cfg = CFG): Explanation =>
  explain(events, { protocol: 'TCP', port: 80, family: 4, ...req }, cfg);
const dirOf = (x: Explanation, dir: 'ingress' | 'egress'): DirectionResult => {
  const d = x.families[0].directions.find((r) => r.direction === dir);
  assert.ok(d, `no ${dir} in ${JSON.stringify(x.families[0])}`);
  assert.equal(d.disagreement, undefined);
  return d;
};

describe('explain: the policies behind a verdict', () => {
  test('a merged rule names only the policies whose peers hold the address, with the union set that held it', () => {
    const events = cluster([
      np('a', 'from-x', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'x' } } }], ports: [{ port: 80 }] }] }),
      np('a', 'from-y', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'y' } } }], ports: [{ port: 80 }] }] }),
    ]);
    const x = ask(events, { source: 'b/r', destination: 'a/p' });
    const d = dirOf(x, 'ingress');
    assert.equal(x.families[0].verdict, 'allowed');
    assert.deepEqual([d.verdict, d.reason, d.node, d.pod], ['allowed', 'network-policy', 'node-a', 'a/p']);
    assert.deepEqual(d.allowedBy, [{ namespace: 'a', name: 'from-y', rule: 0 }]);
    assert.equal(d.rule?.chain, names.toWorkload('uid-a/p'));
    assert.equal(d.rule?.merged, true);
    assert.equal(d.rule?.lookups.length, 1);
    assert.deepEqual([d.rule?.lookups[0].member, d.rule?.lookups[0].found], ['10.244.2.20', true]);
    assert.match(d.rule!.lookups[0].set, /^cali40s:/);
    assert.match(formatExplanation(x), /merged rule, policies whose peers match: a\/from-y ingress rule 0/);
    // From a/q only from-x's peers hold the address.
    assert.deepEqual(dirOf(ask(events, { source: 'a/q', destination: 'a/p' }), 'ingress').allowedBy, [{ namespace: 'a', name: 'from-x', rule: 0 }]);
  });

  test('a merged rule names the policies it stands for, not those whose own chains would allow it later', () => {
    const events = cluster([
      np('a', 'numeric', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }], ports: [{ port: 8080 }] }] }),
      np('a', 'named', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }], ports: [{ port: 'http' }] }] }),
    ]);
    const d = dirOf(ask(events, { source: 'b/r', destination: 'a/p', port: 8080 }), 'ingress');
    assert.deepEqual([d.rule?.chain, d.rule?.merged, d.allowedBy], [names.toWorkload('uid-a/p'), true, [{ namespace: 'a', name: 'numeric', rule: 0 }]]);
  });

  test("a named port stays in its policy's chain, which is named with the rule", () => {
    const events = cluster([np('a', 'http', { podSelector: {}, ingress: [{ ports: [{ port: 'http' }] }] })]);
    const d = dirOf(ask(events, { source: 'b/r', destination: 'a/p', port: 8080 }), 'ingress');
    assert.deepEqual([d.verdict, d.rule?.chain, d.rule?.merged, d.rule?.rule.comment], ['allowed', names.policyIngress('a/http'), false, 'a/http ingress rule 0']);
    assert.deepEqual(
      d.rule?.lookups.map((l) => [l.dir, l.member, l.found]),
      [['dst,dst', '10.244.1.10,tcp:8080', true]],
    );
    // a/q has no port named http: nothing allows it.
    const q = dirOf(ask(events, { source: 'b/r', destination: 'a/q', port: 8080 }), 'ingress');
    assert.deepEqual([q.verdict, q.reason], ['denied', 'default-deny']);
  });

  test('positions are the payload lines iptables numbers: a rule whose ports need two multiport matches is two lines', () => {
    const ports = Array.from({ length: 20 }, (_, i) => ({ port: 100 + 2 * i }));
    const events = cluster([np('a', 'many', { podSelector: {}, ingress: [{ ports }] })]);
    const at = (port: number) => dirOf(ask(events, { source: 'b/r', destination: 'a/p', port }), 'ingress');
    const low = at(100);
    const high = at(138);
    assert.deepEqual(low.rule?.rule, high.rule?.rule, 'one rule of calc');
    assert.equal(high.rule!.position, low.rule!.position + 1, 'the second line of it');
    // The rule after it (the accept bit returns) sits past both lines.
    assert.equal(low.path.at(-1)?.position, low.rule!.position + 2);
    assert.equal(high.path.at(-1)?.position, low.rule!.position + 2);
  });

  test('a default deny names every policy isolating the pod, invalid ones marked, and the drop rule', () => {
    const events = cluster([
      np('a', 'deny', { podSelector: {}, policyTypes: ['Egress'] }),
      np('a', 'broken', { podSelector: {}, policyTypes: ['Egress'], egress: [{ to: [{ ipBlock: { cidr: 'nonsense' } }] }] }),
    ]);
    const x = ask(events, { source: 'a/p', destination: 'b/r', protocol: 'UDP', port: 53 });
    const d = dirOf(x, 'egress');
    assert.deepEqual([d.verdict, d.reason], ['denied', 'default-deny']);
    assert.deepEqual(d.isolatedBy, [
      { namespace: 'a', name: 'broken', invalid: true },
      { namespace: 'a', name: 'deny', invalid: false },
    ]);
    assert.equal(d.rule?.chain, names.fromWorkload('uid-a/p'));
    assert.equal(d.rule?.rule.action.kind, 'drop');
    assert.equal(d.rule?.position, d.path.at(-1)?.position);
    assert.equal(x.families[0].verdict, 'denied');
    // Cross-node: node-b's ingress is still told, as it would be met.
    assert.deepEqual([dirOf(x, 'ingress').verdict, dirOf(x, 'ingress').reached], ['not isolated', true]);
    assert.match(formatExplanation(x), /egress at node-a, a\/p: denied \(no rule allows it; isolated for egress by a\/broken \(invalid\), a\/deny\)/);
  });

  test('a run of Admin Deny rules merges: the first rule in evaluation order decides, every matching rule of the run is named', () => {
    const events = cluster([
      cnp('later', { tier: 'Admin', priority: 20, subject: { namespaces: {} }, ingress: [{ name: 'no-b', action: 'Deny', from: [{ namespaces: { matchLabels: { team: 'b' } } }] }] }),
      cnp('first', { tier: 'Admin', priority: 10, subject: { namespaces: {} }, ingress: [{ name: 'no-pods', action: 'Deny', from: [{ namespaces: {} }] }] }),
    ]);
    const d = dirOf(ask(events, { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual([d.verdict, d.reason, d.rule?.merged, d.rule?.chain], ['denied', 'cluster-policy', true, names.tierChain('admin', 'ingress', 'uid-a/p')]);
    assert.deepEqual(d.clusterRule, {
      name: 'first',
      tier: 'Admin',
      rule: 0,
      ruleName: 'no-pods',
      action: 'Deny',
      alsoMatching: [
        { name: 'first', tier: 'Admin', rule: 0, ruleName: 'no-pods', action: 'Deny' },
        { name: 'later', tier: 'Admin', rule: 0, ruleName: 'no-b', action: 'Deny' },
      ],
    });
    // From a/q (team a) only the first rule's peers hold the address.
    assert.deepEqual(
      dirOf(ask(events, { source: 'a/q', destination: 'a/p' }), 'ingress').clusterRule?.alsoMatching.map((r) => r.name),
      ['first'],
    );
  });

  test('an Admin Accept ends the tier past every NetworkPolicy; an Admin Pass hands the packet on and is named', () => {
    const accept = cluster([
      np('a', 'deny', { podSelector: {}, policyTypes: ['Ingress'] }),
      cnp('let-b', { tier: 'Admin', priority: 1, subject: { namespaces: {} }, ingress: [{ action: 'Accept', from: [{ namespaces: { matchLabels: { team: 'b' } } }] }] }),
    ]);
    const a = dirOf(ask(accept, { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual(
      [a.verdict, a.reason, a.clusterRule?.name, a.clusterRule?.action, a.rule?.rule.action],
      ['allowed', 'cluster-policy', 'let-b', 'Accept', { kind: 'goto', chain: names.tierAccept }],
    );

    const pass = cluster([
      np('a', 'deny', { podSelector: {}, policyTypes: ['Ingress'] }),
      cnp('pass-b', { tier: 'Admin', priority: 1, subject: { namespaces: {} }, ingress: [{ action: 'Pass', from: [{ namespaces: { matchLabels: { team: 'b' } } }] }] }),
      cnp('deny-b', { tier: 'Admin', priority: 2, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
    ]);
    const p = dirOf(ask(pass, { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual([p.verdict, p.reason, p.passedBy?.name, p.passedBy?.action], ['denied', 'default-deny', 'pass-b', 'Pass']);
    assert.match(formatExplanation(ask(pass, { source: 'b/r', destination: 'a/p' })), /passed on by ClusterNetworkPolicy pass-b \(Admin\) rule 0 \(Pass\)/);
  });

  test('the Baseline tier decides only for a pod no NetworkPolicy isolates: Accept allows, Deny denies, Pass leaves it not isolated', () => {
    const base = (action: string) =>
      cluster([cnp('base', { tier: 'Baseline', priority: 1, subject: { namespaces: {} }, ingress: [{ action, from: [{ namespaces: { matchLabels: { team: 'b' } } }] }] })]);
    const accept = dirOf(ask(base('Accept'), { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual([accept.verdict, accept.reason, accept.clusterRule?.action], ['allowed', 'cluster-policy', 'Accept']);
    const deny = dirOf(ask(base('Deny'), { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual([deny.verdict, deny.reason, deny.rule?.chain], ['denied', 'cluster-policy', names.tierChain('baseline', 'ingress', 'uid-a/p')]);
    const pass = dirOf(ask(base('Pass'), { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual([pass.verdict, pass.reason, pass.clusterRule?.action], ['not isolated', 'not-isolated', 'Pass']);
    // A NetworkPolicy that isolates the pod takes over from the Baseline Deny.
    const isolated = dirOf(ask([...base('Deny'), np('a', 'from-b', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }] }] })], { source: 'b/r', destination: 'a/p' }), 'ingress');
    assert.deepEqual([isolated.verdict, isolated.allowedBy], ['allowed', [{ namespace: 'a', name: 'from-b', rule: 0 }]]);
  });

  test('an invalid ClusterNetworkPolicy denies everything in the directions it names, and says so', () => {
    const events = cluster([cnp('bad', { tier: 'Admin', priority: 1, subject: { namespaces: {} }, egress: [{ action: 'Teleport', to: [{ namespaces: {} }] }] })]);
    const x = ask(events, { source: 'a/p', destination: 'b/r' });
    const d = dirOf(x, 'egress');
    assert.deepEqual([d.verdict, d.clusterRule?.name, d.clusterRule?.rule], ['denied', 'bad', -1]);
    assert.match(formatExplanation(x), /ClusterNetworkPolicy bad \(Admin; invalid, so it denies everything\)/);
  });

  test('audit-only policies never decide: the pod is not isolated, and what they would drop is logged as would-deny', () => {
    const events = cluster([np('a', 'try', { podSelector: {}, ingress: [{ from: [{ podSelector: {} }] }] }, { 'weir.dev/enforcement': 'audit' })]);
    const d = dirOf(ask(events, { source: 'b/r', destination: 'a/p' }, AUDIT_ON), 'ingress');
    assert.deepEqual([d.verdict, d.reason, d.auditOnly], ['not isolated', 'not-isolated', { policies: ['a/try'], wouldAllowBy: [] }]);
    assert.equal(d.logged.length, 1);
    assert.deepEqual([d.logged[0].meaning?.verdict, d.logged[0].meaning?.reason], ['would-deny', 'default-deny']);
    const fromQ = dirOf(ask(events, { source: 'a/q', destination: 'a/p' }, AUDIT_ON), 'ingress');
    assert.deepEqual([fromQ.verdict, fromQ.auditOnly?.wouldAllowBy, fromQ.logged], ['not isolated', [{ namespace: 'a', name: 'try', rule: 0 }], []]);
  });

  test('an audited allow is logged under its policy and rule, read back through the audit catalog', () => {
    const events = cluster([np('a', 'loud', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }] }] }, { 'weir.dev/audit': 'all' })]);
    const d = dirOf(ask(events, { source: 'b/r', destination: 'a/p' }, AUDIT_ON), 'ingress');
    assert.deepEqual([d.verdict, d.rule?.chain, d.rule?.merged], ['allowed', names.policyIngress('a/loud'), false]);
    assert.equal(d.logged.length, 1);
    assert.deepEqual(d.logged[0].meaning, { verdict: 'allow', direction: 'ingress', policy: { namespace: 'a', name: 'loud', rule: 0 } });
    assert.match(d.logged[0].prefix, /^weir:AI:/);
  });

  test('with --allow-action RETURN and without source binding the same verdicts come from the same policies', () => {
    const events = cluster([np('a', 'from-b', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }] }] })]);
    for (const cfg of [
      { ...CFG, allowAction: 'RETURN' as const },
      { ...CFG, sourceBinding: false },
    ]) {
      assert.deepEqual(dirOf(ask(events, { source: 'b/r', destination: 'a/p' }, cfg), 'ingress').allowedBy, [{ namespace: 'a', name: 'from-b', rule: 0 }]);
      assert.equal(dirOf(ask(events, { source: 'a/q', destination: 'a/p' }, cfg), 'ingress').verdict, 'denied');
    }
  });

  test('same node: egress and ingress from one walk; when egress drops it, ingress is told as not reached', () => {
    const events = cluster([np('a', 'no-egress', { podSelector: { matchLabels: { app: 'x' } }, policyTypes: ['Egress'] })]);
    const x = ask(events, { source: 'a/q', destination: 'a/p' });
    assert.deepEqual(
      x.families[0].directions.map((d) => [d.direction, d.node, d.verdict, d.reached]),
      [
        ['egress', 'node-a', 'denied', true],
        ['ingress', 'node-a', 'not isolated', false],
      ],
    );
    assert.equal(x.families[0].directions[1].path[0].chain, names.toWorkloadDispatch);
  });

  test('an address of a pod CIDR that no pod holds is dropped on its node (fail closed); an outside one is policed at the pod only', () => {
    const unknown = ask(cluster(), { source: '10.244.1.99', destination: 'b/r' });
    assert.deepEqual(
      unknown.families[0].directions.map((d) => [d.direction, d.node, d.pod, d.verdict, d.reason]),
      [
        ['egress', 'node-a', null, 'denied', 'fail-closed'],
        ['ingress', 'node-b', 'b/r', 'not isolated', 'not-isolated'],
      ],
    );
    assert.equal(unknown.source.note, "no pod holds it; it is in node node-a's pod CIDR 10.244.1.0/24");
    const outside = ask(cluster(), { source: '192.0.2.1', destination: 'b/r' });
    assert.deepEqual(
      outside.families[0].directions.map((d) => d.direction),
      ['ingress'],
    );
  });

  test("a host-networked pod and a pod of its node talk past FORWARD: not policed; another node's pod polices it", () => {
    const host = pod('a/h', 'node-a', ['172.31.0.1'], {}, { hostNetwork: true });
    const events = cluster([np('b', 'deny', { podSelector: {}, policyTypes: ['Ingress'] })], [host]);
    const local = ask(events, { source: 'a/h', destination: 'a/p' });
    assert.deepEqual([local.families[0].verdict, local.families[0].directions], ['allowed', []]);
    assert.match(local.families[0].unpoliced ?? '', /never crosses FORWARD/);
    const remote = ask(events, { source: '172.31.0.1', destination: 'b/r' });
    assert.deepEqual(
      remote.families[0].directions.map((d) => [d.direction, d.verdict]),
      [['ingress', 'denied']],
    );
  });

  test("an address of a node's pod CIDR that only a host-networked pod claims is a pod that node does not know: dropped there both ways", () => {
    const host = pod('a/h', 'node-a', ['10.244.1.50'], {}, { hostNetwork: true });
    const events = cluster([], [host]);
    for (const [source, destination, dir] of [
      ['10.244.1.50', 'a/q', 'egress'],
      ['b/r', '10.244.1.50', 'ingress'],
      ['172.31.0.200', '10.244.1.50', 'ingress'],
    ] as const) {
      const x = ask(events, { source, destination });
      const d = x.families[0].directions.find((r) => r.direction === dir);
      assert.deepEqual([x.families[0].verdict, d?.node, d?.pod, d?.reason], ['denied', 'node-a', null, 'fail-closed'], `${source} -> ${destination}`);
    }
    const end = ask(events, { source: '10.244.1.50', destination: 'a/q' }).source;
    assert.deepEqual([end.kind, end.node], ['address', 'node-a']);
    assert.match(end.note ?? '', /host-networked pod a\/h claims it/);
  });

  test('every family both ends have, unless one is asked for', () => {
    const events = cluster([], [pod('b/s', 'node-b', ['10.244.2.30', 'fd00:2::30'])]);
    assert.deepEqual(
      explain(events, { source: 'a/p', destination: 'b/s', protocol: 'SCTP', port: 9 }, CFG).families.map((f) => [f.family, f.src, f.dst]),
      [
        [4, '10.244.1.10', '10.244.2.30'],
        [6, 'fd00:1::10', 'fd00:2::30'],
      ],
    );
    assert.deepEqual(
      explain(events, { source: 'a/p', destination: 'b/s', protocol: 'TCP', port: 9, family: 6 }, CFG).families.map((f) => f.family),
      [6],
    );
    const v4only = explain(events, { source: 'a/p', destination: 'b/s', protocol: 'TCP', port: 9 }, { ...CFG, families: [4] });
    assert.match(v4only.families[1].unpoliced ?? '', /IPv6 is not policed/);
  });
});

describe('explain: input it cannot answer', () => {
  const events = cluster(
    [],
    [
      pod('b/p', 'node-b', ['10.244.2.40']),
      pod('a/pending', 'node-a', [], {}, { phase: 'Pending' }),
      pod('a/done', 'node-a', ['10.244.1.60'], {}, { phase: 'Succeeded' }),
      pod('a/v6', 'node-a', ['fd00:1::70']),
    ],
  );
  const refused = (req: Partial<ExplainRequest>, message: RegExp) =>
    assert.throws(
      () => explain(events, { source: 'a/p', destination: 'b/r', protocol: 'TCP', port: 80, ...req }, CFG),
      (err: unknown) => err instanceof ExplainInputError && message.test(err.message),
    );

  test('an unknown pod, with what its namespace holds', () => {
    refused({ source: 'a/nope' }, /^source: there is no pod a\/nope; namespace a holds done, p, pending, q, v6$/);
    refused({ destination: 'zz/nope' }, /^destination: there is no pod zz\/nope; no pod is in namespace zz$/);
    refused({ destination: 'nobody' }, /no pod is named nobody in any namespace/);
  });

  test('an ambiguous name, with every pod it could be', () => {
    refused({ source: 'p' }, /^source: "p" is ambiguous: a\/p, b\/p \(name it NAMESPACE\/NAME\)$/);
  });

  test('an address that is no address, and two ends outside every known range', () => {
    refused({ source: '10.0.0.300' }, /"10.0.0.300" is not a valid IP address/);
    refused({ source: 'a/b/c' }, /neither NAMESPACE\/NAME nor an IP address/);
    refused({ source: '192.0.2.1', destination: '198.51.100.1' }, /neither end is a pod: 192.0.2.1 is outside every known range .* and 198.51.100.1 is outside every known range/);
  });

  test('a pod without an address, a finished pod, and ends with no family in common', () => {
    refused({ source: 'a/pending' }, /pod a\/pending has no IP address yet \(phase Pending\)/);
    refused({ source: 'a/done' }, /pod a\/done has finished \(phase Succeeded\)/);
    refused({ source: 'a/v6' }, /a\/v6 has only IPv6 and b\/r only IPv4/);
    refused({ family: 6 }, /IPv6 was asked for, but b\/r has no IPv6 address/);
    refused({ port: 0 }, /port 0 is not a port number/);
  });
});
