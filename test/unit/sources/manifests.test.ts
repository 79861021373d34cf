import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rename, rm, symlink, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { ConfigError } from '../../../src/errors.ts';
import type { Logger } from '../../../src/log.ts';
import { createManifestSource, manifestRevision } from '../../../src/sources/index.ts';
import type { Source, SourceBatch } from '../../../src/sources/index.ts';
import type { ModelEvent } from '../../../src/model/types.ts';
import { isPeerEligible, isPoliced } from '../../../src/model/cluster.ts';
import { compilePolicy } from '../../../src/model/policy.ts';

interface LogLine {
  level: number;
  msg: string;
}
const WARN = 40;

function captureLogger(): { log: Logger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as LogLine) });
  return { log, lines };
}

const dirs: string[] = [];
after(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

async function tmpDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'weir-manifests-'));
  dirs.push(d);
  return d;
}

/** A started source on `dir`, recording every batch and log line. */
async function started(dir: string, options: Omit<Parameters<typeof createManifestSource>[0], 'dir' | 'log'>) {
  const { log, lines } = captureLogger();
  const batches: SourceBatch[] = [];
  const source: Source = createManifestSource({ dir, log, ...options });
  await source.start((b) => batches.push(b));
  return { lines, batches, source };
}

/** A started source in a fresh directory, recording every batch and log line. */
async function harness(files: Record<string, string> = {}) {
  const dir = await tmpDir();
  for (const [name, text] of Object.entries(files)) await writeFile(join(dir, name), text);
  const { lines, batches, source } = await started(dir, { debounceMs: 20 });
  return {
    dir,
    lines,
    batches,
    source,
    warnings: () => lines.filter((l) => l.level >= WARN).map((l) => l.msg),
    /** Waits for the batch after `count` batches seen so far. */
    async nextBatch(count: number, timeoutMs = 5000): Promise<SourceBatch> {
      await until(() => batches.length > count, timeoutMs, 'no batch arrived');
      return batches[count];
    },
    /** The revision computed independently from what is on disk now. */
    async diskRevision(): Promise<string> {
      const names = (await readdir(dir)).filter((n) => /\.(ya?ml|json)$/.test(n) && !n.startsWith('.'));
      return manifestRevision(await Promise.all(names.map(async (name) => ({ name, content: await readFile(join(dir, name), 'utf8') }))));
    },
  };
}

