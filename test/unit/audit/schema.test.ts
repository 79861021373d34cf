// The audit line's JSON Schema, as docs/design/audit.md prints it: every kind of line the
// pipeline writes passes it, so do the examples of the docs, and lines that break it do not.
// The schema is read from the doc itself, so the two cannot drift apart.

import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Registry } from 'prom-client';
import { AUDIT_LINE_VERSION, createAuditLog } from '../../../src/audit/index.ts';
import type { AuditTag } from '../../../src/calc/audit-tags.ts';
import { silentLogger } from '../../../src/log.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { nflogEvent, pod, readLines, testReader, up } from './fixtures.ts';

type Schema = { readonly [k: string]: unknown };

const read = (rel: string) => readFile(new URL(`../../../${rel}`, import.meta.url), 'utf8');
const jsonBlocks = (md: string) => [...md.matchAll(/```json\n([\s\S]*?)```/g)].map((m) => m[1]);

const SCHEMA = JSON.parse(jsonBlocks(await read('docs/design/audit.md')).find((b) => b.includes('"$schema"'))!) as Schema;

/** The JSON Schema keywords the line's schema uses (draft 2020-12); returns what fails, by path. */
function validate(v: unknown, s: Schema, path = '$', root: Schema = s): string[] {
  if (typeof s.$ref === 'string') return validate(v, (root.$defs as Record<string, Schema>)[s.$ref.replace('#/$defs/', '')], path, root);
  const errs: string[] = [];
  const typeOf = (x: unknown) => (x === null ? 'null' : Array.isArray(x) ? 'array' : Number.isInteger(x) ? 'integer' : typeof x);
  if (s.type !== undefined) {
    const types = ([] as string[]).concat(s.type as string | string[]);
    if (!types.includes(typeOf(v)) && !(types.includes('number') && typeof v === 'number')) return [`${path}: ${JSON.stringify(v)} is not ${types.join(' or ')}`];
  }
  if ('const' in s && JSON.stringify(v) !== JSON.stringify(s.const)) errs.push(`${path}: not ${JSON.stringify(s.const)}`);
  if (s.enum !== undefined && !(s.enum as unknown[]).includes(v)) errs.push(`${path}: ${JSON.stringify(v)} not one of ${JSON.stringify(s.enum)}`);
  if (typeof v === 'string') {
    if (typeof s.minLength === 'number' && v.length < s.minLength) errs.push(`${path}: shorter than ${s.minLength}`);
    if (typeof s.pattern === 'string' && !new RegExp(s.pattern, 'u').test(v)) errs.push(`${path}: does not match ${s.pattern}`);
  }
  if (typeof v === 'number') {
    if (typeof s.minimum === 'number' && v < s.minimum) errs.push(`${path}: below ${s.minimum}`);
    if (typeof s.maximum === 'number' && v > s.maximum) errs.push(`${path}: above ${s.maximum}`);
  }
  if (Array.isArray(v) && s.items !== undefined) for (const [i, x] of v.entries()) errs.push(...validate(x, s.items as Schema, `${path}[${i}]`, root));
  if (typeOf(v) === 'object') {
    const o = v as Record<string, unknown>;
    const props = (s.properties ?? {}) as Record<string, Schema>;
    for (const k of (s.required ?? []) as string[]) if (!(k in o)) errs.push(`${path}.${k}: missing`);
    for (const [k, x] of Object.entries(o)) {
      if (props[k] !== undefined) errs.push(...validate(x, props[k], `${path}.${k}`, root));
      else if (s.additionalProperties === false) errs.push(`${path}.${k}: not in the schema`);
    }
  }
  if (s.oneOf !== undefined) {
    const passing = (s.oneOf as Schema[]).filter((x) => validate(v, x, path, root).length === 0).length;
    if (passing !== 1) errs.push(`${path}: passes ${passing} of oneOf, not exactly 1`);
  }
  if (s.anyOf !== undefined && !(s.anyOf as Schema[]).some((x) => validate(v, x, path, root).length === 0)) errs.push(`${path}: passes none of anyOf`);
  if (s.not !== undefined && validate(v, s.not as Schema, path, root).length === 0) errs.push(`${path}: passes what it must not`);
  if (s.if !== undefined) {
    const branch = validate(v, s.if as Schema, path, root).length === 0 ? s.then : s.else;
    if (branch !== undefined) errs.push(...validate(v, branch as Schema, path, root));
  }
  return errs;
}

