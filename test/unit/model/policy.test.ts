import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { LIMITS, PolicyParts, compilePolicy } from '../../../src/model/policy.ts';
import { parseSelector } from '../../../src/model/selector.ts';
import type { CompiledPolicy, PodsPeer, PolicyError, PolicyRule, PrefixSet, Selector } from '../../../src/model/types.ts';

const NS = 'prod';

function compile(spec: unknown): CompiledPolicy {
  return compilePolicy({ namespace: NS, name: 'p', uid: 'uid-1', generation: 3, spec });
}

function sel(raw: unknown): Selector {
  const r = parseSelector(raw, 'test');
  if ('errors' in r) assert.fail(JSON.stringify(r.errors));
  return r.selector;
}

const ALL = sel({});
const teamA = sel({ matchLabels: { team: 'a' } });
const appB = sel({ matchLabels: { app: 'b' } });

function prefixes(family: 4 | 6, cidrs: string[]): PrefixSet {
  return { kind: 'prefixes', key: `net${family}|${cidrs.join(',')}`, family, cidrs };
}

function valid(podSelector: Selector, ingress: PolicyRule[] | null, egress: PolicyRule[] | null): CompiledPolicy {
  return { key: 'prod/p', namespace: NS, name: 'p', uid: 'uid-1', generation: 3, podSelector, ingress, egress, errors: [], audit: null, enforcement: 'enforce' };
}

