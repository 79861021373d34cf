import { describe, it, test } from 'node:test';
import assert from 'node:assert/strict';
import { WeirError } from '../../../src/errors.ts';
import { namespaceNameOf, readClusterNetworkPolicy, readNetworkPolicy, toClusterNetworkPolicy, toNamespace, toNetworkPolicy, toNode, toPod } from '../../../src/sources/convert.ts';
import { compileClusterNetworkPolicy, FAIL_CLOSED_CNP_RULE } from '../../../src/model/cluster-network-policy.ts';
import { compilePolicy } from '../../../src/model/policy.ts';
import type { Pod, PolicyError } from '../../../src/model/types.ts';

const podDefaults: Omit<Pod, 'uid' | 'namespace' | 'name'> = {
  labels: {},
  nodeName: '',
  hostNetwork: false,
  phase: 'Pending',
  terminating: false,
  ips: [],
  ports: [],
};

test('toPod applies the API server defaults and keeps only model fields', async (t) => {
  const cases: { name: string; input: unknown; expected: Pod }[] = [
    {
      name: 'manifest pod without namespace or uid',
      input: { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web' }, spec: { containers: [{ name: 'c', image: 'x' }] } },
      expected: { uid: 'default/web', namespace: 'default', name: 'web', ...podDefaults },
    },
    {
      name: 'API pod with uid, node, phase, dual-stack IPs in non-canonical text',
      input: {
        metadata: { name: 'api', namespace: 'backend', uid: 'u-1', labels: { b: '2', a: '1' }, resourceVersion: '9' },
        spec: { nodeName: 'node-a', hostNetwork: false },
        status: { phase: 'Running', podIP: '10.0.0.9', podIPs: [{ ip: '10.1.2.3' }, { ip: 'FD00:0:0:0:0:0:0:0001' }] },
      },
      expected: {
        ...podDefaults,
        uid: 'u-1',
        namespace: 'backend',
        name: 'api',
        labels: { a: '1', b: '2' },
        nodeName: 'node-a',
        phase: 'Running',
        ips: ['10.1.2.3', 'fd00::1'],
      },
    },
    {
      name: 'podIP is used when podIPs is absent',
      input: { metadata: { name: 'p' }, status: { phase: 'Running', podIP: '10.1.2.4' } },
      expected: { ...podDefaults, uid: 'default/p', namespace: 'default', name: 'p', phase: 'Running', ips: ['10.1.2.4'] },
    },
    {
      name: 'deletionTimestamp marks the pod terminating; hostNetwork is kept',
      input: { metadata: { name: 'p', deletionTimestamp: '2024-01-01T00:00:00Z' }, spec: { hostNetwork: true } },
      expected: { ...podDefaults, uid: 'default/p', namespace: 'default', name: 'p', terminating: true, hostNetwork: true },
    },
    {
      name: 'named ports of containers and sidecars only, protocol defaults to TCP',
      input: {
        metadata: { name: 'p' },
        spec: {
          initContainers: [
            { name: 'init', ports: [{ name: 'init-port', containerPort: 9 }] },
            { name: 'sidecar', restartPolicy: 'Always', ports: [{ name: 'metrics', containerPort: 9090 }] },
          ],
          containers: [
            { name: 'a', ports: [{ name: 'http', containerPort: 80 }, { containerPort: 8080 }] },
            { name: 'b', ports: [{ name: 'dns', containerPort: 53, protocol: 'UDP' }] },
          ],
        },
      },
      expected: {
        ...podDefaults,
        uid: 'default/p',
        namespace: 'default',
        name: 'p',
        ports: [
          { name: 'http', port: 80, protocol: 'TCP' },
          { name: 'dns', port: 53, protocol: 'UDP' },
          { name: 'metrics', port: 9090, protocol: 'TCP' },
        ],
      },
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => assert.deepEqual(toPod(c.input), c.expected));
  }
});

test('toPod drops invalid IPs with a warning naming the field and value', () => {
  const warnings: string[] = [];
  const pod = toPod({ metadata: { name: 'p', namespace: 'ns' }, status: { podIPs: [{ ip: '10.0.0.300' }, { ip: '10.0.0.1' }, { ip: '10.0.0.1' }] } }, (m) => warnings.push(m));
  assert.deepEqual(pod.ips, ['10.0.0.1']);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /Pod ns\/p: status\.podIPs\[0\]\.ip "10\.0\.0\.300" is not an IP address/);
});

