// The CRDs in crds/ and the bodies the writers send must agree: every field a writer sends is
// declared (a structural schema silently prunes undeclared fields), every value passes the
// schema's checks, and every printer column points at a field the writers fill.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { load } from 'js-yaml';
import { clusterPolicyStatusBody, nodeObjectBody, nodeStatusBody, policyObjectBody, policyStatusBody } from '../../../src/status/bodies.ts';
import { buildClusterPolicyConditions } from '../../../src/status/cluster-policy-status.ts';
import { buildNodeStatus } from '../../../src/status/node-status.ts';
import { buildPolicyStatus } from '../../../src/status/policy-status.ts';

type Schema = {
  type?: string;
  properties?: Record<string, Schema>;
  items?: Schema;
  required?: string[];
  enum?: unknown[];
  pattern?: string;
  maxLength?: number;
  minLength?: number;
  minimum?: number;
  maxItems?: number;
  format?: string;
  'x-kubernetes-list-map-keys'?: string[];
  'x-kubernetes-list-type'?: string;
};
interface Crd {
  metadata: { name: string };
  spec: {
    group: string;
    scope: string;
    names: { kind: string; plural: string; singular: string; listKind: string };
    versions: {
      name: string;
      served: boolean;
      storage: boolean;
      subresources?: { status?: object };
      additionalPrinterColumns: { name: string; type: string; jsonPath: string }[];
      schema: { openAPIV3Schema: Schema };
    }[];
  };
}

const readCrd = (file: string): Crd => load(readFileSync(new URL(`../../../crds/${file}`, import.meta.url), 'utf8')) as Crd;
const nodeCrd = readCrd('weir.dev_nodepolicystatuses.yaml');
const policyCrd = readCrd('weir.dev_networkpolicystatuses.yaml');
/** network-policy-api's, vendored: Weir writes only its status. */
const clusterPolicyCrd = readCrd('policy.networking.k8s.io_clusternetworkpolicies.yaml');

/** The checks of an OpenAPI v3 structural schema that our bodies can hit; returns the errors. */
function validate(value: unknown, s: Schema, path: string = ''): string[] {
  const errs: string[] = [];
  const t = s.type;
  if (t === 'object') {
    if (typeof value !== 'object' || value === null || Array.isArray(value)) return [`${path}: not an object`];
    const o = value as Record<string, unknown>;
    for (const r of s.required ?? []) if (!(r in o)) errs.push(`${path}.${r}: required`);
    if (s.properties) {
      for (const [k, v] of Object.entries(o)) {
        const sub = s.properties[k];
        if (sub === undefined) errs.push(`${path}.${k}: not in the schema (would be pruned)`);
        else errs.push(...validate(v, sub, `${path}.${k}`));
      }
    }
  } else if (t === 'array') {
    if (!Array.isArray(value)) return [`${path}: not an array`];
    if (s.maxItems !== undefined && value.length > s.maxItems) errs.push(`${path}: more than ${s.maxItems} items`);
    value.forEach((v, i) => {
      errs.push(...validate(v, s.items!, `${path}[${i}]`));
    });
    const keys = s['x-kubernetes-list-map-keys'];
    if (keys) {
      const seen = value.map((v) => JSON.stringify(keys.map((k) => (v as Record<string, unknown>)[k])));
      if (new Set(seen).size !== seen.length) errs.push(`${path}: duplicate map keys`);
    }
    if (s['x-kubernetes-list-type'] === 'set' && new Set(value.map((v) => JSON.stringify(v))).size !== value.length) errs.push(`${path}: duplicate set items`);
  } else if (t === 'string') {
    if (typeof value !== 'string') return [`${path}: not a string`];
    if (s.maxLength !== undefined && value.length > s.maxLength) errs.push(`${path}: longer than ${s.maxLength}`);
    if (s.minLength !== undefined && value.length < s.minLength) errs.push(`${path}: shorter than ${s.minLength}`);
    if (s.pattern !== undefined && !new RegExp(s.pattern).test(value)) errs.push(`${path}: "${value}" does not match ${s.pattern}`);
    if (s.format === 'date-time' && !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/.test(value)) errs.push(`${path}: not a date-time`);
  } else if (t === 'integer') {
    if (!Number.isInteger(value)) return [`${path}: not an integer`];
    if (s.minimum !== undefined && (value as number) < s.minimum) errs.push(`${path}: below ${s.minimum}`);
  }
  if (s.enum && !s.enum.includes(value)) errs.push(`${path}: ${JSON.stringify(value)} not in ${JSON.stringify(s.enum)}`);
  return errs;
}