describe('compilePolicy compiles valid policies exactly', () => {
  const cases: { name: string; spec: unknown; expected: CompiledPolicy }[] = [
    {
      name: 'separate peers are OR: namespaceSelector alone, podSelector alone',
      spec: {
        podSelector: { matchLabels: { app: 'db' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } } }, { podSelector: { matchLabels: { app: 'b' } } }] }],
      },
      expected: valid(
        sel({ matchLabels: { app: 'db' } }),
        [
          {
            peers: [
              { kind: 'pods', key: 'pods|nssel=team in (a)|', namespace: null, namespaceSelector: teamA, podSelector: ALL },
              { kind: 'pods', key: 'pods|ns=prod|app in (b)', namespace: 'prod', namespaceSelector: null, podSelector: appB },
            ],
            ports: null,
          },
        ],
        null,
      ),
    },
    {
      name: 'both selectors in one peer are AND',
      spec: {
        podSelector: {},
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } }, podSelector: { matchLabels: { app: 'b' } } }] }],
      },
      expected: valid(ALL, [{ peers: [{ kind: 'pods', key: 'pods|nssel=team in (a)|app in (b)', namespace: null, namespaceSelector: teamA, podSelector: appB }], ports: null }], null),
    },
    {
      name: 'empty selectors: all pods of the namespace, all pods of all namespaces',
      spec: { podSelector: {}, ingress: [{ from: [{ podSelector: {} }, { namespaceSelector: {} }] }] },
      expected: valid(
        ALL,
        [
          {
            peers: [
              { kind: 'pods', key: 'pods|ns=prod|', namespace: 'prod', namespaceSelector: null, podSelector: ALL },
              { kind: 'pods', key: 'pods|nssel=|', namespace: null, namespaceSelector: ALL, podSelector: ALL },
            ],
            ports: null,
          },
        ],
        null,
      ),
    },
    {
      name: 'ipBlock keeps its cidr and its excepts, canonical: host bits cleared, sorted',
      spec: {
        podSelector: {},
        policyTypes: ['Egress'],
        egress: [{ to: [{ ipBlock: { cidr: '10.0.0.1/16', except: ['10.0.128.0/17', '10.0.64.7/18', '10.0.0.0/24'] } }] }],
      },
      expected: valid(ALL, null, [
        {
          peers: [
            {
              kind: 'ipBlock',
              family: 4,
              cidr: '10.0.0.0/16',
              except: prefixes(4, ['10.0.0.0/24', '10.0.64.0/18', '10.0.128.0/17']),
            },
          ],
          ports: null,
        },
      ]),
    },
    {
      name: 'ipBlock excepts: duplicates and nested ones dropped, halves merged but never into the block itself',
      spec: {
        podSelector: {},
        ingress: [
          {
            from: [
              { ipBlock: { cidr: '10.0.0.0/24', except: ['10.0.0.5/32', '10.0.0.4/30', '10.0.0.5/32', '10.0.0.8/30', '10.0.0.12/30'] } },
              { ipBlock: { cidr: '10.0.0.0/24', except: ['10.0.0.128/25', '10.0.0.0/25'] } },
            ],
          },
        ],
      },
      expected: valid(
        ALL,
        [
          {
            peers: [
              { kind: 'ipBlock', family: 4, cidr: '10.0.0.0/24', except: prefixes(4, ['10.0.0.4/30', '10.0.0.8/29']) },
              { kind: 'ipBlock', family: 4, cidr: '10.0.0.0/24', except: prefixes(4, ['10.0.0.0/25', '10.0.0.128/25']) },
            ],
            ports: null,
          },
        ],
        null,
      ),
    },
    {
      name: 'IPv6 and IPv4 ipBlocks, 0.0.0.0/0 and ::/0',
      spec: {
        podSelector: {},
        egress: [
          {
            to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['128.0.0.0/1'] } }, { ipBlock: { cidr: '::/0' } }, { ipBlock: { cidr: 'FD00::1/8', except: ['fd80::/9'] } }],
          },
        ],
      },
      expected: valid(
        ALL,
        [],
        [
          {
            peers: [
              { kind: 'ipBlock', family: 4, cidr: '0.0.0.0/0', except: prefixes(4, ['128.0.0.0/1']) },
              { kind: 'ipBlock', family: 6, cidr: '::/0', except: null },
              { kind: 'ipBlock', family: 6, cidr: 'fd00::/8', except: prefixes(6, ['fd80::/9']) },
            ],
            ports: null,
          },
        ],
      ),
    },
    {
      name: 'ports: default TCP, protocols, named ports, ranges',
      spec: {
        podSelector: {},
        ingress: [
          {
            ports: [
              { port: 80 },
              { protocol: 'UDP', port: 53 },
              { protocol: 'SCTP' },
              {},
              { port: 'http' },
              { protocol: 'UDP', port: 'dns-udp' },
              { port: 8000, endPort: 8080 },
              { port: 9000, endPort: 9000 },
              { protocol: null, port: 1, endPort: 65535 },
            ],
          },
        ],
      },
      expected: valid(
        ALL,
        [
          {
            peers: null,
            ports: [
              { protocol: 'TCP', port: 80 },
              { protocol: 'UDP', port: 53 },
              { protocol: 'SCTP' },
              { protocol: 'TCP' },
              { protocol: 'TCP', name: 'http' },
              { protocol: 'UDP', name: 'dns-udp' },
              { protocol: 'TCP', port: 8000, endPort: 8080 },
              { protocol: 'TCP', port: 9000 },
              { protocol: 'TCP', port: 1, endPort: 65535 },
            ],
          },
        ],
        null,
      ),
    },
    {
      name: 'empty from and ports mean any peer and any port',
      spec: {
        podSelector: {},
        ingress: [
          { from: [], ports: [] },
          { from: null, ports: null },
        ],
      },
      expected: valid(
        ALL,
        [
          { peers: null, ports: null },
          { peers: null, ports: null },
        ],
        null,
      ),
    },
    {
      name: 'a rule with peers and ports keeps both',
      spec: {
        podSelector: { matchExpressions: [{ key: 'role', operator: 'In', values: ['api'] }] },
        ingress: [{ from: [{ podSelector: { matchLabels: { app: 'b' } } }], ports: [{ port: 443 }] }],
        egress: [{ to: [{ namespaceSelector: { matchLabels: { team: 'a' } } }], ports: [{ protocol: 'UDP', port: 53 }] }],
      },
      expected: valid(
        sel({ matchLabels: { role: 'api' } }),
        [{ peers: [{ kind: 'pods', key: 'pods|ns=prod|app in (b)', namespace: 'prod', namespaceSelector: null, podSelector: appB }], ports: [{ protocol: 'TCP', port: 443 }] }],
        [{ peers: [{ kind: 'pods', key: 'pods|nssel=team in (a)|', namespace: null, namespaceSelector: teamA, podSelector: ALL }], ports: [{ protocol: 'UDP', port: 53 }] }],
      ),
    },
    {
      name: 'undefined fields count as absent',
      spec: { podSelector: {}, ingress: [{ from: undefined, ports: [{ port: 80, endPort: undefined }] }], egress: undefined },
      expected: valid(ALL, [{ peers: null, ports: [{ protocol: 'TCP', port: 80 }] }], null),
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      assert.deepEqual(compile(c.spec), c.expected);
    });
  }
});

describe('policyTypes defaulting', () => {
  const allowAll: PolicyRule = { peers: null, ports: null };
  const cases: { name: string; spec: Record<string, unknown>; ingress: PolicyRule[] | null; egress: PolicyRule[] | null }[] = [
    { name: 'no types, no rules: deny all ingress, egress untouched', spec: {}, ingress: [], egress: null },
    { name: 'no types, egress: [] does not isolate egress', spec: { egress: [] }, ingress: [], egress: null },
    { name: 'no types, an egress rule isolates egress', spec: { egress: [{}] }, ingress: [], egress: [allowAll] },
    { name: 'no types, ingress: [{}] allows all ingress', spec: { ingress: [{}] }, ingress: [allowAll], egress: null },
    { name: 'no types, ingress: [] denies all ingress', spec: { ingress: [] }, ingress: [], egress: null },
    { name: '[Egress] without rules isolates egress and allows nothing', spec: { policyTypes: ['Egress'] }, ingress: null, egress: [] },
    { name: '[Egress] ignores ingress rules', spec: { policyTypes: ['Egress'], ingress: [{}] }, ingress: null, egress: [] },
    { name: '[Ingress] ignores egress rules', spec: { policyTypes: ['Ingress'], egress: [{}] }, ingress: [], egress: null },
    { name: '[Ingress, Egress] isolates both', spec: { policyTypes: ['Ingress', 'Egress'] }, ingress: [], egress: [] },
    { name: 'duplicates are tolerated', spec: { policyTypes: ['Egress', 'Egress'], egress: [{}] }, ingress: null, egress: [allowAll] },
    { name: 'an empty list is defaulted like a missing one', spec: { policyTypes: [], egress: [{}] }, ingress: [], egress: [allowAll] },
    { name: 'null is defaulted like missing', spec: { policyTypes: null }, ingress: [], egress: null },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const p = compile({ podSelector: {}, ...c.spec });
      assert.deepEqual(p.errors, []);
      assert.deepEqual(p.ingress, c.ingress);
      assert.deepEqual(p.egress, c.egress);
    });
  }
});