async function until(cond: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function podYaml(name: string, labels: Record<string, string> = {}, namespace = 'default'): string {
  const l = Object.entries(labels)
    .map(([k, v]) => `    ${k}: "${v}"`)
    .join('\n');
  return `apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  namespace: ${namespace}
  labels:
${l || '    {}'}
spec:
  nodeName: node-a
status:
  phase: Running
  podIPs:
    - ip: 10.244.1.${name.length}
`.replace('labels:\n    {}', 'labels: {}');
}

function nsYaml(name: string): string {
  return `apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ${name}\n`;
}

const summary = (events: readonly ModelEvent[]) =>
  events.map((e) => {
    if (e.op === 'delete') return `delete ${e.kind} ${'uid' in e ? e.uid : 'namespace' in e ? `${e.namespace}/${e.name}` : e.name}`;
    return `upsert ${e.kind} ${'namespace' in e.object ? `${e.object.namespace}/${e.object.name}` : e.object.name}`;
  });

test('the first batch is the full, synced state, even for an empty directory', async () => {
  const empty = await harness();
  try {
    assert.equal(empty.batches.length, 1);
    assert.deepEqual(empty.batches[0], { events: [], synced: true, revision: manifestRevision([]) });
  } finally {
    await empty.source.stop();
  }

  const h = await harness({
    'a.yaml': `${nsYaml('one')}---\n${podYaml('web', { app: 'web' }, 'one')}`,
    'b.json': JSON.stringify({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-a' }, spec: { podCIDR: '10.244.1.0/24' } }),
    'notes.txt': nsYaml('ignored'),
  });
  try {
    assert.equal(h.batches.length, 1);
    const [first] = h.batches;
    assert.equal(first.synced, true);
    assert.deepEqual(summary(first.events), ['upsert Namespace one', 'upsert Node node-a', 'upsert Pod one/web']);
    assert.equal(first.revision, await h.diskRevision());
    assert.deepEqual(h.warnings(), []);
  } finally {
    await h.source.stop();
  }
});

test('a label change yields exactly one Pod upsert', async () => {
  const h = await harness({ 'pods.yaml': `${podYaml('a', { app: 'x' })}---\n${podYaml('b', { app: 'x' })}` });
  try {
    await writeFile(join(h.dir, 'pods.yaml'), `${podYaml('a', { app: 'x' })}---\n${podYaml('b', { app: 'y' })}`);
    const b = await h.nextBatch(1);
    assert.equal(b.events.length, 1);
    const [e] = b.events;
    assert.ok(e.kind === 'Pod' && e.op === 'upsert');
    assert.deepEqual([e.object.uid, e.object.labels], ['default/b', { app: 'y' }]);
    assert.equal(b.revision, await h.diskRevision());
  } finally {
    await h.source.stop();
  }
});

test('a change that leaves the model unchanged brings only a new revision', async () => {
  const h = await harness({ 'ns.yaml': nsYaml('one') });
  try {
    await writeFile(join(h.dir, 'ns.yaml'), `# a comment\n${nsYaml('one')}`);
    const b = await h.nextBatch(1);
    assert.deepEqual(b.events, []);
    assert.notEqual(b.revision, h.batches[0].revision);
    assert.equal(b.revision, await h.diskRevision());
  } finally {
    await h.source.stop();
  }
});

test('a file that breaks keeps its last good content; fixing it applies the new content', async () => {
  const good = nsYaml('one');
  const h = await harness({ 'ns.yaml': good });
  try {
    const goodRevision = h.batches[0].revision;
    await writeFile(join(h.dir, 'ns.yaml'), `${good}---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: two\n   oops: 1\n`);
    await until(() => h.warnings().length > 0, 5000, 'no warning for the broken file');
    const [warning] = h.warnings();
    assert.ok(warning.includes(`${join(h.dir, 'ns.yaml')}:10:`), warning);
    assert.match(warning, /keeping its last good content/);
    await sleep(100);
    assert.equal(h.batches.length, 1, 'a broken file changes nothing');

    // Another file changes meanwhile: the revision still counts the broken file's good content.
    await writeFile(join(h.dir, 'other.yaml'), nsYaml('three'));
    const b1 = await h.nextBatch(1);
    assert.deepEqual(summary(b1.events), ['upsert Namespace three']);
    assert.notEqual(b1.revision, goodRevision);
    assert.equal(
      b1.revision,
      manifestRevision([
        { name: 'ns.yaml', content: good },
        { name: 'other.yaml', content: nsYaml('three') },
      ]),
    );

    await writeFile(join(h.dir, 'ns.yaml'), nsYaml('two'));
    const b2 = await h.nextBatch(2);
    assert.deepEqual(summary(b2.events), ['delete Namespace one', 'upsert Namespace two']);
    assert.equal(b2.revision, await h.diskRevision());
    assert.equal(h.warnings().length, 1, 'the broken content was reported once');
  } finally {
    await h.source.stop();
  }
});

test('a JSON file that breaks is reported with its line', async () => {
  const h = await harness({ 'n.json': JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'j' } }, null, 2) });
  try {
    await writeFile(join(h.dir, 'n.json'), '{\n  "apiVersion": "v1",\n  "kind": "Namespace",\n  "metadata": {"name": "j"},\n}\n');
    await until(() => h.warnings().length > 0, 5000, 'no warning for the broken JSON');
    assert.ok(h.warnings()[0].includes(`${join(h.dir, 'n.json')}:5:`), h.warnings()[0]);
  } finally {
    await h.source.stop();
  }
});

test('deleting or emptying a file deletes its objects', async () => {
  const h = await harness({ 'a.yaml': `${nsYaml('one')}---\n${podYaml('p', {}, 'one')}`, 'b.yaml': nsYaml('two') });
  try {
    await unlink(join(h.dir, 'a.yaml'));
    const b = await h.nextBatch(1);
    assert.deepEqual(summary(b.events), ['delete Pod one/p', 'delete Namespace one']);
    assert.equal(b.revision, manifestRevision([{ name: 'b.yaml', content: nsYaml('two') }]));

    // Emptying a file is a delete too (once the empty content holds).
    await writeFile(join(h.dir, 'b.yaml'), '');
    const b2 = await h.nextBatch(2);
    assert.deepEqual(summary(b2.events), ['delete Namespace two']);
    assert.equal(b2.revision, await h.diskRevision());
  } finally {
    await h.source.stop();
  }
});

