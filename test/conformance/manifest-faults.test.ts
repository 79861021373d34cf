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
import { MANIFEST_FAULT_SCENARIOS, playScenario } from './explain-scenarios.ts';
import { Conformance } from './harness.ts';

describe('conformance: manifest mistakes fail closed', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wmfl');
  });
  after(async () => {
    await c?.stop();
  });

  // Raw manifests (unquoted labels, apiVersion, an unreadable namespace or Namespace labels):
  // their tables live in explain-scenarios.ts, where weir explain is checked over them too.
  for (const s of MANIFEST_FAULT_SCENARIOS) test(s.name, () => playScenario(c, s));
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