describe('compilePolicy rejects invalid policies with every error and keeps them closed', () => {
  type Case = {
    name: string;
    spec: unknown;
    errors: PolicyError[];
    /** Expected podSelector key, or null when unreadable. */
    podSelector: string | null;
    ingress: [] | null;
    egress: [] | null;
  };
  const OPS = 'expected In, NotIn, Exists or DoesNotExist';
  const cases: Case[] = [
    { name: 'spec is not an object', spec: 'nope', errors: [{ path: 'spec', message: 'must be an object, got "nope"' }], podSelector: null, ingress: [], egress: [] },
    { name: 'spec is missing', spec: undefined, errors: [{ path: 'spec', message: 'must be an object, got undefined' }], podSelector: null, ingress: [], egress: [] },
    {
      name: 'podSelector missing isolates every pod of the namespace',
      spec: { ingress: [{}] },
      errors: [{ path: 'spec.podSelector', message: 'required; use {} to select every pod of the namespace' }],
      podSelector: null,
      ingress: [],
      egress: null,
    },
    {
      name: 'podSelector invalid',
      spec: { podSelector: { matchExpressions: [{ key: 'a', operator: 'in', values: ['x'] }] }, policyTypes: ['Egress'] },
      errors: [{ path: 'spec.podSelector.matchExpressions[0].operator', message: `unsupported operator "in"; ${OPS}` }],
      podSelector: null,
      ingress: null,
      egress: [],
    },
    {
      name: 'unknown spec field',
      spec: { podSelector: {}, ingres: [{}] },
      errors: [{ path: 'spec.ingres', message: 'unknown field; expected podSelector, policyTypes, ingress or egress' }],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'policyTypes not a list: both directions isolated',
      spec: { podSelector: {}, policyTypes: 'Ingress' },
      errors: [{ path: 'spec.policyTypes', message: 'must be a list of Ingress and/or Egress, got "Ingress"' }],
      podSelector: '',
      ingress: [],
      egress: [],
    },
    {
      name: 'policyTypes with a wrong value: both directions isolated',
      spec: { podSelector: {}, policyTypes: ['Ingress', 'egress', 7] },
      errors: [
        { path: 'spec.policyTypes[1]', message: 'unsupported policy type "egress"; expected Ingress or Egress' },
        { path: 'spec.policyTypes[2]', message: 'unsupported policy type 7; expected Ingress or Egress' },
      ],
      podSelector: '',
      ingress: [],
      egress: [],
    },
    {
      name: 'malformed egress without policyTypes isolates egress',
      spec: { podSelector: {}, egress: { to: [] } },
      errors: [{ path: 'spec.egress', message: 'must be a list of rules, got an object' }],
      podSelector: '',
      ingress: [],
      egress: [],
    },
    {
      name: 'errors in a direction the policy does not isolate are still reported',
      spec: { podSelector: {}, policyTypes: ['Ingress'], ingress: [{}], egress: [{ to: [{}] }] },
      errors: [{ path: 'spec.egress[0].to[0]', message: 'must specify podSelector, namespaceSelector or ipBlock' }],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'a null rule is refused instead of allowing all',
      spec: { podSelector: {}, ingress: [null] },
      errors: [{ path: 'spec.ingress[0]', message: 'must be an object with from and ports, got null' }],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'from in an egress rule is an unknown field',
      spec: { podSelector: {}, egress: [{ from: [{ podSelector: {} }] }] },
      errors: [{ path: 'spec.egress[0].from', message: 'unknown field; expected to or ports' }],
      podSelector: '',
      ingress: [],
      egress: [],
    },
    {
      name: 'an empty peer',
      spec: { podSelector: {}, ingress: [{ from: [{ podSelector: {} }, {}, { podSelector: null }] }] },
      errors: [
        { path: 'spec.ingress[0].from[1]', message: 'must specify podSelector, namespaceSelector or ipBlock' },
        { path: 'spec.ingress[0].from[2]', message: 'must specify podSelector, namespaceSelector or ipBlock' },
      ],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'ipBlock with a selector in the same peer, and its own errors',
      spec: {
        podSelector: {},
        ingress: [{ from: [{ ipBlock: { cidr: '10.0.0.0' }, namespaceSelector: { matchLabels: { 'bad key': 'x' } } }] }],
      },
      errors: [
        { path: 'spec.ingress[0].from[0]', message: 'ipBlock cannot be combined with podSelector or namespaceSelector in one peer; use separate peers' },
        {
          path: 'spec.ingress[0].from[0].namespaceSelector.matchLabels["bad key"]',
          message: 'invalid label key "bad key": name part must be letters, digits, "-", "_" or ".", starting and ending with a letter or digit',
        },
        { path: 'spec.ingress[0].from[0].ipBlock.cidr', message: '"10.0.0.0" is not a CIDR: the prefix length ("/<bits>") is missing' },
      ],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'ipBlock excepts: invalid, other family, outside, equal, containing',
      spec: {
        podSelector: {},
        egress: [
          {
            to: [
              {
                ipBlock: {
                  cidr: '10.0.0.0/16',
                  except: ['10.0.1.0/24', 'fd00::/8', '10.1.0.0/24', '10.0.0.0/16', '10.0.0.0/8', '10.0.300.0/24', 5],
                },
              },
            ],
          },
        ],
      },
      errors: [
        { path: 'spec.egress[0].to[0].ipBlock.except[1]', message: 'IPv6 except "fd00::/8" in an IPv4 ipBlock' },
        { path: 'spec.egress[0].to[0].ipBlock.except[2]', message: '"10.1.0.0/24" must be strictly inside cidr "10.0.0.0/16"' },
        { path: 'spec.egress[0].to[0].ipBlock.except[3]', message: '"10.0.0.0/16" must be strictly inside cidr "10.0.0.0/16"' },
        { path: 'spec.egress[0].to[0].ipBlock.except[4]', message: '"10.0.0.0/8" must be strictly inside cidr "10.0.0.0/16"' },
        {
          path: 'spec.egress[0].to[0].ipBlock.except[5]',
          message: 'invalid CIDR "10.0.300.0/24": invalid IPv4 address "10.0.300.0": octet "300" is greater than 255',
        },
        { path: 'spec.egress[0].to[0].ipBlock.except[6]', message: 'must be a string, got 5' },
      ],
      podSelector: '',
      ingress: [],
      egress: [],
    },
    {
      name: 'ipBlock shape errors',
      spec: {
        podSelector: {},
        ingress: [{ from: [{ ipBlock: {} }, { ipBlock: '10.0.0.0/8' }, { ipBlock: { cidr: 10, except: '10.0.0.0/9', exept: [] } }] }],
      },
      errors: [
        { path: 'spec.ingress[0].from[0].ipBlock.cidr', message: 'required' },
        { path: 'spec.ingress[0].from[1].ipBlock', message: 'must be an object with cidr and except, got "10.0.0.0/8"' },
        { path: 'spec.ingress[0].from[2].ipBlock.exept', message: 'unknown field; expected cidr or except' },
        { path: 'spec.ingress[0].from[2].ipBlock.cidr', message: 'must be a string, got 10' },
        { path: 'spec.ingress[0].from[2].ipBlock.except', message: 'must be a list of CIDRs, got "10.0.0.0/9"' },
      ],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'port errors',
      spec: {
        podSelector: {},
        ingress: [
          {
            ports: [
              { port: 80 },
              { protocol: 'tcp', port: 80 },
              { protocol: 'ICMP' },
              { port: 0 },
              { port: 65536 },
              { port: 80.5 },
              { port: true },
              { port: '80' },
              { port: 'HTTP' },
              { port: 'my--port' },
              { port: '-web' },
              { port: 'averyveryverylongname' },
              { port: '' },
              { endPort: 90 },
              { port: 'http', endPort: 90 },
              { port: 100, endPort: 90 },
              { port: 100, endPort: 70000 },
              { port: 100, endPort: '200' },
              { port: 100, prot: 'TCP' },
            ],
          },
        ],
      },
      errors: [
        { path: 'spec.ingress[0].ports[1].protocol', message: 'unsupported protocol "tcp"; expected TCP, UDP or SCTP' },
        { path: 'spec.ingress[0].ports[2].protocol', message: 'unsupported protocol "ICMP"; expected TCP, UDP or SCTP' },
        { path: 'spec.ingress[0].ports[3].port', message: 'must be from 1 to 65535, got 0' },
        { path: 'spec.ingress[0].ports[4].port', message: 'must be from 1 to 65535, got 65536' },
        { path: 'spec.ingress[0].ports[5].port', message: 'must be a port number or a named port, got 80.5' },
        { path: 'spec.ingress[0].ports[6].port', message: 'must be a port number or a named port, got true' },
        {
          path: 'spec.ingress[0].ports[7].port',
          message: 'invalid named port "80": must contain at least one letter (for a port number, write it without quotes)',
        },
        { path: 'spec.ingress[0].ports[8].port', message: 'invalid named port "HTTP": must contain only lower-case letters, digits and "-"' },
        { path: 'spec.ingress[0].ports[9].port', message: 'invalid named port "my--port": must not contain "--"' },
        { path: 'spec.ingress[0].ports[10].port', message: 'invalid named port "-web": must not start or end with "-"' },
        { path: 'spec.ingress[0].ports[11].port', message: 'invalid named port "averyveryverylongname": must be at most 15 characters' },
        { path: 'spec.ingress[0].ports[12].port', message: 'invalid named port "": must not be empty' },
        { path: 'spec.ingress[0].ports[13].endPort', message: 'requires port' },
        { path: 'spec.ingress[0].ports[14].endPort', message: 'requires a numeric port, not the named port "http"' },
        { path: 'spec.ingress[0].ports[15].endPort', message: 'must be greater than or equal to port (100), got 90' },
        { path: 'spec.ingress[0].ports[16].endPort', message: 'must be at most 65535, got 70000' },
        { path: 'spec.ingress[0].ports[17].endPort', message: 'must be a port number, got "200"' },
        { path: 'spec.ingress[0].ports[18].prot', message: 'unknown field; expected protocol, port or endPort' },
      ],
      podSelector: '',
      ingress: [],
      egress: null,
    },
    {
      name: 'list-shape errors for from, to and ports',
      spec: {
        podSelector: {},
        ingress: [{ from: { podSelector: {} }, ports: 80 }, 'rule'],
        egress: [{ to: [null], ports: [null] }],
      },
      errors: [
        { path: 'spec.ingress[0].from', message: 'must be a list of peers, got an object' },
        { path: 'spec.ingress[0].ports', message: 'must be a list of ports, got 80' },
        { path: 'spec.ingress[1]', message: 'must be an object with from and ports, got "rule"' },
        { path: 'spec.egress[0].to[0]', message: 'must be an object with podSelector, namespaceSelector or ipBlock, got null' },
        { path: 'spec.egress[0].ports[0]', message: 'must be an object with protocol, port and endPort, got null' },
      ],
      podSelector: '',
      ingress: [],
      egress: [],
    },
    {
      name: 'one bad port drops every rule of the policy, never half of it',
      spec: {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [{ from: [{ podSelector: {} }] }, { ports: [{ port: 'Bad' }] }],
        egress: [{}],
      },
      errors: [{ path: 'spec.ingress[1].ports[0].port', message: 'invalid named port "Bad": must contain only lower-case letters, digits and "-"' }],
      podSelector: 'app in (web)',
      ingress: [],
      egress: [],
    },
    {
      name: 'errors from every part are reported together',
      spec: {
        podSelector: { matchLabels: { app: 5 } },
        policyTypes: ['Ingress', 'Egress'],
        ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'x', operator: 'Exists', values: ['y'] }] } }] }],
        egress: [{ to: [{ ipBlock: { cidr: '::/129' } }], ports: [{ protocol: 'udp' }] }],
      },
      errors: [
        { path: 'spec.podSelector.matchLabels["app"]', message: 'label value must be a string, got 5' },
        { path: 'spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].values', message: 'must be empty when operator is Exists' },
        { path: 'spec.egress[0].to[0].ipBlock.cidr', message: 'invalid CIDR "::/129": prefix length "129" must be a number from 0 to 128' },
        { path: 'spec.egress[0].ports[0].protocol', message: 'unsupported protocol "udp"; expected TCP, UDP or SCTP' },
      ],
      podSelector: null,
      ingress: [],
      egress: [],
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const p = compile(c.spec);
      assert.deepEqual(p.errors, c.errors);
      assert.equal(p.podSelector === null ? null : p.podSelector.key, c.podSelector);
      assert.deepEqual(p.ingress, c.ingress);
      assert.deepEqual(p.egress, c.egress);
      assert.equal(p.key, 'prod/p');
    });
  }
});

