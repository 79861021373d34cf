import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WeirError } from '../../../src/errors.ts';
import { toNamespace, toNetworkPolicy, toNode, toPod } from '../../../src/sources/convert.ts';
import type { Pod } from '../../../src/model/types.ts';

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
  const pod = toPod(
    { metadata: { name: 'p', namespace: 'ns' }, status: { podIPs: [{ ip: '10.0.0.300' }, { ip: '10.0.0.1' }, { ip: '10.0.0.1' }] } },
    (m) => warnings.push(m),
  );
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
    { name: 'node that is not a mapping', convert: () => toNode(['x']), expected: [/not a mapping/] },
    {
      name: 'policy with a bad generation',
      convert: () => toNetworkPolicy({ metadata: { name: 'np', namespace: 'a', generation: 0 } }),
      expected: [/^NetworkPolicy a\/np: metadata\.generation must be a positive integer/],
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
