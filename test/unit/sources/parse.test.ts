import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ManifestObjectError, ManifestParseError } from '../../../src/errors.ts';
import { extractObjects, parseManifest } from '../../../src/sources/manifests/parse.ts';
import { objectRef } from '../../../src/sources/view.ts';
import type { ModelUpsert } from '../../../src/sources/view.ts';
import { compileClusterNetworkPolicy, FAIL_CLOSED_CNP_RULE } from '../../../src/model/cluster-network-policy.ts';
import { compilePolicy } from '../../../src/model/policy.ts';
import type { CompiledClusterNetworkPolicy, CompiledPolicy, PolicyError } from '../../../src/model/types.ts';

const load = (file: string, text: string) => extractObjects(file, parseManifest(file, text));
/** The model objects a file yields, in file order. */
const upserts = (r: ReturnType<typeof load>): ModelUpsert[] => r.items.flatMap((i) => ('op' in i ? [i] : []));

test('recognised objects are read from YAML, JSON and List kinds, in file order', async (t) => {
  const cases: { name: string; file: string; text: string; expected: string[] }[] = [
    {
      name: 'multi-document YAML with empty documents',
      file: 'a.yaml',
      text: `---
apiVersion: v1
kind: Namespace
metadata: {name: one}
---
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: one}
---
`,
      expected: ['Namespace one', 'Pod one/p'],
    },
    {
      name: 'kind: List and typed lists such as PodList',
      file: 'b.yml',
      text: `apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Node, metadata: {name: n1}}
  - apiVersion: v1
    kind: PodList
    items:
      - {apiVersion: v1, kind: Pod, metadata: {name: p1}}
      - {apiVersion: v1, kind: Pod, metadata: {name: p2}}
`,
      expected: ['Node n1', 'Pod default/p1', 'Pod default/p2'],
    },
    {
      name: 'a JSON object',
      file: 'c.json',
      text: '{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"np","namespace":"x"},"spec":{}}',
      expected: ['NetworkPolicy x/np'],
    },
    {
      name: 'ClusterNetworkPolicies of both served versions (one schema), cluster-scoped',
      file: 'cnp.yaml',
      text: `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: tenants, namespace: ignored}
spec: {tier: Admin, priority: 1, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: defaults}
spec: {tier: Baseline, priority: 1, subject: {namespaces: {}}}
`,
      expected: ['ClusterNetworkPolicy tenants', 'ClusterNetworkPolicy defaults'],
    },
    {
      name: 'a JSON List with a byte-order mark',
      file: 'd.json',
      text: '\uFEFF{"kind":"List","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"j"}}]}',
      expected: ['Namespace j'],
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const r = load(c.file, c.text);
      assert.deepEqual(upserts(r).map(objectRef), c.expected);
      assert.deepEqual(
        r.problems.filter((p) => p.level === 'warn'),
        [],
      );
    });
  }
});

test('kinds Weir does not read are ignored at debug level', () => {
  const r = load(
    'x.yaml',
    `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cilium}
---
apiVersion: v1
kind: constructor
metadata: {name: proto}
`,
  );
  assert.deepEqual(r.items, []);
  assert.deepEqual(
    r.problems.map((p) => p.level),
    ['debug', 'debug', 'debug'],
  );
  assert.match(r.problems[1].message, /cilium\.io\/v2 CiliumNetworkPolicy is not used by Weir/);
});

test('an unusable object is reported with file and position and fails closed; its siblings stay', () => {
  const r = load(
    '/m/bad.yaml',
    `apiVersion: v1
kind: Pod
metadata: {name: good}
---
apiVersion: v1
kind: Pod
metadata: {labels: {a: b}}
---
kind: Namespace
metadata: {name: noversion}
---
apiVersion: v2
kind: Node
metadata: {name: n1}
---
- just a list
`,
  );
  assert.deepEqual(upserts(r).map(objectRef), ['Pod default/good']);
  // The Namespace stays as unreadable: its pods are then no peer of any policy (merge.ts).
  assert.deepEqual(
    r.items.filter((i) => !('op' in i)),
    [{ kind: 'UnreadableNamespace', name: 'noversion' }],
  );
  const warns = r.problems.filter((p) => p.level === 'warn');
  assert.equal(warns.length, 4);
  assert.ok(warns[0].error instanceof ManifestObjectError);
  assert.equal(warns[0].error.file, '/m/bad.yaml');
  assert.equal(warns[0].error.objectRef, 'document 2');
  assert.match(warns[0].message, /^\/m\/bad\.yaml: document 2: Pod \(unnamed\): metadata\.name is missing; skipped: its node drops its traffic/);
  assert.match(warns[1].message, /document 3: Namespace: apiVersion is missing \(expected v1\); skipped: its pods are no peer of any policy/);
  assert.match(warns[2].message, /document 4: Node: apiVersion "v2" is not v1; skipped$/);
  assert.match(warns[3].message, /document 5 is not a Kubernetes object/);
});