/** The two JSONPath forms the printer columns use: a.b.c and a.list[?(@.k=="v")].f */
function jsonPath(obj: unknown, p: string): unknown {
  let cur: unknown = obj;
  for (const part of p.replace(/^\./, '').match(/[^.[\]]+|\[\?\(@\.\w+=="[^"]*"\)\]/g) ?? []) {
    const filter = /^\[\?\(@\.(\w+)=="([^"]*)"\)\]$/.exec(part);
    if (filter) cur = (cur as Record<string, unknown>[] | undefined)?.find((x) => x[filter[1]] === filter[2]);
    else cur = (cur as Record<string, unknown> | undefined)?.[part];
  }
  return cur;
}

const T0 = Date.parse('2025-06-01T12:00:00Z');
const nodeStatus = buildNodeStatus(
  {
    synced: true,
    lastApply: { ok: false, message: 'iptables-restore: line 3 failed' },
    lastSyncTime: T0,
    counts: { localPods: 7, policies: 2, sets: 3, chains: 11, rules: 42 },
    policies: [
      { namespace: 'shop', name: 'web', uid: 'u-web', generation: 4 },
      { namespace: 'shop', name: 'bad', uid: 'u-bad', generation: 1, error: 'spec.podSelector: invalid' },
    ],
    problems: [{ reason: 'BrNetfilterDisabled', message: 'net.bridge.bridge-nf-call-iptables is 0' }],
  },
  undefined,
  T0,
);
const policyInput = { namespace: 'shop', name: 'web', uid: 'u-web', generation: 4, accepted: { ok: false, message: 'spec.ingress[0]: x' }, desiredNodes: ['a', 'b'] };
const policyStatus = buildPolicyStatus(policyInput, { desired: 2, realized: 1, pending: ['b'] }, undefined, T0);

describe('CRDs', () => {
  const cases = [
    { crd: nodeCrd, name: 'nodepolicystatuses.weir.dev', kind: 'NodePolicyStatus', plural: 'nodepolicystatuses', scope: 'Cluster' },
    { crd: policyCrd, name: 'networkpolicystatuses.weir.dev', kind: 'NetworkPolicyStatus', plural: 'networkpolicystatuses', scope: 'Namespaced' },
  ];
  for (const c of cases) {
    test(`${c.kind}: weir.dev/v1alpha1, ${c.scope}, with the status subresource`, () => {
      assert.equal(c.crd.metadata.name, c.name);
      assert.equal(c.crd.spec.group, 'weir.dev');
      assert.equal(c.crd.spec.scope, c.scope);
      assert.equal(c.crd.spec.names.kind, c.kind);
      assert.equal(c.crd.spec.names.plural, c.plural);
      assert.equal(c.crd.spec.versions.length, 1);
      const [v] = c.crd.spec.versions;
      assert.deepEqual([v.name, v.served, v.storage], ['v1alpha1', true, true]);
      assert.deepEqual(v.subresources, { status: {} });
    });
  }

  test('NodePolicyStatus accepts exactly what the node reporter sends', () => {
    const schema = nodeCrd.spec.versions[0].schema.openAPIV3Schema;
    assert.deepEqual(validate(nodeObjectBody('node-a', 'uid-1'), schema), []);
    assert.deepEqual(validate(nodeStatusBody('node-a', nodeStatus), schema), []);
  });

  test('NodePolicyStatus accepts the largest status a node can send: every list full, every string at its cap', () => {
    const schema = nodeCrd.spec.versions[0].schema.openAPIV3Schema;
    const failing = Array.from({ length: 500 }, (_, i) => ({
      namespace: 'n'.repeat(63),
      name: `${i}`.padEnd(253, 'x'),
      uid: `${i}`.padEnd(36, '-'),
      generation: 9,
      error: 'e'.repeat(5_000),
    }));
    const input = { synced: true, lastApply: { ok: false, message: 'm'.repeat(100_000) }, lastSyncTime: T0, counts: { localPods: 1, policies: 500, sets: 0, chains: 0, rules: 0 }, policies: failing };
    assert.deepEqual(validate(nodeStatusBody('node-a', buildNodeStatus(input, undefined, T0)), schema), []);
  });

  test('NodePolicyStatus: every list has maxItems and every free string maxLength, so the object is bounded', () => {
    const unbounded: string[] = [];
    const walk = (s: Schema, path: string): void => {
      if (s.type === 'array' && s.maxItems === undefined) unbounded.push(path);
      if (s.type === 'string' && s.maxLength === undefined && s.enum === undefined && s.format !== 'date-time' && !/apiVersion|kind/.test(path)) unbounded.push(path);
      for (const [k, v] of Object.entries(s.properties ?? {})) if (k !== 'metadata') walk(v, `${path}.${k}`);
      if (s.items) walk(s.items, `${path}[]`);
    };
    walk(nodeCrd.spec.versions[0].schema.openAPIV3Schema, '');
    assert.deepEqual(unbounded, []);
  });

  test('NetworkPolicyStatus accepts exactly what the aggregator sends', () => {
    const schema = policyCrd.spec.versions[0].schema.openAPIV3Schema;
    const ref = { namespace: 'shop', name: 'web', uid: 'u-web' };
    assert.deepEqual(validate(policyObjectBody(ref), schema), []);
    assert.deepEqual(validate(policyStatusBody(ref, policyStatus), schema), []);
  });

  test("ClusterNetworkPolicy (v1beta1) accepts the status the aggregator applies: Weir's conditions, the longest message included", () => {
    const v1beta1 = clusterPolicyCrd.spec.versions.find((v) => v.name === 'v1beta1')!;
    assert.deepEqual(v1beta1.subresources, { status: {} });
    const statusSchema = v1beta1.schema.openAPIV3Schema.properties!.status!;
    const input = { name: 'db-only', uid: 'u-cnp', generation: 2, accepted: { ok: false, message: 'e'.repeat(100_000) }, desiredNodes: Array.from({ length: 50 }, (_, i) => `n${i}`) };
    const conditions = buildClusterPolicyConditions(input, { desired: 50, realized: 0, pending: input.desiredNodes }, undefined, T0);
    const body = clusterPolicyStatusBody('db-only', '4711', conditions) as { status: unknown };
    assert.deepEqual(validate(body.status, statusSchema, '.status'), []);
  });

  test('the validator used above does catch bad bodies', () => {
    const schema = nodeCrd.spec.versions[0].schema.openAPIV3Schema;
    const bad = { status: { ...nodeStatus, extra: 1, conditions: [{ ...nodeStatus.conditions[0], reason: 'not camel case' }] } };
    assert.deepEqual(validate(bad, schema), [
      '.status.conditions[0].reason: "not camel case" does not match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$',
      '.status.extra: not in the schema (would be pruned)',
    ]);
  });

  const columns: { name: string; crd: Crd; object: unknown; expected: [string, string, unknown][] }[] = [
    {
      name: 'NodePolicyStatus printer columns: Ready, Programmed, Degraded, Pods, Policies, Rules, Failing, Age',
      crd: nodeCrd,
      object: { ...nodeStatusBody('node-a', nodeStatus), metadata: { name: 'node-a', creationTimestamp: '2025-06-01T11:00:00Z' } },
      expected: [
        ['Ready', 'string', 'False'],
        ['Programmed', 'string', 'False'],
        ['Degraded', 'string', 'True'],
        ['Pods', 'integer', 7],
        ['Policies', 'integer', 2],
        ['Rules', 'integer', 42],
        ['Failing', 'integer', 1],
        ['Age', 'date', '2025-06-01T11:00:00Z'],
      ],
    },
    {
      name: 'NetworkPolicyStatus printer columns: Accepted, Enforced, Mode, Realized, Age',
      crd: policyCrd,
      object: { status: policyStatus, metadata: { creationTimestamp: '2025-06-01T11:00:00Z' } },
      expected: [
        ['Accepted', 'string', 'False'],
        ['Enforced', 'string', 'False'],
        ['Mode', 'string', 'enforce'],
        ['Realized', 'string', '1/2'],
        ['Age', 'date', '2025-06-01T11:00:00Z'],
      ],
    },
  ];
  for (const c of columns) {
    test(c.name, () => {
      const cols = c.crd.spec.versions[0].additionalPrinterColumns;
      assert.deepEqual(
        cols.map((col) => [col.name, col.type, jsonPath(c.object, col.jsonPath)]),
        c.expected,
      );
    });
  }
});
