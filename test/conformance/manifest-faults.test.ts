// Conformance with real packets: manifest mistakes fail closed. A NetworkPolicy whose metadata
// cannot be read, or whose apiVersion is not networking.k8s.io/v1, still isolates the pods it
// selects and allows nothing (in every namespace when its namespace cannot be read); the pods of
// a Namespace that cannot be read gain nothing through a namespaceSelector; and an agent whose
// directory cannot be read at start writes nothing to its node until it can.
// Every predicate is written by hand from docs/semantics (never derived from Weir's code).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmod, cp, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createNs, deleteNs, inNs, uniquePrefix } from '../../src/sim/netns.ts';
import { manifestRevision } from '../../src/sources/index.ts';
import { AgentProcess } from '../support/agent-process.ts';
import { A1, A2, B1, B2, Conformance, G1, np } from './harness.ts';
import { from, ingress, none, self } from './predicates.ts';

/** A raw NetworkPolicy manifest: `metadata` and `apiVersion` lines are written as given. */
function rawPolicy(apiVersion: string, metadata: string[], spec: string[]): string {
  return [`apiVersion: ${apiVersion}`, 'kind: NetworkPolicy', 'metadata:', ...metadata.map((l) => `  ${l}`), 'spec:', ...spec.map((l) => `  ${l}`), ''].join('\n');
}

describe('conformance: manifest mistakes fail closed', () => {
  let c: Conformance;
  const file = '40-raw.yaml';
  before(async () => {
    c = await Conformance.start('wmfl');
  });
  after(async () => {
    await c?.stop();
  });

  test('a policy with a label written as an unquoted number isolates its pods both ways and allows nothing; quoting it applies its rules', async () => {
    await c.reset();
    const spec = [
      'podSelector: {matchLabels: {app: db}}',
      'policyTypes: [Ingress, Egress]',
      'ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]',
      'egress: [{to: [{namespaceSelector: {}}]}]',
    ];
    const policy = (version: string) => rawPolicy('networking.k8s.io/v1', ['name: db', 'namespace: alpha', 'labels:', `  version: ${version}`], spec);
    try {
      await c.writeRaw(file, policy('2'));
      await c.expect((x) => self(x) || (x.source !== A2 && x.target !== A2), 'label version: 2');
      await c.writeRaw(file, policy('"2"'));
      // Egress to every pod of every namespace: all the targets the matrix probes.
      await c.expect(ingress({ [A2]: from(A1) }), 'label version: "2"');
    } finally {
      await c.removeRaw(file);
    }
  });

  test('a NetworkPolicy of apiVersion networking.k8s.io/v2 or v1beta1 isolates its pods and allows nothing; v1 applies its rules', async () => {
    await c.reset();
    const spec = ['podSelector: {matchLabels: {app: web}}', 'ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}}]}]'];
    try {
      await c.writeRaw(file, rawPolicy('networking.k8s.io/v2', ['name: web', 'namespace: beta'], spec));
      await c.expect(ingress({ [B1]: none }), 'v2');
      await c.writeRaw(file, rawPolicy('networking.k8s.io/v1beta1', ['name: web', 'namespace: beta'], spec));
      await c.expect(ingress({ [B1]: none }), 'v1beta1');
      await c.writeRaw(file, rawPolicy('networking.k8s.io/v1', ['name: web', 'namespace: beta'], spec));
      await c.expect(ingress({ [B1]: from(A1, A2) }), 'v1');
    } finally {
      await c.removeRaw(file);
    }
  });

  test('a policy whose namespace cannot be read isolates what it selects in every namespace; a readable one only in its own', async () => {
    await c.reset();
    const spec = ['podSelector: {matchLabels: {app: web}}', 'ingress: [{from: [{podSelector: {}}]}]'];
    try {
      await c.writeRaw(file, rawPolicy('networking.k8s.io/v1', ['name: web', 'namespace: [alpha]'], spec));
      await c.expect(ingress({ [A1]: none, [B1]: none, [G1]: none }), 'namespace: [alpha]');
      await c.writeRaw(file, rawPolicy('networking.k8s.io/v1', ['name: web', 'namespace: alpha'], spec));
      await c.expect(ingress({ [A1]: from(A2) }), 'namespace: alpha');
    } finally {
      await c.removeRaw(file);
    }
  });

  test('the pods of a Namespace whose labels cannot be read gain nothing through selectors, and stay isolated', async () => {
    await c.reset();
    await c.setPolicies(
      // team NotIn [a]: beta (team b) and gamma (no team) match while their labels are known.
      np('alpha', 'not-team-a', {
        podSelector: { matchLabels: { app: 'db' } },
        ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'NotIn', values: ['a'] }] } }] }],
      }),
      np('beta', 'same-namespace', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: {} }] }] }),
    );
    await c.expect(ingress({ [A2]: from(B1, B2, G1), [B1]: from(B2) }), 'beta readable');
    // A later file redefines beta with a label that is a number: that definition wins.
    const nsFile = '50-namespace.yaml';
    try {
      await c.writeRaw(nsFile, ['apiVersion: v1', 'kind: Namespace', 'metadata:', '  name: beta', '  labels:', '    team: 7', ''].join('\n'));
      await c.expect(ingress({ [A2]: from(G1), [B1]: none }), 'beta unreadable');
    } finally {
      await c.removeRaw(nsFile);
    }
    await c.expect(ingress({ [A2]: from(B1, B2, G1), [B1]: from(B2) }), 'beta readable again');
  });
});