describe('peer keys are canonical', () => {
  function peerKeys(spec: unknown): string[] {
    const p = compile(spec);
    assert.deepEqual(p.errors, []);
    return (p.ingress ?? []).flatMap((r) => (r.peers ?? []).map((peer) => (peer.kind === 'pods' ? peer.key : `${peer.cidr} except ${peer.except?.key}`)));
  }

  it('equal meanings share a key across policies', () => {
    const a = peerKeys({
      podSelector: {},
      ingress: [
        {
          from: [
            { podSelector: { matchLabels: { a: '1', b: '2' } }, namespaceSelector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['x', 'y'] }] } },
            { ipBlock: { cidr: '10.0.0.0/24', except: ['10.0.0.128/25'] } },
            { ipBlock: { cidr: 'fd00::/64', except: ['fd00::1/128', 'fd00::/127'] } },
          ],
        },
      ],
    });
    const b = peerKeys({
      podSelector: {},
      ingress: [
        {
          from: [
            { namespaceSelector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['y', 'x'] }] }, podSelector: { matchLabels: { b: '2', a: '1' } } },
            { ipBlock: { cidr: '10.0.0.77/24', except: ['10.0.0.200/25', '10.0.0.128/26'] } },
            { ipBlock: { cidr: 'FD00::5/64', except: ['fd00::/128', 'fd00::1/128'] } },
          ],
        },
      ],
    });
    assert.deepEqual(a, b);
    assert.deepEqual(a, ['pods|nssel=env in (x,y)|a in (1),b in (2)', '10.0.0.0/24 except net4|10.0.0.128/25', 'fd00::/64 except net6|fd00::/127']);
  });

  it('the same podSelector in another namespace is another peer', () => {
    const spec = { podSelector: {}, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'x' } } }] }] };
    const here = compile(spec);
    const there = compilePolicy({ namespace: 'dev', name: 'p', uid: 'u', generation: 1, spec });
    const key = (p: CompiledPolicy) => (p.ingress![0].peers![0] as PodsPeer).key;
    assert.notEqual(key(here), key(there));
    assert.equal(key(there), 'pods|ns=dev|app in (x)');
  });

  it('podSelector {} with a namespaceSelector equals namespaceSelector alone', () => {
    assert.deepEqual(
      peerKeys({ podSelector: {}, ingress: [{ from: [{ namespaceSelector: { matchLabels: { t: 'a' } }, podSelector: {} }] }] }),
      peerKeys({ podSelector: {}, ingress: [{ from: [{ namespaceSelector: { matchLabels: { t: 'a' } } }] }] }),
    );
  });
});