test('conversion errors list every problem of the object at once', async (t) => {
  const cases: { name: string; convert: () => unknown; expected: RegExp[] }[] = [
    { name: 'pod without metadata', convert: () => toPod({ kind: 'Pod' }), expected: [/metadata is missing/] },
    { name: 'pod without a name', convert: () => toPod({ metadata: { namespace: 'x' } }), expected: [/metadata\.name is missing/] },
    {
      name: 'pod with a numeric label and a bad named port',
      convert: () =>
        toPod({
          metadata: { name: 'p', labels: { version: 1 } },
          spec: { containers: [{ ports: [{ name: 'http', containerPort: 70000, protocol: 'ICMP' }] }] },
        }),
      expected: [
        /^Pod default\/p: /,
        /metadata\.labels\.version must be a string/,
        /spec\.containers\[0\]\.ports\[0\]\.containerPort must be an integer from 1 to 65535/,
        /spec\.containers\[0\]\.ports\[0\]\.protocol must be one of TCP, UDP, SCTP/,
      ],
    },
    { name: 'pod with a string hostNetwork', convert: () => toPod({ metadata: { name: 'p' }, spec: { hostNetwork: 'yes' } }), expected: [/spec\.hostNetwork must be true or false/] },
    { name: 'namespace with an empty name', convert: () => toNamespace({ metadata: { name: '' } }), expected: [/^Namespace \(unnamed\): metadata\.name is empty/] },
    { name: 'node that is not a mapping', convert: () => toNode(['x']), expected: [/^Node \(unnamed\): the object must be a mapping, got a list/] },
    {
      name: 'namespace with a label that is not a string',
      convert: () => toNamespace({ metadata: { name: 'n', labels: { tier: 1 } } }),
      expected: [/^Namespace n: metadata\.labels\.tier must be a string/],
    },
    { name: 'node with annotations that are a list', convert: () => toNode({ metadata: { name: 'n', annotations: ['a'] } }), expected: [/^Node n: metadata\.annotations must be an object/] },
    {
      name: 'policy whose namespace cannot be read (the API server never sends one)',
      convert: () => toNetworkPolicy({ metadata: { name: 'np', namespace: 7 } }),
      expected: [/metadata\.namespace must be a string/],
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      assert.throws(c.convert, (err: unknown) => {
        assert.ok(err instanceof WeirError);
        assert.equal(err.code, 'WEIR_MANIFEST_OBJECT');
        for (const re of c.expected) assert.match(err.message, re);
        return true;
      });
    });
  }
});

test('toNamespace adds the kubernetes.io/metadata.name label like the API server', () => {
  const ns = toNamespace({ metadata: { name: 'db', labels: { team: 'data', 'kubernetes.io/metadata.name': 'spoofed' } } });
  assert.deepEqual(ns, { name: 'db', labels: { 'kubernetes.io/metadata.name': 'db', team: 'data' } });
});

test('toNode reads podCIDRs, falls back to podCIDR, canonicalises and drops invalid ones', async (t) => {
  const cases: { name: string; spec: unknown; expected: string[]; warnings: number }[] = [
    { name: 'podCIDRs', spec: { podCIDRs: ['10.244.1.0/24', 'FD00:10:244:1::/64'] }, expected: ['10.244.1.0/24', 'fd00:10:244:1::/64'], warnings: 0 },
    { name: 'podCIDR fallback', spec: { podCIDR: '10.244.2.0/24' }, expected: ['10.244.2.0/24'], warnings: 0 },
    { name: 'host bits cleared', spec: { podCIDRs: ['10.244.3.7/24'] }, expected: ['10.244.3.0/24'], warnings: 0 },
    { name: 'invalid dropped', spec: { podCIDRs: ['10.244.4.0/33', '10.244.5.0/24'] }, expected: ['10.244.5.0/24'], warnings: 1 },
    { name: 'no spec', spec: undefined, expected: [], warnings: 0 },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const warnings: string[] = [];
      const node = toNode({ metadata: { name: 'n1' }, spec: c.spec }, (m) => warnings.push(m));
      assert.deepEqual(node, { name: 'n1', podCIDRs: c.expected });
      assert.equal(warnings.length, c.warnings);
    });
  }
});

test('toNetworkPolicy passes the spec through and defaults namespace, uid and generation', () => {
  const spec = { podSelector: {}, ingress: [{ ports: [{ port: 80 }] }], unknownField: true };
  const np = toNetworkPolicy({ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name: 'np' }, spec });
  assert.deepEqual(np, { namespace: 'default', name: 'np', uid: 'default/np', generation: 1, spec });
  assert.equal(np.spec, spec);
  const fromApi = toNetworkPolicy({ metadata: { name: 'np', namespace: 'a', uid: 'u-9', generation: 4 }, spec });
  assert.deepEqual([fromApi.uid, fromApi.generation, fromApi.namespace], ['u-9', 4, 'a']);
});