test('a ClusterNetworkPolicy file is delivered after the NetworkPolicies of its batch, its edit as an upsert, its removal as a delete by name', async () => {
  const cnp = (priority: number) =>
    `apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: tenants}\nspec: {tier: Admin, priority: ${priority}, subject: {namespaces: {}}}\n`;
  const np = 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np, namespace: one}\nspec: {podSelector: {}}\n';
  const h = await harness({ 'a.yaml': cnp(5), 'b.yaml': `${nsYaml('one')}---\n${np}` });
  try {
    const [first] = h.batches;
    assert.deepEqual(summary(first.events), ['upsert Namespace one', 'upsert NetworkPolicy one/np', 'upsert ClusterNetworkPolicy tenants']);
    assert.deepEqual(first.events[2], {
      kind: 'ClusterNetworkPolicy',
      op: 'upsert',
      object: { name: 'tenants', uid: 'tenants', generation: 1, spec: { tier: 'Admin', priority: 5, subject: { namespaces: {} } } },
    });
    await writeFile(join(h.dir, 'a.yaml'), cnp(6));
    assert.deepEqual(summary((await h.nextBatch(1)).events), ['upsert ClusterNetworkPolicy tenants']);
    await unlink(join(h.dir, 'a.yaml'));
    assert.deepEqual((await h.nextBatch(2)).events, [{ kind: 'ClusterNetworkPolicy', op: 'delete', name: 'tenants' }]);
    assert.deepEqual(h.warnings(), []);
  } finally {
    await h.source.stop();
  }
});

test('the same object in two files: the file that sorts last wins and a warning names both', async () => {
  const h = await harness({ '10-a.yaml': podYaml('web', { from: 'a' }), '20-b.yaml': podYaml('web', { from: 'b' }) });
  try {
    const [e] = h.batches[0].events;
    assert.ok(e.kind === 'Pod' && e.op === 'upsert');
    assert.deepEqual(e.object.labels, { from: 'b' });
    assert.equal(h.warnings().length, 1);
    assert.ok(h.warnings()[0].includes(join(h.dir, '10-a.yaml')) && h.warnings()[0].includes(join(h.dir, '20-b.yaml')), h.warnings()[0]);

    // Without the winner, the other definition applies again.
    await unlink(join(h.dir, '20-b.yaml'));
    const b = await h.nextBatch(1);
    assert.equal(b.events.length, 1);
    const [again] = b.events;
    assert.ok(again.kind === 'Pod' && again.op === 'upsert');
    assert.deepEqual(again.object.labels, { from: 'a' });
  } finally {
    await h.source.stop();
  }
});

test('an editor-style atomic save (write a temp file, rename over) is picked up', async () => {
  const h = await harness({ 'ns.yaml': nsYaml('one') });
  try {
    const tmp = join(h.dir, '.ns.yaml.swp');
    await writeFile(tmp, nsYaml('renamed'));
    await rename(tmp, join(h.dir, 'ns.yaml'));
    const b = await h.nextBatch(1);
    assert.deepEqual(summary(b.events), ['delete Namespace one', 'upsert Namespace renamed']);
    assert.equal(b.revision, await h.diskRevision());

    // A file renamed away from a manifest name is a delete.
    await rename(join(h.dir, 'ns.yaml'), join(h.dir, 'ns.yaml.bak'));
    const b2 = await h.nextBatch(2);
    assert.deepEqual(summary(b2.events), ['delete Namespace renamed']);
  } finally {
    await h.source.stop();
  }
});

test('a new file is delivered well within 200 ms', async (t) => {
  const h = await harness();
  try {
    const started = performance.now();
    await writeFile(join(h.dir, 'ns.yaml'), nsYaml('fast'));
    const b = await h.nextBatch(1);
    const ms = performance.now() - started;
    t.diagnostic(`change delivered in ${ms.toFixed(1)} ms`);
    assert.deepEqual(summary(b.events), ['upsert Namespace fast']);
    assert.ok(ms < 2000, `took ${ms} ms`);
  } finally {
    await h.source.stop();
  }
});

