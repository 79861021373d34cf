// ClusterNetworkPolicy (network-policy-api v0.3.0, v1beta1) validated and compiled: the
// examples of the API's own conformance manifests compile exactly; every check of the standard
// CRD (its schema, maxItems and CEL rules) and every field Weir refuses is an error at its path,
// and an invalid policy denies in each direction it names, at its tier and priority.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CNP_LIMITS } from '../../../src/model/cnp-fields.ts';
import { compareClusterNetworkPolicies, compileClusterNetworkPolicy, FAIL_CLOSED_CNP_RULE } from '../../../src/model/cluster-network-policy.ts';
import { compilePolicy } from '../../../src/model/policy.ts';
import { parseSelector } from '../../../src/model/selector.ts';
import type { CnpRule, CompiledClusterNetworkPolicy, Labels, PodsPeer, PolicyError, Selector } from '../../../src/model/types.ts';

function compile(spec: unknown, extra: { errors?: PolicyError[]; annotations?: Labels; name?: string } = {}): CompiledClusterNetworkPolicy {
  return compileClusterNetworkPolicy({ name: extra.name ?? 'cnp', uid: 'uid-1', generation: 4, spec, errors: extra.errors, annotations: extra.annotations });
}

function sel(raw: unknown): Selector {
  const r = parseSelector(raw, 'test');
  if ('errors' in r) assert.fail(JSON.stringify(r.errors));
  return r.selector;
}

function pods(ns: unknown, p: unknown = {}): PodsPeer {
  const n = sel(ns);
  const s = sel(p);
  return { kind: 'pods', key: `pods|nssel=${n.key}|${s.key}`, namespace: null, namespaceSelector: n, podSelector: s };
}
const ALL_PODS = pods({});

/** A valid spec's head, for cases about its rules. */
const HEAD = { tier: 'Admin', priority: 10, subject: { namespaces: {} } };
const ingress = (...rules: unknown[]) => ({ ...HEAD, ingress: rules });
const egress = (...rules: unknown[]) => ({ ...HEAD, egress: rules });
const deny = (from: unknown[], more: object = {}) => ({ action: 'Deny', from, ...more });
const denyTo = (to: unknown[], more: object = {}) => ({ action: 'Deny', to, ...more });
const ANY_NS = { namespaces: {} };