describe('compilePolicy metadata', () => {
  it('copies identity and builds the key', () => {
    const p = compilePolicy({ namespace: 'kube-system', name: 'deny-all', uid: 'abc', generation: 12, spec: { podSelector: {} } });
    assert.equal(p.key, 'kube-system/deny-all');
    assert.equal(p.namespace, 'kube-system');
    assert.equal(p.name, 'deny-all');
    assert.equal(p.uid, 'abc');
    assert.equal(p.generation, 12);
  });
});

describe('compilePolicy scale', () => {
  it('compiles 20k policies quickly', () => {
    const start = performance.now();
    for (let i = 0; i < 20000; i++) {
      const p = compilePolicy({
        namespace: `ns${i % 100}`,
        name: `p${i}`,
        uid: String(i),
        generation: 1,
        spec: {
          podSelector: { matchLabels: { app: `a${i}` } },
          ingress: [
            {
              from: [{ namespaceSelector: { matchLabels: { team: 't' } }, podSelector: { matchExpressions: [{ key: 'tier', operator: 'In', values: ['fe', 'be'] }] } }],
              ports: [{ port: 80 }, { port: 'http' }],
            },
            { from: [{ ipBlock: { cidr: '10.0.0.0/8', except: [`10.${i % 256}.0.0/16`] } }] },
          ],
          egress: [{ to: [{ podSelector: {} }], ports: [{ protocol: 'UDP', port: 53 }] }],
        },
      });
      assert.equal(p.errors.length, 0);
    }
    const ms = performance.now() - start;
    // Generous bound for slow CI machines; typical is well under a second.
    assert.ok(ms < 5000, `took ${ms} ms`);
  });
});

