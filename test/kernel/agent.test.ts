// The agent end to end on a real kernel (in a namespace of its own): manifests in, chains
// and sets out, and the health server telling the truth about it.

import assert from 'node:assert/strict';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startAgent, type RunningAgent } from '../../src/agent/agent.ts';
import { defaultConfig } from '../../src/agent/config.ts';
import { execaRunner, netnsRunner } from '../../src/dataplane/index.ts';
import { silentLogger } from '../../src/log.ts';
import { createNs, deleteNs, inNs, uniquePrefix } from '../../src/sim/netns.ts';
import { manifestRevision } from '../../src/sources/index.ts';

const EXAMPLES = fileURLToPath(new URL('../../examples/', import.meta.url));

describe('agent on a real kernel', () => {
  const ns = `${uniquePrefix('wagent')}node`;
  let dir = '';
  let agent: RunningAgent | undefined;
  const url = (path: string) => `http://127.0.0.1:${agent!.port}${path}`;

  before(async () => {
    await createNs(ns);
    dir = await mkdtemp(join(tmpdir(), 'weir-agent-'));
    await cp(EXAMPLES, dir, { recursive: true });
  });
  after(async () => {
    await agent?.stop();
    await deleteNs(ns);
    await rm(dir, { recursive: true, force: true });
  });

  async function revisionOf(): Promise<string> {
    const names = ['00-namespaces.yaml', '10-pods.yaml', '20-nodes.yaml', '30-policies.yaml'];
    return manifestRevision(await Promise.all(names.map(async (name) => ({ name, content: await readFile(join(dir, name), 'utf8') }))));
  }

  async function waitReady(revision: string, timeoutMs = 5000): Promise<number> {
    const t0 = performance.now();
    for (;;) {
      const r = await fetch(url('/readyz'));
      const body = (await r.json()) as { ready: boolean; revision: string };
      if (r.status === 200 && body.ready && body.revision === revision) return performance.now() - t0;
      if (performance.now() - t0 > timeoutMs) assert.fail(`not ready at ${revision.slice(0, 12)}: ${JSON.stringify(body)}`);
      await new Promise((res) => setTimeout(res, 5));
    }
  }

  test('enforces the manifests, serves /healthz, /readyz and /metrics, and applies a change within 200 ms', async () => {
    const cfg = { ...defaultConfig(), nodeName: 'node-a', manifestsDir: dir, metricsAddr: '127.0.0.1:0', resyncIntervalMs: 0, retryMaxMs: 200 };
    agent = await startAgent(cfg, { log: silentLogger(), runner: netnsRunner(ns, execaRunner()) });
    await waitReady(await revisionOf());
    assert.equal((await fetch(url('/healthz'))).status, 200);

    const saved = await inNs(ns, 'iptables-save', ['-t', 'filter']);
    assert.match(saved, /^-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD$/m);
    assert.match(saved, /no policy allows ingress to db\/db-1/);
    assert.match(await inNs(ns, 'ip6tables-save', ['-t', 'filter']), /:cali-FORWARD/);
    assert.match(await inNs(ns, 'ipset', ['list', '-name']), /^cali40s:/m);

    const metrics = await (await fetch(url('/metrics'))).text();
    assert.match(metrics, /^weir_dataplane_applies_total\{result="ok"\} [1-9]/m);
    assert.match(metrics, /^weir_local_pods 3$/m);
    assert.match(metrics, /^weir_dataplane_chains [1-9]/m);

    // A policy change on disk: enforced and reported ready within 200 ms.
    const policies = join(dir, '30-policies.yaml');
    await writeFile(policies, (await readFile(policies, 'utf8')).replace('name: default-deny-ingress', 'name: deny-ingress-renamed'));
    const ms = await waitReady(await revisionOf(), 2000);
    console.log(`change enforced and ready after ${ms.toFixed(0)} ms`);
    assert.ok(ms < 200, `took ${ms} ms`);
    assert.match(await inNs(ns, 'iptables-save', ['-t', 'filter']), /db\/deny-ingress-renamed ingress|no policy allows ingress to db\/db-1/);
  });

  test('/readyz reports a failed write with its reason, and recovers once the kernel allows it', async () => {
    // A foreign rule jumping to one of our policy chains makes deleting that chain impossible.
    const saved = await inNs(ns, 'iptables-save', ['-t', 'filter']);
    const chain = /^-A (cali-pi-\S+) .*db\/allow-backend-to-db ingress rule 0/m.exec(saved)![1];
    await inNs(ns, 'iptables', ['-A', 'INPUT', '-j', chain]);
    const policies = join(dir, '30-policies.yaml');
    const text = await readFile(policies, 'utf8');
    const docs = text.split(/^---$/m).filter((d) => !d.includes('name: allow-backend-to-db'));
    await writeFile(policies, docs.join('---'));
    const want = await revisionOf();
    const deadline = Date.now() + 5000;
    let body: { ready: boolean; reason: string; revision: string } = { ready: true, reason: '', revision: '' };
    while (Date.now() < deadline) {
      body = (await (await fetch(url('/readyz'))).json()) as typeof body;
      if (!body.ready && /last apply failed/.test(body.reason)) break;
      await new Promise((res) => setTimeout(res, 20));
    }
    assert.equal(body.ready, false);
    assert.match(body.reason, /last apply failed: .*iptables/);
    assert.match(await inNs(ns, 'iptables-save', ['-t', 'filter']), new RegExp(`:${chain} `), 'the rejected write changed nothing');
    await inNs(ns, 'iptables', ['-D', 'INPUT', '-j', chain]);
    await waitReady(want, 5000);
    assert.doesNotMatch(await inNs(ns, 'iptables-save', ['-t', 'filter']), new RegExp(`:${chain} `));
  });
});
