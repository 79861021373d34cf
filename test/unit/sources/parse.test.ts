import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ManifestObjectError, ManifestParseError } from '../../../src/errors.ts';
import { extractObjects, parseManifest } from '../../../src/sources/manifests/parse.ts';
import { objectRef } from '../../../src/sources/manifests/view.ts';

const load = (file: string, text: string) => extractObjects(file, parseManifest(file, text));

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
      name: 'a JSON List with a byte-order mark',
      file: 'd.json',
      text: '\uFEFF{"kind":"List","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"j"}}]}',
      expected: ['Namespace j'],
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      const r = load(c.file, c.text);
      assert.deepEqual(r.upserts.map(objectRef), c.expected);
      assert.deepEqual(r.problems.filter((p) => p.level === 'warn'), []);
    });
  }
});

test('other kinds and other API groups are ignored at debug level', () => {
  const r = load(
    'x.yaml',
    `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: crd.projectcalico.org/v1
kind: NetworkPolicy
metadata: {name: calico}
`,
  );
  assert.deepEqual(r.upserts, []);
  assert.deepEqual(r.problems.map((p) => p.level), ['debug', 'debug']);
  assert.match(r.problems[1].message, /crd\.projectcalico\.org\/v1 NetworkPolicy is not used by Weir/);
});

test('an unusable object is reported with file and position and skipped; its siblings stay', () => {
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
- just a list
`,
  );
  assert.deepEqual(r.upserts.map(objectRef), ['Pod default/good']);
  const warns = r.problems.filter((p) => p.level === 'warn');
  assert.equal(warns.length, 3);
  assert.ok(warns[0].error instanceof ManifestObjectError);
  assert.equal(warns[0].error.file, '/m/bad.yaml');
  assert.equal(warns[0].error.objectRef, 'document 2');
  assert.match(warns[0].message, /^\/m\/bad\.yaml: document 2: Pod \(unnamed\): metadata\.name is missing; skipped$/);
  assert.match(warns[1].message, /document 3: Namespace has no apiVersion \(expected v1\)/);
  assert.match(warns[2].message, /document 4 is not a Kubernetes object/);
});

test('conversion warnings name the file and document', () => {
  const r = load('/m/ips.yaml', `apiVersion: v1
kind: Pod
metadata: {name: p}
status: {podIP: not-an-ip}
`);
  assert.equal(r.upserts.length, 1);
  assert.deepEqual(r.problems.map((p) => p.message), ['/m/ips.yaml: document 1: Pod default/p: status.podIP "not-an-ip" is not an IP address; ignored']);
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