const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const EXAMPLES = fileURLToPath(new URL('../../examples/', import.meta.url));
// Root reads any directory; without these two capabilities a mode of 000 stops it, as it would
// stop an agent running as another user. CAP_NET_ADMIN stays, so the agent could write.
const NO_DAC = ['setpriv', '--inh-caps=-dac_override,-dac_read_search', '--bounding-set=-dac_override,-dac_read_search'];

describe('an agent whose manifest directory cannot be read at start', () => {
  const ns = `${uniquePrefix('wmfr')}node`;
  let dir = '';
  const agents: AgentProcess[] = [];
  const children: ReturnType<typeof spawn>[] = [];

  before(async () => {
    await createNs(ns);
    dir = await mkdtemp(join(tmpdir(), 'weir-unreadable-'));
    await cp(EXAMPLES, dir, { recursive: true });
  });
  after(async () => {
    for (const a of agents) await a.stop();
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await deleteNs(ns);
    await chmod(dir, 0o700).catch(() => {});
    await rm(dir, { recursive: true, force: true });
  });

  /** What Weir owns on the node: its chains and rules (mangle, and its filter hook), and its sets. */
  const nodeState = async () => {
    const rules = async (cmd: string) =>
      [await inNs(ns, cmd, ['-t', 'mangle']), await inNs(ns, cmd, ['-t', 'filter'])]
        .join('\n')
        .split('\n')
        .filter((l) => /cali|weir:/.test(l))
        .join('\n');
    return `${await rules('iptables-save')}\n${await rules('ip6tables-save')}\n${await inNs(ns, 'ipset', ['save'])}`;
  };
  const readyz = async () =>
    JSON.parse(await inNs(ns, process.execPath, ['-e', "fetch('http://127.0.0.1:9464/readyz').then(async (r) => console.log(JSON.stringify({ status: r.status, ...(await r.json()) })))"])) as {
      status: number;
      ready: boolean;
      reason: string;
      revision: string;
    };
  const revisionOf = async () => {
    // Every file of the copied examples: the revision covers the whole directory.
    const names = (await readdir(dir)).filter((n) => /\.(ya?ml|json)$/.test(n) && !n.startsWith('.')).sort();
    return manifestRevision(await Promise.all(names.map(async (name) => ({ name, content: await readFile(join(dir, name), 'utf8') }))));
  };

  test('writes nothing to its node (not even to remove what an earlier run left) until a full read, then enforces it', async () => {
    // An earlier run leaves its state in the kernel, as an agent restart does.
    const first = new AgentProcess('node-a', ns, ['--manifests', dir, '--log-level', 'info']);
    agents.push(first);
    const want = await revisionOf();
    await first.waitFor((r) => r.msg === 'resynced dataplane' && r.revision === want, 10_000, 'the first write');
    await first.stop();
    const earlier = await nodeState();
    assert.match(earlier, /--dport 80 /);
    assert.doesNotMatch(earlier, /--dport 8080 /);

    // The policies change while the directory cannot be read: db's port moves from 80 to 8080.
    const policies = join(dir, '30-policies.yaml');
    const docs = (await readFile(policies, 'utf8')).split('\n---\n');
    await writeFile(policies, docs.map((d) => (d.includes('name: allow-backend-to-db') ? d.replace(/port: 80$/m, 'port: 8080') : d)).join('\n---\n'));
    await chmod(dir, 0o000);
    const lines: string[] = [];
    const child = spawn(
      'ip',
      ['netns', 'exec', ns, ...NO_DAC, process.execPath, MAIN, 'agent', '--node-name', 'node-a', '--manifests', dir, '--metrics-addr', '127.0.0.1:9464', '--log-level', 'info'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    children.push(child);
    createInterface({ input: child.stdout! }).on('line', (l) => lines.push(l));
    createInterface({ input: child.stderr! }).on('line', (l) => lines.push(l));
    const deadline = Date.now() + 10_000;
    while (!lines.some((l) => l.includes(`cannot list ${dir}`) && l.includes('permission denied'))) {
      assert.ok(Date.now() < deadline && child.exitCode === null, `no report of the unreadable directory:\n${lines.join('\n')}`);
      await sleep(50);
    }
    // Longer than a poll (2 s), so a retry has run too.
    await sleep(3000);
    assert.equal(await nodeState(), earlier, 'the node holds what the earlier run left');
    assert.ok(!lines.some((l) => /"msg":"(applied changes|resynced dataplane)"/.test(l)), lines.join('\n'));
    const waiting = await readyz();
    assert.deepEqual([waiting.status, waiting.ready, waiting.reason], [503, false, 'NotSynced']);

    await chmod(dir, 0o755);
    const changed = await revisionOf();
    const until = Date.now() + 10_000;
    while (!lines.some((l) => l.includes('"msg":"resynced dataplane"') && l.includes(`"revision":"${changed}"`))) {
      assert.ok(Date.now() < until, `no write once the directory is readable:\n${lines.slice(-10).join('\n')}`);
      await sleep(50);
    }
    const now = await nodeState();
    assert.match(now, /--dport 8080 /);
    assert.notEqual(now, earlier);
    const ready = await readyz();
    assert.deepEqual([ready.status, ready.ready, ready.revision], [200, true, changed]);
  });
});