describe('compilePolicy limits: what one policy may cost every agent is bounded', () => {
  /** n distinct IPv4 host prefixes, scattered. */
  const hosts4 = (n: number) =>
    Array.from({ length: n }, (_, i) => {
      const h = Math.imul(i + 1, 2654435761) >>> 0;
      return `${(h >>> 24) & 255}.${(h >>> 16) & 255}.${(h >>> 8) & 255}.${h & 255}/32`;
    });

  it('a block whose excepts cover it all is kept (matching nothing), not widened', () => {
    const p = compile({ podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['0.0.0.0/1', '128.0.0.0/1'] } }] }] });
    assert.deepEqual(p.ingress?.[0].peers, [{ kind: 'ipBlock', family: 4, cidr: '0.0.0.0/0', except: prefixes(4, ['0.0.0.0/1', '128.0.0.0/1']) }]);
  });

  it(`accepts ipBlocks holding ${LIMITS.ipBlockPrefixes} prefixes in all, and rejects one more at its path`, () => {
    const except = [...new Set(hosts4(LIMITS.ipBlockPrefixes + 10))].slice(0, LIMITS.ipBlockPrefixes + 1);
    const at = compile({ podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0', except: except.slice(0, LIMITS.ipBlockPrefixes - 2) } }, { ipBlock: { cidr: '10.0.0.0/8' } }] }] });
    assert.deepEqual(at.errors, []);
    const over = compile({ podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0', except: except.slice(0, LIMITS.ipBlockPrefixes - 1) } }, { ipBlock: { cidr: '10.0.0.0/8' } }] }] });
    assert.deepEqual(over.errors, [
      {
        path: 'spec.ingress[0].from[1].ipBlock.cidr',
        message: `the policy's ipBlocks hold more than ${LIMITS.ipBlockPrefixes} prefixes (cidr and except entries); Weir accepts at most ${LIMITS.ipBlockPrefixes} per policy`,
      },
    ]);
    assert.deepEqual(over.ingress, [], 'rejected whole: isolates, allows nothing');
  });

  it('a 1 MB policy of scattered excepts is rejected with one error at the first prefix over the limit', () => {
    const except = hosts4(80_000);
    const spec = { podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0', except } }] }] };
    assert.ok(JSON.stringify(spec).length > 1_000_000);
    const p = compile(spec);
    assert.equal(p.errors.length, 1, JSON.stringify(p.errors.slice(0, 3)));
    assert.equal(p.errors[0].path, `spec.ingress[0].from[0].ipBlock.except[${LIMITS.ipBlockPrefixes - 1}]`);
    assert.deepEqual(p.ingress, []);
  });

  it(`rejects more than ${LIMITS.selectorPeers} podSelector/namespaceSelector peers`, () => {
    const peers = (n: number) => Array.from({ length: n }, (_, i) => ({ podSelector: { matchLabels: { app: `a${i}` } } }));
    assert.deepEqual(compile({ podSelector: {}, ingress: [{ from: peers(LIMITS.selectorPeers) }] }).errors, []);
    assert.deepEqual(compile({ podSelector: {}, ingress: [{ from: peers(600) }], egress: [{ to: peers(LIMITS.selectorPeers - 599) }] }).errors, [
      {
        path: `spec.egress[0].to[${LIMITS.selectorPeers - 600}]`,
        message: `more than ${LIMITS.selectorPeers} podSelector/namespaceSelector peers in one policy; Weir accepts at most ${LIMITS.selectorPeers}`,
      },
    ]);
  });

  it(`rejects a policy of more than ${LIMITS.rules} rules (each peer times each port), at the rule that crosses it`, () => {
    const ports = (n: number) => Array.from({ length: n }, (_, i) => ({ port: i + 1 }));
    const peers = (n: number) => Array.from({ length: n }, (_, i) => ({ podSelector: { matchLabels: { app: `a${i}` } } }));
    // 100 x 50 + 100 x 50 = 10,000: at the limit. Plain ipBlocks of a rule are one set: they count once.
    const plain = Array.from({ length: 200 }, (_, i) => ({ ipBlock: { cidr: `10.${i}.0.0/16` } }));
    const ok = {
      podSelector: {},
      ingress: [
        { from: peers(99).concat(plain as never[]), ports: ports(50) },
        { from: peers(100), ports: ports(50) },
      ],
    };
    assert.deepEqual(compile(ok).errors, []);
    const over = { ...ok, egress: [{ ports: ports(1) }] };
    assert.deepEqual(compile(over).errors, [
      {
        path: 'spec.egress[0]',
        message: `the policy compiles to more than ${LIMITS.rules} rules (each peer times each port, summed over its rules; ipBlocks without except in one rule count as one peer); Weir accepts at most ${LIMITS.rules}`,
      },
    ]);
    // An empty rule list of peers or ports counts as one.
    assert.deepEqual(
      compile({ podSelector: {}, ingress: Array.from({ length: LIMITS.rules + 1 }, () => ({})) }).errors.map((e) => e.path),
      [`spec.ingress[${LIMITS.rules}]`],
    );
  });

  it(`lists at most ${LIMITS.errors} errors, then says how many more`, () => {
    const p = compile({ podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '10.0.0.0/8', except: Array.from({ length: 250 }, () => 'nonsense') } }] }] });
    assert.equal(p.errors.length, LIMITS.errors + 1);
    assert.deepEqual(p.errors[LIMITS.errors], { path: 'spec', message: `150 more errors not listed (at most ${LIMITS.errors} are)` });
  });
});