test('readNetworkPolicy keeps a policy with broken metadata, its problems as policy errors at their own paths, so the model rejects it', async (t) => {
  const spec = { podSelector: { matchLabels: { app: 'db' } }, policyTypes: ['Egress'], egress: [{}] };
  const version = { path: 'apiVersion', message: '"v9" is not networking.k8s.io/v1' };
  const cases: { name: string; metadata: unknown; namespace: string; anyNamespace: boolean; errors: PolicyError[]; named: boolean }[] = [
    {
      name: 'a numeric label',
      metadata: { name: 'np', namespace: 'a', labels: { v: 2 } },
      namespace: 'a',
      anyNamespace: false,
      errors: [{ path: 'metadata.labels.v', message: 'must be a string, got the number 2 (quote it in YAML)' }],
      named: true,
    },
    {
      name: 'a label whose key is no plain name',
      metadata: { name: 'np', namespace: 'a', labels: { 'app.kubernetes.io/on': true } },
      namespace: 'a',
      anyNamespace: false,
      errors: [{ path: 'metadata.labels["app.kubernetes.io/on"]', message: 'must be a string, got true (quote it in YAML)' }],
      named: true,
    },
    {
      name: 'a bad generation',
      metadata: { name: 'np', namespace: 'a', generation: 0 },
      namespace: 'a',
      anyNamespace: false,
      errors: [{ path: 'metadata.generation', message: 'must be a positive integer, got the number 0' }],
      named: true,
    },
    {
      name: 'a numeric uid',
      metadata: { name: 'np', namespace: 'a', uid: 5 },
      namespace: 'a',
      anyNamespace: false,
      errors: [{ path: 'metadata.uid', message: 'must be a string, got the number 5 (quote it in YAML)' }],
      named: true,
    },
    {
      name: 'a name that is a list',
      metadata: { name: ['np'], namespace: 'a' },
      namespace: 'a',
      anyNamespace: false,
      errors: [{ path: 'metadata.name', message: 'must be a string, got a list' }],
      named: false,
    },
    { name: 'no metadata: the default namespace, no name', metadata: undefined, namespace: 'default', anyNamespace: false, errors: [{ path: 'metadata', message: 'is missing' }], named: false },
    {
      name: 'a namespace that is a mapping',
      metadata: { name: 'np', namespace: { a: 1 } },
      namespace: '',
      anyNamespace: true,
      errors: [{ path: 'metadata.namespace', message: 'must be a string, got an object' }],
      named: false,
    },
    { name: 'metadata that is a string', metadata: 'np', namespace: '', anyNamespace: true, errors: [{ path: 'metadata', message: 'must be an object, got "np"' }], named: false },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const r = readNetworkPolicy({ metadata: c.metadata, spec }, '(stand-in)', [version]);
      assert.equal(r.anyNamespace, c.anyNamespace);
      assert.equal(r.policy.namespace, c.namespace);
      assert.equal(r.policy.name, c.named ? 'np' : '(stand-in)');
      assert.deepEqual(r.policy.errors, [version, ...c.errors]);
      assert.equal(r.policy.spec, spec, 'the spec goes through as received');
      // What the model makes of it: invalid, isolating what the spec selects in the directions
      // it names, allowing nothing; its errors are exactly these, at their own paths.
      const compiled = compilePolicy({ ...r.policy, namespace: c.namespace || 'a' });
      assert.deepEqual(compiled.errors, [version, ...c.errors]);
      assert.deepEqual([compiled.podSelector?.key, compiled.ingress, compiled.egress], ['app in (db)', null, []]);
    });
  }
  await t.test('a sound policy passes through untouched, with no errors field', () => {
    const r = readNetworkPolicy({ metadata: { name: 'np', namespace: 'a' }, spec }, '(stand-in)');
    assert.deepEqual(r, { policy: { namespace: 'a', name: 'np', uid: 'a/np', generation: 1, spec }, anyNamespace: false });
    assert.equal(r.policy.spec, spec);
  });
});