const dir = await mkdtemp(join(tmpdir(), 'weir-audit-schema-'));
after(() => rm(dir, { recursive: true, force: true }));

const TAGS: Record<string, AuditTag> = {
  np: { verdict: 'allow', direction: 'ingress', policy: { namespace: 'shop', name: 'web', rule: 1 } },
  cnp: { verdict: 'deny', direction: 'egress', policy: { kind: 'ClusterNetworkPolicy', name: 'db-only', tier: 'Admin', rule: 0 } },
  cnpInvalid: { verdict: 'deny', direction: 'ingress', policy: { kind: 'ClusterNetworkPolicy', name: 'broken', tier: 'Baseline', rule: -1 } },
  isolated: { verdict: 'deny', direction: 'egress', policy: null, reason: 'default-deny', isolatedBy: [{ namespace: 'shop', name: 'lockdown' }] },
  audited: { verdict: 'would-deny', direction: 'ingress', policy: null, reason: 'default-deny', isolatedBy: [] },
};

/** Every kind of line: each tag's first line, written at once, and a folded line; IPv6 and ICMP too. */
async function writtenLines(): Promise<unknown[]> {
  const r = testReader();
  const clock = new FakeClock(1_000_000);
  const file = join(dir, 'audit.log');
  const audit = createAuditLog({
    config: { node: 'node-a', nflogGroup: 77, rate: 1000, file, maxSize: 1 << 20, maxFiles: 1, stdout: false },
    catalog: { lookup: (p) => TAGS[p] },
    registry: new Registry(),
    log: silentLogger(),
    clock,
    reader: r.reader,
  });
  audit.applyModel([up(pod('shop', 'client', ['10.244.1.2', 'fd00:10:244:1::2']))]);
  await audit.start();
  r.emit(Object.keys(TAGS).map((prefix) => nflogEvent({ prefix })));
  r.emit([
    nflogEvent({ prefix: 'np', srcPort: 40002 }),
    nflogEvent({ prefix: 'isolated', family: 6, protocol: 'ICMPv6', srcIp: 'fd00:10:244:1::2', srcPort: null, dstIp: '2001:db8::9', dstPort: null }),
  ]);
  clock.advance(1000);
  await audit.stop();
  return readLines(file);
}

test('every kind of line the pipeline writes passes the schema of docs/design/audit.md, and carries its version', async () => {
  const lines = await writtenLines();
  assert.equal(lines.length, 7, 'five first lines, an ICMPv6 first line and a folded line');
  for (const line of lines) assert.deepEqual(validate(line, SCHEMA), [], JSON.stringify(line));
  assert.deepEqual((SCHEMA.properties as Record<string, Schema>).version, { const: AUDIT_LINE_VERSION });
  assert.ok(lines.every((l) => (l as { version: number }).version === AUDIT_LINE_VERSION));
});

test('the example lines of the README and of the design doc pass the schema', async () => {
  const examples = [...jsonBlocks(await read('README.md')), ...jsonBlocks(await read('docs/design/audit.md')).filter((b) => !b.includes('"$schema"'))]
    .filter((b) => b.includes('"verdict"'))
    // The design doc's example is one line wrapped for reading.
    .flatMap((b) => (b.trimStart().startsWith('{"version"') && !b.includes('}\n{') ? [b.replace(/\n\s*/g, '')] : b.split('\n')))
    .filter((l) => l.trim() !== '');
  assert.ok(examples.length >= 3, `found ${examples.length} example lines`);
  for (const l of examples) assert.deepEqual(validate(JSON.parse(l), SCHEMA), [], l);
});

test('lines that break the schema fail it: no version or another, an unknown field, a reason beside a policy, a port out of range', async () => {
  const [line] = (await writtenLines()) as Record<string, unknown>[];
  const { version: _, ...unversioned } = line;
  const broken: [string, unknown][] = [
    ['no version', unversioned],
    ['another version', { ...line, version: 2 }],
    ['an unknown field', { ...line, extra: true }],
    ['a reason beside a policy', { ...line, reason: 'default-deny' }],
    ['no policy and no reason', { ...line, policy: null }],
    ['a port out of range', { ...line, dst: { ...(line.dst as object), port: 70_000 } }],
    ['a count of 0', { ...line, count: 0 }],
    ['a time without milliseconds', { ...line, time: '2026-11-24T06:44:19Z' }],
  ];
  for (const [what, l] of broken) assert.notDeepEqual(validate(l, SCHEMA), [], what);
});