describe('compileClusterNetworkPolicy compiles valid policies exactly', () => {
  it("the conformance suite's port-range-rules (Admin, a namespaces subject, tcp, udp and sctp ranges, matchExpressions)", () => {
    const house = (h: string) => ({ matchLabels: { 'kubernetes.io/metadata.name': `network-policy-conformance-${h}` } });
    const exists = { matchExpressions: [{ key: 'conformance-house', operator: 'Exists' }] };
    const range = (start: number, end: number) => ({ destinationPort: { range: { start, end } } });
    const p = compile({
      tier: 'Admin',
      priority: 9,
      subject: { namespaces: house('gryffindor') },
      egress: [
        { name: 'allow-to-ravenclaw-tcp-port-range', action: 'Accept', to: [{ namespaces: house('ravenclaw') }], protocols: [{ tcp: range(80, 8080) }] },
        { name: 'allow-to-hufflepuff-udp-port-range', action: 'Accept', to: [{ namespaces: house('hufflepuff') }], protocols: [{ udp: range(53, 5353) }] },
        { name: 'allow-to-slytherin-sctp-port-range', action: 'Accept', to: [{ namespaces: house('slytherin') }], protocols: [{ sctp: range(9003, 9005) }] },
        { name: 'deny-all-egress', action: 'Deny', to: [{ namespaces: exists }] },
      ],
      ingress: [{ name: 'deny-all-ingress', action: 'Deny', from: [{ namespaces: exists }] }],
    });
    const expected: CompiledClusterNetworkPolicy = {
      key: 'cnp',
      name: 'cnp',
      uid: 'uid-1',
      generation: 4,
      audit: null,
      tier: 'Admin',
      priority: 9,
      subject: pods(house('gryffindor')),
      ingress: [{ name: 'deny-all-ingress', index: 0, action: 'Deny', peers: [pods(exists)], ports: null }],
      egress: [
        { name: 'allow-to-ravenclaw-tcp-port-range', index: 0, action: 'Accept', peers: [pods(house('ravenclaw'))], ports: [{ protocol: 'TCP', port: 80, endPort: 8080 }] },
        { name: 'allow-to-hufflepuff-udp-port-range', index: 1, action: 'Accept', peers: [pods(house('hufflepuff'))], ports: [{ protocol: 'UDP', port: 53, endPort: 5353 }] },
        { name: 'allow-to-slytherin-sctp-port-range', index: 2, action: 'Accept', peers: [pods(house('slytherin'))], ports: [{ protocol: 'SCTP', port: 9003, endPort: 9005 }] },
        { name: 'deny-all-egress', index: 3, action: 'Deny', peers: [pods(exists)], ports: null },
      ],
      errors: [],
    };
    assert.deepEqual(p, expected);
  });

  it("the conformance suite's inline-cidr-as-peers-example (a pods subject, a pods peer, networks 0.0.0.0/0 and ::/0)", () => {
    const house = (h: string) => ({ matchLabels: { 'conformance-house': h } });
    const p = compile({
      tier: 'Admin',
      priority: 85,
      subject: { pods: { namespaceSelector: house('gryffindor'), podSelector: house('gryffindor') } },
      egress: [
        { name: 'allow-egress-to-slytherin', action: 'Accept', to: [{ pods: { namespaceSelector: house('slytherin'), podSelector: house('slytherin') } }] },
        { name: 'deny-egress-to-internet', action: 'Deny', to: [{ networks: ['0.0.0.0/0', '::/0'] }] },
      ],
    });
    assert.deepEqual(p.errors, []);
    assert.deepEqual(p.subject, pods(house('gryffindor'), house('gryffindor')));
    assert.deepEqual(p.ingress, []);
    assert.deepEqual(p.egress, [
      { name: 'allow-egress-to-slytherin', index: 0, action: 'Accept', peers: [pods(house('slytherin'), house('slytherin'))], ports: null },
      {
        name: 'deny-egress-to-internet',
        index: 1,
        action: 'Deny',
        peers: [
          { kind: 'ipBlock', family: 4, cidr: '0.0.0.0/0', except: null },
          { kind: 'ipBlock', family: 6, cidr: '::/0', except: null },
        ],
        ports: null,
      },
    ]);
  });

  it('Baseline and Pass; a pods subject or peer without namespaceSelector is every namespace; rule names are optional', () => {
    const p = compile({
      tier: 'Baseline',
      priority: 0,
      subject: { pods: { podSelector: { matchLabels: { app: 'db' } } } },
      ingress: [
        { action: 'Pass', from: [{ pods: { podSelector: {} } }, { namespaces: { matchLabels: { team: 'a' } } }] },
        { name: '', action: 'Accept', from: [ANY_NS] },
      ],
      egress: [],
    });
    assert.deepEqual(p.errors, []);
    assert.equal(p.tier, 'Baseline');
    assert.equal(p.priority, 0);
    assert.deepEqual(p.subject, pods({}, { matchLabels: { app: 'db' } }));
    assert.deepEqual(p.ingress, [
      { name: '', index: 0, action: 'Pass', peers: [ALL_PODS, pods({ matchLabels: { team: 'a' } })], ports: null },
      { name: '', index: 1, action: 'Accept', peers: [ALL_PODS], ports: null },
    ]);
    assert.deepEqual(p.egress, []);
  });

  it('protocols: numbers, ranges and a named port, which stands for that name in every protocol', () => {
    const p = compile(
      ingress(
        deny([ANY_NS], {
          protocols: [
            { tcp: { destinationPort: { number: 80 } } },
            { udp: { destinationPort: { number: 53 } } },
            { sctp: { destinationPort: { range: { start: 1, end: 65535 } } } },
            { destinationNamedPort: 'http' },
          ],
        }),
      ),
    );
    assert.deepEqual(p.errors, []);
    assert.deepEqual(p.ingress[0].ports, [
      { protocol: 'TCP', port: 80 },
      { protocol: 'UDP', port: 53 },
      { protocol: 'SCTP', port: 1, endPort: 65535 },
      { protocol: 'TCP', name: 'http' },
      { protocol: 'UDP', name: 'http' },
      { protocol: 'SCTP', name: 'http' },
    ]);
  });

  it('networks keep each CIDR as an ipBlock without except, in order, overlapping ones too', () => {
    const p = compile(egress(denyTo([{ networks: ['10.0.0.0/8', '10.1.0.0/16', 'fd00::/8'] }, { networks: ['192.168.1.7/32'] }])));
    assert.deepEqual(p.errors, []);
    assert.deepEqual(p.egress[0].peers, [
      { kind: 'ipBlock', family: 4, cidr: '10.0.0.0/8', except: null },
      { kind: 'ipBlock', family: 4, cidr: '10.1.0.0/16', except: null },
      { kind: 'ipBlock', family: 6, cidr: 'fd00::/8', except: null },
      { kind: 'ipBlock', family: 4, cidr: '192.168.1.7/32', except: null },
    ]);
  });

  it(`the CRD's bounds are allowed: ${CNP_LIMITS.rules} rules of ${CNP_LIMITS.peers} peers, ${CNP_LIMITS.networks} networks, ${CNP_LIMITS.protocols} protocols, a ${CNP_LIMITS.ruleName}-character name, priority ${CNP_LIMITS.priority}`, () => {
    const rule = {
      name: 'n'.repeat(CNP_LIMITS.ruleName),
      action: 'Deny',
      to: Array.from({ length: CNP_LIMITS.peers }, (_, i) => (i === 0 ? { networks: Array.from({ length: CNP_LIMITS.networks }, (_, j) => `10.0.${j}.0/24`) } : ANY_NS)),
      protocols: Array.from({ length: CNP_LIMITS.protocols }, (_, i) => ({ tcp: { destinationPort: { number: i + 1 } } })),
    };
    const p = compile({ ...HEAD, priority: CNP_LIMITS.priority, egress: Array.from({ length: CNP_LIMITS.rules }, () => rule) });
    assert.deepEqual(p.errors, []);
    assert.equal(p.egress.length, CNP_LIMITS.rules);
    assert.equal(p.egress[24].peers?.length, CNP_LIMITS.networks + CNP_LIMITS.peers - 1);
    assert.equal(p.egress[24].ports?.length, CNP_LIMITS.protocols);
  });

  it("a peer's key is the key of the NetworkPolicy peer of the same meaning, so both share one set", () => {
    const nsSel = { matchLabels: { team: 'a' } };
    const podSel = { matchExpressions: [{ key: 'app', operator: 'In', values: ['web', 'api'] }] };
    const cnp = compile(ingress(deny([{ pods: { namespaceSelector: nsSel, podSelector: podSel } }, { namespaces: nsSel }])));
    const np = compilePolicy({
      namespace: 'x',
      name: 'np',
      uid: 'u',
      generation: 1,
      spec: { podSelector: {}, ingress: [{ from: [{ namespaceSelector: nsSel, podSelector: podSel }, { namespaceSelector: nsSel }] }] },
    });
    assert.deepEqual(
      cnp.ingress[0].peers?.map((p) => (p.kind === 'pods' ? p.key : '')),
      np.ingress?.[0].peers?.map((p) => (p.kind === 'pods' ? p.key : '')),
    );
  });

  it('weir.dev/audit sets the level of its rules; none leaves it to the agent (null)', () => {
    assert.equal(compile(HEAD, { annotations: { 'weir.dev/audit': 'all' } }).audit, 'all');
    assert.equal(compile(HEAD).audit, null);
  });

  it('copies identity: the key is the name (cluster-scoped), with uid and generation', () => {
    const p = compile(HEAD, { name: 'tenants' });
    assert.deepEqual([p.key, p.name, p.uid, p.generation], ['tenants', 'tenants', 'uid-1', 4]);
  });
});

