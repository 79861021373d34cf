// Traffic between a pod and the node it runs on is always allowed, even under deny-all;
// traffic from another node is policed like any other source.

import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { openProbeClient } from '../../src/sim/prober.ts';
import { applyStep, probeStep, scenario } from './explain-scenarios.ts';
import { A1, Conformance } from './harness.ts';

const NODE_PORT = 9090;

/** A TCP server inside a node's namespace that answers with a fixed word. */
function nodeServer(netns: string): ChildProcess {
  const script = `require('node:net').createServer((s) => s.end('node\\n')).listen(${NODE_PORT}, '::', () => console.log('ready'))`;
  return spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
}

/** Connects from inside a node's namespace; resolves with what the server sent, or '' on failure. */
function connectFromNode(netns: string, ip: string, port: number): Promise<string> {
  const script = `const s = require('node:net').connect(${port}, '${ip}'); let d = ''; s.setTimeout(500, () => { s.destroy(); }); s.on('data', (c) => d += c); s.on('close', () => console.log(JSON.stringify(d))); s.on('error', () => {});`;
  return new Promise((resolve) => {
    const child = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout!.on('data', (c) => (out += c));
    child.on('exit', () => resolve(out.trim() ? (JSON.parse(out.trim()) as string) : ''));
  });
}

describe('conformance: a pod and its own node', () => {
  let c: Conformance;
  let server: ChildProcess | undefined;
  before(async () => {
    c = await Conformance.start('wnode');
  });
  after(async () => {
    if (server?.exitCode === null) server.kill('SIGKILL');
    await c?.stop();
  });

  test('under deny-all both ways, a pod and its node still reach each other; another node does not reach the pod', async () => {
    await c.reset();
    // Every namespace denies all ingress and all egress.
    const [denyAll] = scenario('a pod always reaches itself, even when every pod denies all ingress and all egress').steps;
    await applyStep(c, denyAll);
    const nodeA = c.cluster.nodes.find((n) => n.name === 'node-a')!;
    const nodeB = c.cluster.nodes.find((n) => n.name === 'node-b')!;
    const a1 = c.cluster.endpoint(A1)!;
    for (const ip of a1.ips) {
      assert.equal(await connectFromNode(nodeA.netns, ip, 80), A1, `node-a -> ${A1} (${ip}) must pass`);
      assert.equal(await connectFromNode(nodeB.netns, ip, 80), '', `node-b -> ${A1} (${ip}) must be dropped: another node is not exempt`);
    }
    server = nodeServer(nodeA.netns);
    await new Promise<void>((resolve) => server!.stdout!.once('data', () => resolve()));
    const client = await openProbeClient(a1);
    try {
      for (const gw of nodeA.gateways) {
        const r = await client.probe({ proto: 'tcp', ip: gw, port: NODE_PORT, timeoutMs: 500 });
        assert.equal(r.ok, true, `${A1} -> its node (${gw}) must pass: ${r.error ?? ''}`);
      }
    } finally {
      client.close();
    }
    // And the policy holds for pod-to-pod traffic at the same time.
    await probeStep(c, denyAll);
  });
});