describe('compilePolicy reports the problems a source found outside the spec as errors of the policy', () => {
  const labelError = { path: 'metadata.labels.version', message: 'must be a string, got the number 2 (quote it in YAML)' };
  const versionError = { path: 'apiVersion', message: '"networking.k8s.io/v2" is not networking.k8s.io/v1' };
  const withErrors = (spec: unknown, errors: PolicyError[]) => compilePolicy({ namespace: NS, name: 'p', uid: 'uid-1', generation: 3, spec, errors });
  const open = { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress', 'Egress'], ingress: [{}], egress: [{}] };

  it('a sound spec with a metadata or apiVersion error is invalid: it isolates what it selects and allows nothing', () => {
    assert.deepEqual(withErrors(open, [labelError, versionError]), {
      key: 'prod/p',
      namespace: NS,
      name: 'p',
      uid: 'uid-1',
      generation: 3,
      podSelector: appB,
      ingress: [],
      egress: [],
      errors: [labelError, versionError],
      audit: null,
      enforcement: 'enforce',
    });
    // Only the directions the spec names are isolated, as for an invalid spec.
    const ingressOnly = withErrors({ podSelector: {}, ingress: [{}] }, [labelError]);
    assert.deepEqual([ingressOnly.ingress, ingressOnly.egress, ingressOnly.errors], [[], null, [labelError]]);
  });

  it('lists them first, then the errors of the spec, each at its own path', () => {
    assert.deepEqual(withErrors({ podSelector: {}, ingres: [{}] }, [versionError]).errors, [
      versionError,
      { path: 'spec.ingres', message: 'unknown field; expected podSelector, policyTypes, ingress or egress' },
    ]);
    assert.deepEqual(withErrors('nope', [labelError]).errors, [labelError, { path: 'spec', message: 'must be an object, got "nope"' }]);
  });

  it('an empty list is no error: the policy compiles as without it', () => {
    assert.deepEqual(withErrors(open, []), compile(open));
    assert.deepEqual(compile(open).errors, []);
  });

  it(`counts them in the ${LIMITS.errors} errors listed; the rest are counted at the field where listing stopped`, () => {
    const labels = (n: number) => Array.from({ length: n }, (_, i) => ({ path: `metadata.labels.l${i}`, message: 'must be a string, got the number 1 (quote it in YAML)' }));
    const badSpec = { podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '10.0.0.0/8', except: Array.from({ length: 250 }, () => 'nonsense') } }] }] };
    const some = withErrors(badSpec, labels(60));
    assert.equal(some.errors.length, LIMITS.errors + 1);
    assert.deepEqual(some.errors.slice(0, 60), labels(60));
    assert.equal(some.errors[60].path, 'spec.ingress[0].from[0].ipBlock.except[0]');
    assert.deepEqual(some.errors[LIMITS.errors], { path: 'spec', message: `210 more errors not listed (at most ${LIMITS.errors} are)` });
    const many = withErrors('nope', labels(150));
    assert.deepEqual(many.errors, [...labels(LIMITS.errors), { path: 'metadata', message: `51 more errors not listed (at most ${LIMITS.errors} are)` }]);
    assert.deepEqual([many.podSelector, many.ingress, many.egress], [null, [], []]);
  });
});