describe('compareClusterNetworkPolicies: Admin before Baseline, lower priority first, equal priorities by name', () => {
  it('sorts a mixed list into the order of evaluation', () => {
    const p = (name: string, tier: string, priority: number) => compile({ tier, priority, subject: { namespaces: {} } }, { name });
    const list = [p('b', 'Baseline', 0), p('z', 'Admin', 5), p('a', 'Admin', 5), p('m', 'Admin', 1000), p('c', 'Admin', 0), p('a', 'Baseline', 3)];
    assert.deepEqual(
      list.sort(compareClusterNetworkPolicies).map((x) => `${x.tier}/${x.priority}/${x.name}`),
      ['Admin/0/c', 'Admin/5/a', 'Admin/5/z', 'Admin/1000/m', 'Baseline/0/b', 'Baseline/3/a'],
    );
  });
});

describe('compileClusterNetworkPolicy rejects what the CRD or Weir refuses, at its path, and fails closed', () => {
  type Case = {
    name: string;
    spec: unknown;
    errors: PolicyError[];
    /** The directions that hold the fail-closed rule (default: those the spec names). */
    deny?: { ingress: boolean; egress: boolean };
    tier?: string;
    priority?: number;
    subject?: PodsPeer;
  };
  const ONE_OF_PEER = 'namespaces, pods, networks';
  const cases: Case[] = [
    // The spec and its head.
    { name: 'the spec is not an object', spec: 'nope', errors: [{ path: 'spec', message: 'must be an object, got "nope"' }], deny: { ingress: true, egress: true } },
    { name: 'the spec is missing', spec: undefined, errors: [{ path: 'spec', message: 'must be an object, got undefined' }], deny: { ingress: true, egress: true } },
    {
      name: 'an unknown spec field (a NetworkPolicy habit)',
      spec: { ...HEAD, policyTypes: ['Ingress'], ingress: [deny([ANY_NS])] },
      errors: [{ path: 'spec.policyTypes', message: 'unknown field; expected tier, priority, subject, ingress or egress' }],
      subject: ALL_PODS,
    },
    {
      name: 'tier missing',
      spec: { priority: 5, subject: { namespaces: {} }, egress: [denyTo([ANY_NS])] },
      errors: [{ path: 'spec.tier', message: 'required; expected Admin or Baseline' }],
      tier: 'Admin',
      priority: 5,
    },
    {
      name: 'tier not one of Admin, Baseline (the Baseline an invalid one keeps)',
      spec: { ...HEAD, tier: 'Developer', ingress: [deny([ANY_NS])] },
      errors: [{ path: 'spec.tier', message: 'unsupported tier "Developer"; expected Admin or Baseline' }],
      tier: 'Admin',
    },
    {
      name: 'priority missing',
      spec: { tier: 'Baseline', subject: { namespaces: {} }, ingress: [deny([ANY_NS])] },
      errors: [{ path: 'spec.priority', message: 'required; a number from 0 to 1000' }],
      tier: 'Baseline',
      priority: 0,
    },
    ...[1001, -1, 1.5, '5'].map(
      (priority): Case => ({
        name: `priority ${JSON.stringify(priority)}`,
        spec: { ...HEAD, tier: 'Baseline', priority, ingress: [deny([ANY_NS])] },
        errors: [{ path: 'spec.priority', message: `must be an integer from 0 to 1000, got ${typeof priority === 'string' ? `"${priority}"` : priority}` }],
        tier: 'Baseline',
        priority: 0,
      }),
    ),
    // The subject.
    {
      name: 'subject missing: every pod',
      spec: { tier: 'Admin', priority: 1, egress: [denyTo([ANY_NS])] },
      errors: [{ path: 'spec.subject', message: 'required; set namespaces or pods' }],
      subject: ALL_PODS,
    },
    {
      name: 'subject with both namespaces and pods',
      spec: { ...HEAD, subject: { namespaces: {}, pods: { podSelector: {} } }, ingress: [deny([ANY_NS])] },
      errors: [{ path: 'spec.subject', message: 'must set exactly one of namespaces, pods, got namespaces and pods' }],
    },
    { name: 'subject with neither', spec: { ...HEAD, subject: {}, ingress: [deny([ANY_NS])] }, errors: [{ path: 'spec.subject', message: 'must set one of namespaces, pods' }] },
    {
      name: 'subject of a kind this CRD does not know',
      spec: { ...HEAD, subject: { nodes: {} }, ingress: [deny([ANY_NS])] },
      errors: [
        { path: 'spec.subject.nodes', message: 'unknown field; expected namespaces or pods' },
        { path: 'spec.subject', message: 'must set one of namespaces, pods' },
      ],
    },
    {
      name: 'subject pods without podSelector',
      spec: { ...HEAD, subject: { pods: { namespaceSelector: { matchLabels: { a: 'b' } } } }, ingress: [deny([ANY_NS])] },
      errors: [{ path: 'spec.subject.pods.podSelector', message: 'required; use {} to select every pod of the selected namespaces' }],
    },
    {
      name: 'subject with an unreadable selector, beside a readable one',
      spec: { ...HEAD, subject: { pods: { namespaceSelector: { matchlabels: { a: 'b' } }, podSelector: { matchLabels: { app: 'web' } } } }, egress: [denyTo([ANY_NS])] },
      errors: [{ path: 'spec.subject.pods.namespaceSelector.matchlabels', message: 'unknown field; expected matchLabels or matchExpressions' }],
    },
    // Rules.
    {
      name: 'ingress is not a list',
      spec: { ...HEAD, ingress: { action: 'Deny' } },
      errors: [{ path: 'spec.ingress', message: 'must be a list of rules, got an object' }],
      deny: { ingress: true, egress: false },
    },
    { name: 'a rule is not an object', spec: egress('deny all'), errors: [{ path: 'spec.egress[0]', message: 'must be an object with action, to and protocols, got "deny all"' }] },
    { name: 'action missing', spec: ingress({ from: [ANY_NS] }), errors: [{ path: 'spec.ingress[0].action', message: 'required; expected Accept, Deny or Pass' }] },
    {
      name: 'action Allow (a NetworkPolicy word)',
      spec: ingress({ action: 'Allow', from: [ANY_NS] }),
      errors: [{ path: 'spec.ingress[0].action', message: 'unsupported action "Allow"; expected Accept, Deny or Pass' }],
    },
    { name: 'a rule name of 101 characters', spec: ingress(deny([ANY_NS], { name: 'n'.repeat(101) })), errors: [{ path: 'spec.ingress[0].name', message: 'must be at most 100 characters, got 101' }] },
    { name: 'a rule name that is no string', spec: ingress(deny([ANY_NS], { name: 7 })), errors: [{ path: 'spec.ingress[0].name', message: 'must be a string, got 7' }] },
    { name: 'an unknown rule field', spec: ingress(deny([ANY_NS], { ports: [80] })), errors: [{ path: 'spec.ingress[0].ports', message: 'unknown field; expected name, action, from or protocols' }] },
    { name: 'from missing', spec: ingress({ action: 'Deny' }), errors: [{ path: 'spec.ingress[0].from', message: 'required; a list of at least one peer' }] },
    { name: 'from empty (it never means "any" here)', spec: ingress(deny([])), errors: [{ path: 'spec.ingress[0].from', message: 'must hold at least one peer' }] },
    {
      name: 'to in an ingress rule',
      spec: ingress({ action: 'Deny', to: [ANY_NS] }),
      errors: [
        { path: 'spec.ingress[0].to', message: 'unknown field; expected name, action, from or protocols' },
        { path: 'spec.ingress[0].from', message: 'required; a list of at least one peer' },
      ],
    },
    {
      name: `more than ${CNP_LIMITS.rules} rules`,
      spec: ingress(...Array.from({ length: 26 }, () => deny([ANY_NS]))),
      errors: [{ path: 'spec.ingress[25]', message: 'more than 25 rules; the API allows at most 25' }],
    },
    {
      name: `more than ${CNP_LIMITS.peers} peers`,
      spec: egress(denyTo(Array.from({ length: 26 }, () => ANY_NS))),
      errors: [{ path: 'spec.egress[0].to[25]', message: 'more than 25 peers; the API allows at most 25' }],
    },
    // Peers.
    {
      name: 'a peer with two kinds',
      spec: egress(denyTo([{ namespaces: {}, networks: ['10.0.0.0/8'] }])),
      errors: [{ path: 'spec.egress[0].to[0]', message: `must set exactly one of ${ONE_OF_PEER}, got namespaces and networks` }],
    },
    { name: 'a peer with none', spec: egress(denyTo([{}])), errors: [{ path: 'spec.egress[0].to[0]', message: `must set one of ${ONE_OF_PEER}` }] },
    { name: 'a peer that is no object', spec: ingress(deny([null])), errors: [{ path: 'spec.ingress[0].from[0]', message: 'must be an object with one of namespaces, pods, got null' }] },
    {
      name: 'networks in an ingress rule (egress only)',
      spec: ingress(deny([{ networks: ['10.0.0.0/8'] }])),
      errors: [
        { path: 'spec.ingress[0].from[0].networks', message: 'unknown field; expected namespaces or pods' },
        { path: 'spec.ingress[0].from[0]', message: 'must set one of namespaces, pods' },
      ],
    },
    {
      name: 'nodes peers (experimental): not supported',
      spec: egress(denyTo([{ nodes: { matchLabels: { role: 'control-plane' } } }])),
      errors: [{ path: 'spec.egress[0].to[0].nodes', message: "not supported by Weir: nodes peers are in network-policy-api's experimental channel, and Weir enforces the standard one" }],
    },
    {
      name: 'domainNames peers (experimental): not supported',
      spec: egress({ action: 'Accept', to: [{ domainNames: ['*.kubernetes.io'] }] }),
      errors: [{ path: 'spec.egress[0].to[0].domainNames', message: "not supported by Weir: domainNames peers are in network-policy-api's experimental channel, and Weir enforces the standard one" }],
    },
    {
      name: 'a peer selector with an unknown operator',
      spec: ingress(deny([{ namespaces: { matchExpressions: [{ key: 'a', operator: 'in', values: ['x'] }] } }])),
      errors: [{ path: 'spec.ingress[0].from[0].namespaces.matchExpressions[0].operator', message: 'unsupported operator "in"; expected In, NotIn, Exists or DoesNotExist' }],
    },
    // Networks.
    { name: 'networks empty', spec: egress(denyTo([{ networks: [] }])), errors: [{ path: 'spec.egress[0].to[0].networks', message: 'must hold at least one CIDR' }] },
    { name: 'networks not a list', spec: egress(denyTo([{ networks: '10.0.0.0/8' }])), errors: [{ path: 'spec.egress[0].to[0].networks', message: 'must be a list of CIDRs, got "10.0.0.0/8"' }] },
    {
      name: 'a bare address',
      spec: egress(denyTo([{ networks: ['10.0.0.1'] }])),
      errors: [{ path: 'spec.egress[0].to[0].networks[0]', message: '"10.0.0.1" is not a CIDR: the prefix length ("/<bits>") is missing' }],
    },
    {
      name: 'host bits set (the CRD: cidr(self) == cidr(self).masked())',
      spec: egress(denyTo([{ networks: ['10.0.0.0/8', '10.1.2.3/16'] }])),
      errors: [{ path: 'spec.egress[0].to[0].networks[1]', message: '"10.1.2.3/16" has host bits set; write 10.1.0.0/16' }],
    },
    {
      name: 'IPv6 host bits set',
      spec: egress(denyTo([{ networks: ['fd00::1/64'] }])),
      errors: [{ path: 'spec.egress[0].to[0].networks[0]', message: '"fd00::1/64" has host bits set; write fd00::/64' }],
    },
    {
      name: 'a CIDR written twice (a set)',
      spec: egress(denyTo([{ networks: ['10.0.0.0/8', '10.0.0.0/8'] }])),
      errors: [{ path: 'spec.egress[0].to[0].networks[1]', message: 'duplicate CIDR "10.0.0.0/8"' }],
    },
    { name: 'a CIDR that is no string', spec: egress(denyTo([{ networks: [10] }])), errors: [{ path: 'spec.egress[0].to[0].networks[0]', message: 'must be a CIDR string, got 10' }] },
    {
      name: 'a CIDR of 44 characters',
      spec: egress(denyTo([{ networks: [`${'0'.repeat(40)}::/8`] }])),
      errors: [{ path: 'spec.egress[0].to[0].networks[0]', message: 'must be at most 43 characters, got 44' }],
    },
    {
      name: `more than ${CNP_LIMITS.networks} networks`,
      spec: egress(denyTo([{ networks: Array.from({ length: 26 }, (_, i) => `10.${i}.0.0/16`) }])),
      errors: [{ path: 'spec.egress[0].to[0].networks[25]', message: 'more than 25 CIDRs; the API allows at most 25' }],
    },
    // Protocols.
    {
      name: 'protocols empty',
      spec: ingress(deny([ANY_NS], { protocols: [] })),
      errors: [{ path: 'spec.ingress[0].protocols', message: 'must hold at least one entry; leave it out to match every protocol and port' }],
    },
    {
      name: 'a protocols entry with two fields',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: { destinationPort: { number: 80 } }, udp: { destinationPort: { number: 80 } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0]', message: 'must set exactly one of tcp, udp, sctp, destinationNamedPort, got tcp and udp' }],
    },
    {
      name: 'icmp (no such protocol field)',
      spec: ingress(deny([ANY_NS], { protocols: [{ icmp: {} }] })),
      errors: [
        { path: 'spec.ingress[0].protocols[0].icmp', message: 'unknown field; expected tcp, udp, sctp or destinationNamedPort' },
        { path: 'spec.ingress[0].protocols[0]', message: 'must set one of tcp, udp, sctp, destinationNamedPort' },
      ],
    },
    {
      name: 'tcp without destinationPort',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: {} }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].tcp.destinationPort', message: 'required; to match every TCP port, leave protocols out or list the range 1 to 65535' }],
    },
    {
      name: 'port 0',
      spec: ingress(deny([ANY_NS], { protocols: [{ udp: { destinationPort: { number: 0 } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].udp.destinationPort.number', message: 'must be a port number from 1 to 65535, got 0' }],
    },
    {
      name: 'port 65536',
      spec: ingress(deny([ANY_NS], { protocols: [{ sctp: { destinationPort: { number: 65536 } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].sctp.destinationPort.number', message: 'must be a port number from 1 to 65535, got 65536' }],
    },
    {
      name: 'a port given as a name',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: { destinationPort: { number: 'http' } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].tcp.destinationPort.number', message: 'must be a port number from 1 to 65535, got "http"' }],
    },
    {
      name: 'number and range together',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: { destinationPort: { number: 80, range: { start: 1, end: 2 } } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].tcp.destinationPort', message: 'must set exactly one of number, range, got number and range' }],
    },
    {
      name: 'a range of one port (the CRD: start < end)',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: { destinationPort: { range: { start: 80, end: 80 } } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].tcp.destinationPort.range', message: 'start (80) must be less than end (80)' }],
    },
    {
      name: 'a range backwards',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: { destinationPort: { range: { start: 90, end: 80 } } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].tcp.destinationPort.range', message: 'start (90) must be less than end (80)' }],
    },
    {
      name: 'a range without end',
      spec: ingress(deny([ANY_NS], { protocols: [{ tcp: { destinationPort: { range: { start: 90 } } } }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].tcp.destinationPort.range.end', message: 'required' }],
    },
    {
      name: 'an empty named port',
      spec: ingress(deny([ANY_NS], { protocols: [{ destinationNamedPort: '' }] })),
      errors: [{ path: 'spec.ingress[0].protocols[0].destinationNamedPort', message: 'must not be empty' }],
    },
    {
      name: 'a named port toward networks (the CRD: no named ports for networks)',
      spec: egress(denyTo([ANY_NS, { networks: ['10.0.0.0/8'] }], { protocols: [{ tcp: { destinationPort: { number: 80 } } }, { destinationNamedPort: 'http' }] })),
      errors: [{ path: 'spec.egress[0].protocols[1].destinationNamedPort', message: 'cannot be used in a rule with a networks peer (spec.egress[0].to[1]): a network has no named ports' }],
    },
    {
      name: `more than ${CNP_LIMITS.protocols} protocols`,
      spec: ingress(deny([ANY_NS], { protocols: Array.from({ length: 26 }, (_, i) => ({ tcp: { destinationPort: { number: i + 1 } } })) })),
      errors: [{ path: 'spec.ingress[0].protocols[25]', message: 'more than 25 protocols; the API allows at most 25' }],
    },
    // Several at once: every one is listed, the policy still reads what it can.
    {
      name: 'errors in both directions and the subject, all listed',
      spec: { tier: 'Baseline', priority: 7, subject: { pods: {} }, ingress: [deny([{ pods: {} }])], egress: [denyTo([{ nodes: {} }])] },
      errors: [
        { path: 'spec.subject.pods.podSelector', message: 'required; use {} to select every pod of the selected namespaces' },
        { path: 'spec.ingress[0].from[0].pods.podSelector', message: 'required; use {} to select every pod of the selected namespaces' },
        { path: 'spec.egress[0].to[0].nodes', message: "not supported by Weir: nodes peers are in network-policy-api's experimental channel, and Weir enforces the standard one" },
      ],
      tier: 'Baseline',
      priority: 7,
      subject: ALL_PODS,
    },
    {
      name: 'an invalid policy without rules names no direction: it is reported and changes no traffic',
      spec: { tier: 'Admin', priority: 'high', subject: { namespaces: {} }, ingress: [], egress: null },
      errors: [{ path: 'spec.priority', message: 'must be an integer from 0 to 1000, got "high"' }],
      deny: { ingress: false, egress: false },
    },
  ];
  const named = (rules: unknown) => rules !== undefined && rules !== null && !(Array.isArray(rules) && rules.length === 0);
  for (const c of cases) {
    it(c.name, () => {
      const p = compile(c.spec);
      assert.deepEqual(p.errors, c.errors);
      const spec = (typeof c.spec === 'object' && c.spec !== null ? c.spec : {}) as Record<string, unknown>;
      const d = c.deny ?? { ingress: named(spec.ingress), egress: named(spec.egress) };
      const failClosed = (on: boolean): CnpRule[] => (on ? [FAIL_CLOSED_CNP_RULE] : []);
      assert.deepEqual(p.ingress, failClosed(d.ingress), 'ingress');
      assert.deepEqual(p.egress, failClosed(d.egress), 'egress');
      assert.equal(p.tier, c.tier ?? (typeof spec.tier === 'string' ? spec.tier : 'Admin'));
      assert.equal(p.priority, c.priority ?? (typeof spec.priority === 'number' ? spec.priority : 0));
      if (c.subject !== undefined) assert.deepEqual(p.subject, c.subject);
      else if (spec.subject === HEAD.subject) assert.deepEqual(p.subject, ALL_PODS);
    });
  }

  it('a readable subject is kept when something else is wrong: it is what the policy fails closed for', () => {
    const p = compile({ tier: 'Admin', priority: 3, subject: { namespaces: { matchLabels: { tenant: 'a' } } }, ingress: [deny([{ nodes: {} }])] });
    assert.notDeepEqual(p.errors, []);
    assert.deepEqual(p.subject, pods({ matchLabels: { tenant: 'a' } }));
  });

  it('the fail-closed rule denies every address and port, and no rule of a spec has its index', () => {
    assert.deepEqual(FAIL_CLOSED_CNP_RULE, { name: '', index: -1, action: 'Deny', peers: null, ports: null });
    assert.ok(Object.isFrozen(FAIL_CLOSED_CNP_RULE));
  });

  it('lists at most 100 errors, then says how many more', () => {
    const p = compile(egress(...Array.from({ length: 25 }, () => denyTo(Array.from({ length: 6 }, () => ({ nodes: {} }))))));
    assert.equal(p.errors.length, 101);
    assert.deepEqual(p.errors[100], { path: 'spec', message: '50 more errors not listed (at most 100 are)' });
  });
});

describe("compileClusterNetworkPolicy reads the source's errors and Weir's annotations", () => {
  const sound = ingress(deny([ANY_NS]));

  it('errors a source found outside the spec come first and make a sound policy invalid', () => {
    const found: PolicyError = { path: 'apiVersion', message: '"policy.networking.k8s.io/v2" is not policy.networking.k8s.io/v1beta1' };
    const p = compile({ ...sound, tier: 'Bottom' }, { errors: [found] });
    assert.deepEqual(p.errors, [found, { path: 'spec.tier', message: 'unsupported tier "Bottom"; expected Admin or Baseline' }]);
    assert.deepEqual(p.ingress, [FAIL_CLOSED_CNP_RULE]);
    assert.deepEqual(compile(sound, { errors: [] }).errors, []);
  });

  it('weir.dev/enforcement is refused: only NetworkPolicies can be audit-only, and a ClusterNetworkPolicy is never silently not enforced', () => {
    const p = compile(sound, { annotations: { 'weir.dev/enforcement': 'audit' } });
    assert.deepEqual(p.errors, [
      { path: 'metadata.annotations["weir.dev/enforcement"]', message: 'audit-only mode is for NetworkPolicies; a ClusterNetworkPolicy is always enforced (remove the annotation)' },
    ]);
    assert.deepEqual(p.ingress, [FAIL_CLOSED_CNP_RULE]);
  });

  it('an unreadable weir.dev/audit is an error', () => {
    assert.deepEqual(compile(sound, { annotations: { 'weir.dev/audit': 'loud' } }).errors, [{ path: 'metadata.annotations["weir.dev/audit"]', message: 'must be one of off, deny, all, got "loud"' }]);
  });
});