test('toNetworkPolicy carries metadata problems like readNetworkPolicy when name and namespace are readable', () => {
  const spec = { podSelector: {} };
  const np = toNetworkPolicy({ metadata: { name: 'np', namespace: 'a', annotations: { n: 1 } }, spec });
  assert.deepEqual([np.namespace, np.name, np.spec], ['a', 'np', spec]);
  const errors = [{ path: 'metadata.annotations.n', message: 'must be a string, got the number 1 (quote it in YAML)' }];
  assert.deepEqual(np.errors, errors);
  assert.deepEqual(compilePolicy(np).errors, errors);
});

test('namespaceNameOf reads the name of a Namespace that does not convert, if it can', () => {
  assert.equal(namespaceNameOf({ metadata: { name: 'n', labels: { tier: 1 } } }), 'n');
  assert.equal(namespaceNameOf({ metadata: { name: 3 } }), null);
  assert.equal(namespaceNameOf('nonsense'), null);
});

describe("sources keep Weir's annotations, and only those", () => {
  it('a Namespace carries weir.dev/audit as written', () => {
    assert.equal(toNamespace({ metadata: { name: 'n', annotations: { 'weir.dev/audit': 'deny', other: 'x' } } }).audit, 'deny');
    assert.equal('audit' in toNamespace({ metadata: { name: 'n', annotations: { other: 'x' } } }), false);
  });

  it('a NetworkPolicy carries its weir.dev/ annotations; others produce no difference', () => {
    const policy = (annotations: Record<string, string>) => toNetworkPolicy({ metadata: { name: 'p', namespace: 'n', annotations }, spec: { podSelector: {} } });
    assert.deepEqual(policy({ 'weir.dev/enforcement': 'audit', 'kubectl.kubernetes.io/last-applied-configuration': '{}' }).annotations, { 'weir.dev/enforcement': 'audit' });
    assert.deepEqual(policy({ other: 'x' }), policy({}));
  });
});

describe('ClusterNetworkPolicy: cluster-scoped, never dropped for its metadata', () => {
  const spec = { tier: 'Admin', priority: 1, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] };

  it('toClusterNetworkPolicy passes the spec through with name, uid, generation and weir.dev/ annotations; a namespace and the status are ignored', () => {
    const fromApi = toClusterNetworkPolicy({
      apiVersion: 'policy.networking.k8s.io/v1beta1',
      kind: 'ClusterNetworkPolicy',
      metadata: { name: 'tenants', uid: 'u-1', generation: 3, annotations: { 'weir.dev/audit': 'all', other: 'x' } },
      spec,
      status: { conditions: [] },
    });
    assert.deepEqual(fromApi, { name: 'tenants', uid: 'u-1', generation: 3, spec, annotations: { 'weir.dev/audit': 'all' } });
    assert.equal(fromApi.spec, spec, 'the spec as received');
    assert.deepEqual(toClusterNetworkPolicy({ metadata: { name: 'tenants', namespace: 'ignored' }, spec }), { name: 'tenants', uid: 'tenants', generation: 1, spec });
  });

  it("readClusterNetworkPolicy keeps broken metadata as errors at their paths (after the source's), so the model fails it closed", () => {
    const version = { path: 'apiVersion', message: '"policy.networking.k8s.io/v1" is not policy.networking.k8s.io/v1beta1' };
    const r = readClusterNetworkPolicy({ metadata: { name: 'tenants', generation: 'two', labels: { v: 2 } }, spec }, '(stand-in)', [version]);
    const errors = [
      version,
      { path: 'metadata.labels.v', message: 'must be a string, got the number 2 (quote it in YAML)' },
      { path: 'metadata.generation', message: 'must be a positive integer, got "two"' },
    ];
    assert.deepEqual(r, { name: 'tenants', uid: 'tenants', generation: 1, spec, errors });
    const compiled = compileClusterNetworkPolicy(r);
    assert.deepEqual(compiled.errors, errors);
    assert.deepEqual([compiled.ingress, compiled.egress], [[FAIL_CLOSED_CNP_RULE], []]);
  });

  it('an unreadable name gets the stand-in; toClusterNetworkPolicy refuses it', () => {
    const r = readClusterNetworkPolicy({ metadata: { name: 7 }, spec }, '(stand-in)');
    assert.deepEqual([r.name, r.uid, r.errors], ['(stand-in)', '(stand-in)', [{ path: 'metadata.name', message: 'must be a string, got the number 7 (quote it in YAML)' }]]);
    assert.throws(
      () => toClusterNetworkPolicy({ metadata: { name: 7 }, spec }),
      (err: unknown) => err instanceof WeirError && err.code === 'WEIR_MANIFEST_OBJECT' && /^ClusterNetworkPolicy \(unnamed\): metadata\.name must be a string/.test(err.message),
    );
  });
});