test('a burst of writes is gathered into few batches that end in the final state', async () => {
  const h = await harness();
  try {
    await Promise.all(Array.from({ length: 10 }, (_, i) => writeFile(join(h.dir, `ns${i}.yaml`), nsYaml(`n${i}`))));
    await until(() => h.batches.reduce((n, b) => n + b.events.length, 0) >= 10, 5000, 'not all namespaces arrived');
    await sleep(100);
    const all = h.batches.slice(1).flatMap((b) => summary(b.events));
    assert.deepEqual(all.sort(), Array.from({ length: 10 }, (_, i) => `upsert Namespace n${i}`).sort());
    assert.ok(h.batches.length - 1 < 10, `expected coalescing, got ${h.batches.length - 1} batches`);
    assert.equal(h.batches.at(-1)?.revision, await h.diskRevision());
  } finally {
    await h.source.stop();
  }
});

test('after stop() no more batches arrive', async () => {
  const h = await harness({ 'ns.yaml': nsYaml('one') });
  await h.source.stop();
  await writeFile(join(h.dir, 'ns.yaml'), nsYaml('two'));
  await sleep(150);
  assert.equal(h.batches.length, 1);
});

test('a path that is not a directory is a configuration error', async () => {
  const file = join(await tmpDir(), 'file.yaml');
  await writeFile(file, nsYaml('one'));
  const source = createManifestSource({ dir: file, log: captureLogger().log });
  await assert.rejects(
    source.start(() => {}),
    (err: unknown) => {
      assert.ok(err instanceof ConfigError);
      assert.equal(err.code, 'WEIR_CONFIG_INVALID');
      assert.match(err.message, /file\.yaml is not a directory/);
      return true;
    },
  );
});

test('a directory missing at start delivers nothing until it can be read, then the full state', async () => {
  const dir = join(await tmpDir(), 'later');
  const { lines, batches, source } = await started(dir, { pollMs: 50 });
  try {
    await sleep(300);
    assert.equal(batches.length, 0, 'no batch, synced or not, before a real read');
    const failures = lines.filter((l) => l.level >= WARN && l.msg.includes(dir));
    assert.equal(failures.length, 1, 'said once, with the path');
    assert.match(failures[0].msg, /no such file or directory/);

    await mkdir(dir);
    await writeFile(join(dir, 'a.yaml'), `${nsYaml('one')}---\n${podYaml('web', { app: 'web' }, 'one')}`);
    await until(() => batches.length > 0, 5000, 'no batch once the directory exists');
    assert.equal(batches[0].synced, true);
    assert.deepEqual(summary(batches[0].events), ['upsert Namespace one', 'upsert Pod one/web']);
    assert.equal(batches[0].revision, manifestRevision([{ name: 'a.yaml', content: await readFile(join(dir, 'a.yaml'), 'utf8') }]));
  } finally {
    await source.stop();
  }
});

test('a manifest that cannot be read at the first pass holds the first batch until it can', async () => {
  const dir = await tmpDir();
  await writeFile(join(dir, 'a.yaml'), nsYaml('one'));
  // A symlink to itself: listed, but every stat or read fails with ELOOP.
  await symlink('b.yaml', join(dir, 'b.yaml'));
  const { lines, batches, source } = await started(dir, { pollMs: 50 });
  try {
    await sleep(300);
    assert.equal(batches.length, 0, 'no batch without b.yaml');
    assert.ok(
      lines.some((l) => l.level >= WARN && l.msg.includes(join(dir, 'b.yaml'))),
      'the unreadable file is named',
    );

    await unlink(join(dir, 'b.yaml'));
    await writeFile(join(dir, 'b.yaml'), nsYaml('two'));
    await until(() => batches.length > 0, 5000, 'no batch once b.yaml reads');
    assert.deepEqual(summary(batches[0].events), ['upsert Namespace one', 'upsert Namespace two']);
  } finally {
    await source.stop();
  }
});

test('after the first batch, a directory that cannot be listed keeps the last state', async () => {
  const parent = await tmpDir();
  const dir = join(parent, 'm');
  await mkdir(dir);
  await writeFile(join(dir, 'a.yaml'), nsYaml('one'));
  const { lines, batches, source } = await started(dir, { pollMs: 50, watch: false });
  try {
    assert.equal(batches.length, 1);
    await rename(dir, join(parent, 'gone'));
    await until(() => lines.some((l) => l.level >= WARN && l.msg.includes(dir)), 5000, 'no warning for the vanished directory');
    await sleep(150);
    assert.equal(batches.length, 1, 'nothing deleted');
    await rename(join(parent, 'gone'), dir);
    await writeFile(join(dir, 'b.yaml'), nsYaml('two'));
    await until(() => batches.length > 1, 5000, 'no batch once the directory is back');
    assert.deepEqual(summary(batches[1].events), ['upsert Namespace two']);
  } finally {
    await source.stop();
  }
});