test('conversion warnings name the file and document', () => {
  const r = load(
    '/m/ips.yaml',
    `apiVersion: v1
kind: Pod
metadata: {name: p}
status: {podIP: not-an-ip}
`,
  );
  assert.equal(upserts(r).length, 1);
  assert.deepEqual(
    r.problems.map((p) => p.message),
    ['/m/ips.yaml: document 1: Pod default/p: status.podIP "not-an-ip" is not an IP address; ignored'],
  );
});

test('parse errors name the 1-based line', async (t) => {
  const cases: { name: string; file: string; text: string; line: number }[] = [
    { name: 'YAML bad indentation', file: 'a.yaml', text: 'kind: Pod\nmetadata:\n  name: x\n   bad: 1\n', line: 4 },
    { name: 'YAML duplicate key', file: 'a.yaml', text: 'a: 1\nb: 2\na: 3\n', line: 3 },
    { name: 'YAML error in a later document', file: 'a.yml', text: 'a: 1\n---\nb: [\n', line: 4 },
    { name: 'JSON trailing comma', file: 'c.json', text: '{\n  "a": 1,\n}\n', line: 3 },
    { name: 'JSON cut short', file: 'c.json', text: '{\n  "a": 1,\n  "b": ', line: 3 },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      assert.throws(
        () => parseManifest(c.file, c.text),
        (err: unknown) => {
          assert.ok(err instanceof ManifestParseError);
          assert.equal(err.code, 'WEIR_MANIFEST_PARSE');
          assert.equal(err.line, c.line);
          assert.ok(err.message.startsWith(`${c.file}:${c.line}: `), err.message);
          return true;
        },
      );
    });
  }
});

/** What the model makes of the NetworkPolicies a file yields. */
function compiledPolicies(r: ReturnType<typeof load>): CompiledPolicy[] {
  return upserts(r).flatMap((u) => (u.kind === 'NetworkPolicy' ? [compilePolicy(u.object)] : []));
}

// Selects app=db and isolates both directions; valid, it would allow everything both ways.
const OPEN_SPEC = `spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress, Egress]
  ingress: [{}]
  egress: [{}]
`;

/** The policy reached the model invalid, isolating what it selects both ways and allowing nothing. */
function assertFailsClosed(r: ReturnType<typeof load>, namespace: string): void {
  const policies = compiledPolicies(r);
  assert.equal(policies.length, 1, 'one policy reaches the model');
  const [p] = policies;
  assert.equal(p.namespace, namespace);
  assert.ok(p.errors.length > 0, 'it is invalid');
  assert.equal(p.podSelector?.key, compilePolicy({ namespace, name: 'p', uid: 'u', generation: 1, spec: { podSelector: { matchLabels: { app: 'db' } } } }).podSelector?.key);
  assert.deepEqual([p.ingress, p.egress], [[], []], 'isolated both ways, nothing allowed');
}

test('a NetworkPolicy whose metadata cannot be read still isolates what it selects, allows nothing, and reports the field as a policy error', async (t) => {
  const cases: { name: string; metadata: string; error: PolicyError }[] = [
    {
      name: 'a label value written as an unquoted number',
      metadata: 'metadata:\n  name: p\n  namespace: x\n  labels: {version: 2}\n',
      error: { path: 'metadata.labels.version', message: 'must be a string, got the number 2 (quote it in YAML)' },
    },
    { name: 'labels written as a list', metadata: 'metadata: {name: p, namespace: x, labels: [a]}\n', error: { path: 'metadata.labels', message: 'must be an object, got a list' } },
    {
      name: 'an annotation that is a list',
      metadata: 'metadata: {name: p, namespace: x, annotations: {note: [a]}}\n',
      error: { path: 'metadata.annotations.note', message: 'must be a string, got a list' },
    },
    { name: 'a generation of 0', metadata: 'metadata: {name: p, namespace: x, generation: 0}\n', error: { path: 'metadata.generation', message: 'must be a positive integer, got the number 0' } },
    { name: 'a name written as a number', metadata: 'metadata: {name: 12, namespace: x}\n', error: { path: 'metadata.name', message: 'must be a string, got the number 12 (quote it in YAML)' } },
    { name: 'no name', metadata: 'metadata: {namespace: x}\n', error: { path: 'metadata.name', message: 'is missing' } },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const r = load('/m/p.yaml', `apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n${c.metadata}${OPEN_SPEC}`);
      assertFailsClosed(r, 'x');
      // The model's error is the field itself, not a stand-in spec field.
      assert.deepEqual(compiledPolicies(r)[0].errors, [c.error]);
      const warns = r.problems.filter((p) => p.level === 'warn').map((p) => p.message);
      const line = `${c.error.path}: ${c.error.message}`;
      assert.ok(
        warns.some((m) => m.startsWith('/m/p.yaml: document 1: NetworkPolicy x/') && m.includes(line)),
        `${line} not in\n${warns.join('\n')}`,
      );
    });
  }
});