describe("compilePolicy reads Weir's annotations", () => {
  const spec = { podSelector: {}, ingress: [{}] };
  const annotated = (annotations: Record<string, string>) => compilePolicy({ namespace: NS, name: 'p', uid: 'uid-1', generation: 3, spec, annotations });

  it('weir.dev/audit sets the level of its rules; none leaves it to the namespace (null)', () => {
    assert.equal(compile(spec).audit, null);
    for (const level of ['off', 'deny', 'all'] as const) assert.equal(annotated({ 'weir.dev/audit': level }).audit, level);
  });

  it('weir.dev/enforcement: audit makes a policy audit-only; none or enforce enforces it', () => {
    assert.equal(compile(spec).enforcement, 'enforce');
    assert.equal(annotated({ 'weir.dev/enforcement': 'enforce' }).enforcement, 'enforce');
    const audit = annotated({ 'weir.dev/enforcement': 'audit' });
    assert.deepEqual([audit.enforcement, audit.errors, audit.ingress], ['audit', [], [{ peers: null, ports: null }]]);
  });

  it('an unreadable value makes the policy invalid and enforced, so a typo never stops enforcement', () => {
    const bad = annotated({ 'weir.dev/enforcement': 'audit-only', 'weir.dev/audit': 'yes' });
    assert.equal(bad.enforcement, 'enforce');
    assert.deepEqual(bad.ingress, []);
    assert.deepEqual(bad.errors, [
      { path: 'metadata.annotations["weir.dev/enforcement"]', message: 'must be one of enforce, audit, got "audit-only"' },
      { path: 'metadata.annotations["weir.dev/audit"]', message: 'must be one of off, deny, all, got "yes"' },
    ]);
  });
});

describe('PolicyParts', () => {
  const raw = (ns: string, name: string, port: number) => ({
    namespace: ns,
    name,
    uid: `uid-${name}`,
    generation: 1,
    spec: { podSelector: { matchLabels: { tier: 'db' } }, ingress: [{ from: [{ namespaceSelector: { matchLabels: { env: 'prod' } } }], ports: [{ port }] }] },
  });

  it('policies of one template share their pod selector and rule lists, and keep their own names', () => {
    const parts = new PolicyParts();
    const a = parts.share(compilePolicy(raw('ns-1', 'a', 5432)));
    const b = parts.share(compilePolicy(raw('ns-2', 'b', 5432)));
    const c = parts.share(compilePolicy(raw('ns-2', 'c', 6379)));
    assert.equal(b.podSelector, a.podSelector);
    assert.equal(b.ingress, a.ingress);
    assert.notEqual(c.ingress, a.ingress, 'another port is another rule list');
    assert.deepEqual([a.key, b.key, c.key], ['ns-1/a', 'ns-2/b', 'ns-2/c']);
    assert.deepEqual(b, compilePolicy(raw('ns-2', 'b', 5432)), 'sharing changes nothing a policy says');
  });
});