test('with fs.watch off, the poll alone delivers changes, deletes and new files', async () => {
  const dir = await tmpDir();
  await writeFile(join(dir, 'a.yaml'), nsYaml('one'));
  const { batches, source } = await started(dir, { pollMs: 50, watch: false });
  try {
    await writeFile(join(dir, 'a.yaml'), nsYaml('two'));
    await until(() => batches.length > 1, 5000, 'no batch for the rewrite');
    assert.deepEqual(summary(batches[1].events), ['delete Namespace one', 'upsert Namespace two']);
    await unlink(join(dir, 'a.yaml'));
    await writeFile(join(dir, 'b.yaml'), nsYaml('three'));
    await until(() => batches.flatMap((b) => b.events).length >= 4, 5000, 'no batch for the delete and the new file');
    assert.deepEqual(summary(batches.slice(2).flatMap((b) => b.events)), ['delete Namespace two', 'upsert Namespace three']);
  } finally {
    await source.stop();
  }
});

test('a policy whose namespace cannot be read stands, invalid at metadata.namespace, in every namespace Weir knows of', async () => {
  const h = await harness({
    'a.yaml': `${nsYaml('one')}---\n${nsYaml('two')}---\n${podYaml('p', {}, 'three')}`,
    'b.yaml': `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: [one]}
spec: {podSelector: {matchLabels: {app: db}}, ingress: [{}]}
`,
  });
  try {
    const policies = h.batches[0].events.flatMap((e) => (e.kind === 'NetworkPolicy' && e.op === 'upsert' ? [compilePolicy(e.object)] : []));
    assert.deepEqual(policies.map((p) => p.namespace).sort(), ['one', 'three', 'two']);
    for (const p of policies) {
      assert.deepEqual(p.errors, [{ path: 'metadata.namespace', message: 'must be a string, got a list' }], `${p.key} is invalid at the field`);
      assert.deepEqual([p.podSelector?.key, p.ingress, p.egress], ['app in (db)', [], null], p.key);
    }
    assert.ok(
      h.warnings().some((m) => m.includes(join(h.dir, 'b.yaml')) && m.includes('metadata.namespace: must be a string, got a list')),
      h.warnings().join('\n'),
    );

    // A namespace that appears later gets its copy too.
    await writeFile(join(h.dir, 'c.yaml'), nsYaml('four'));
    const b = await h.nextBatch(1);
    assert.deepEqual(
      summary(b.events)
        .filter((e) => e.includes('NetworkPolicy'))
        .map((e) => e.split(' ')[2].split('/')[0]),
      ['four'],
    );
  } finally {
    await h.source.stop();
  }
});

test('the pods of a namespace whose labels cannot be read are still policed but no peer of any policy', async () => {
  const broken = `apiVersion: v1\nkind: Namespace\nmetadata:\n  name: one\n  labels: {tier: 1}\n`;
  const h = await harness({ 'a.yaml': `${broken}---\n${podYaml('p', { app: 'web' }, 'one')}---\n${podYaml('q', { app: 'web' }, 'two')}` });
  const podsOf = (events: readonly ModelEvent[]) => new Map(events.flatMap((e) => (e.kind === 'Pod' && e.op === 'upsert' ? [[e.object.uid, e.object] as const] : [])));
  try {
    const pods = podsOf(h.batches[0].events);
    assert.ok(isPoliced(pods.get('one/p')!) && !isPeerEligible(pods.get('one/p')!), 'one/p: policed, no peer');
    assert.ok(isPoliced(pods.get('two/q')!) && isPeerEligible(pods.get('two/q')!), 'two/q is unaffected');
    assert.ok(
      h.warnings().some((m) => m.includes(join(h.dir, 'a.yaml')) && /metadata\.labels\.tier/.test(m)),
      h.warnings().join('\n'),
    );

    // Fixed: the pod is a peer again.
    await writeFile(join(h.dir, 'a.yaml'), `${nsYaml('one')}---\n${podYaml('p', { app: 'web' }, 'one')}---\n${podYaml('q', { app: 'web' }, 'two')}`);
    const b = await h.nextBatch(1);
    assert.ok(isPeerEligible(podsOf(b.events).get('one/p')!), 'one/p is a peer again');
  } finally {
    await h.source.stop();
  }
});