test('a NetworkPolicy of another apiVersion still isolates what it selects, allows nothing, and reports apiVersion as a policy error', async (t) => {
  for (const apiVersion of ['networking.k8s.io/v2', 'networking.k8s.io/v1beta1', 'extensions/v1beta1', 'crd.projectcalico.org/v1', null]) {
    await t.test(String(apiVersion), () => {
      const head = apiVersion === null ? '' : `apiVersion: ${apiVersion}\n`;
      const r = load('/m/p.yaml', `${head}kind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n${OPEN_SPEC}`);
      assertFailsClosed(r, 'x');
      const error = { path: 'apiVersion', message: apiVersion === null ? 'is missing (expected networking.k8s.io/v1)' : `"${apiVersion}" is not networking.k8s.io/v1` };
      assert.deepEqual(compiledPolicies(r)[0].errors, [error]);
      const warns = r.problems.filter((p) => p.level === 'warn').map((p) => p.message);
      assert.ok(
        warns.some((m) => m.startsWith('/m/p.yaml: document 1: NetworkPolicy x/p: ') && m.includes(`${error.path}: ${error.message}`)),
        warns.join('\n'),
      );
    });
  }
});

test('the warning about a NetworkPolicy with many unreadable labels lists as many as its status would, and counts the rest', () => {
  const labels = Array.from({ length: 150 }, (_, i) => `    l${String(i).padStart(3, '0')}: ${i}\n`).join('');
  const r = load('/m/p.yaml', `apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: p\n  namespace: x\n  labels:\n${labels}${OPEN_SPEC}`);
  assertFailsClosed(r, 'x');
  const warns = r.problems.filter((p) => p.level === 'warn').map((p) => p.message);
  assert.equal(warns.length, 1);
  assert.equal((warns[0].match(/must be a string/g) ?? []).length, 100);
  assert.ok(warns[0].includes('metadata.labels.l099: must be a string, got the number 99 (quote it in YAML); metadata: 50 more errors not listed (at most 100 are); kept as invalid'), warns[0]);
  assert.deepEqual(compiledPolicies(r)[0].errors.at(-1), { path: 'metadata', message: '50 more errors not listed (at most 100 are)' });
});

/** What the model makes of the ClusterNetworkPolicies a file yields. */
function compiledClusterPolicies(r: ReturnType<typeof load>): CompiledClusterNetworkPolicy[] {
  return upserts(r).flatMap((u) => (u.kind === 'ClusterNetworkPolicy' ? [compileClusterNetworkPolicy(u.object)] : []));
}

// Admin, priority 3, tenant=a's pods; valid, it would accept everything both ways.
const CNP_SPEC = `spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {matchLabels: {tenant: a}}}
  ingress: [{action: Accept, from: [{namespaces: {}}]}]
  egress: [{action: Accept, to: [{namespaces: {}}]}]
`;

test('a ClusterNetworkPolicy whose apiVersion or metadata cannot be read is kept invalid: it denies its subjects both ways, and the file warning says so', async (t) => {
  const cases: { name: string; head: string; policyName: string; error: PolicyError }[] = [
    {
      name: 'the group version of the older AdminNetworkPolicy',
      head: 'apiVersion: policy.networking.k8s.io/v1alpha1\nkind: ClusterNetworkPolicy\nmetadata: {name: tenants}\n',
      policyName: 'tenants',
      error: { path: 'apiVersion', message: '"policy.networking.k8s.io/v1alpha1" is not policy.networking.k8s.io/v1beta1 or policy.networking.k8s.io/v1alpha2' },
    },
    {
      name: 'no apiVersion',
      head: 'kind: ClusterNetworkPolicy\nmetadata: {name: tenants}\n',
      policyName: 'tenants',
      error: { path: 'apiVersion', message: 'is missing (expected policy.networking.k8s.io/v1beta1 or policy.networking.k8s.io/v1alpha2)' },
    },
    {
      name: 'a name written as a number: a stand-in name',
      head: 'apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: 12}\n',
      policyName: '(unreadable metadata: p.yaml document 1)',
      error: { path: 'metadata.name', message: 'must be a string, got the number 12 (quote it in YAML)' },
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const r = load('/m/p.yaml', `${c.head}${CNP_SPEC}`);
      const [p, ...more] = compiledClusterPolicies(r);
      assert.deepEqual(more, []);
      assert.equal(p.name, c.policyName);
      assert.deepEqual(p.errors, [c.error]);
      assert.deepEqual([p.tier, p.priority, p.subject.key], ['Admin', 3, 'pods|nssel=tenant in (a)|']);
      assert.deepEqual([p.ingress, p.egress], [[FAIL_CLOSED_CNP_RULE], [FAIL_CLOSED_CNP_RULE]], 'both directions deny');
      const warns = r.problems.filter((w) => w.level === 'warn').map((w) => w.message);
      assert.deepEqual(warns, [
        `/m/p.yaml: document 1: ClusterNetworkPolicy ${c.policyName}: ${c.error.path}: ${c.error.message}; kept as invalid: it denies all traffic of the pods it selects in each direction it has rules for, at its tier and priority`,
      ]);
    });
  }
});
