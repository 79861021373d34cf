// The opt-in cut of established connections (weir.dev/cut-existing, --cut-existing): after the
// write that starts to deny them, the agent deletes the tracked entries of exactly the
// connections the new rules deny, so their next packet is judged as new and dropped; the
// connections still allowed go on. Real TCP connections in both families.

import assert from 'node:assert/strict';
import { after, afterEach, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { inNs } from '../../src/sim/netns.ts';
import { untilPasses } from '../support/eventually.ts';
import { ECHO_CLIENT, ECHO_SERVER, NsProcess } from './echo.ts';
import { A1, A2, B1, B2, Conformance, np } from './harness.ts';

const CUT = { 'weir.dev/cut-existing': 'true' };
const PORT = '8080';
/** Long enough for an echo over a live connection many times over. */
const NO_ECHO_MS = 2_000;

describe('conformance: cutting the connections a policy starts to deny (weir.dev/cut-existing)', () => {
  let c: Conformance;
  const procs: NsProcess[] = [];
  before(async () => {
    c = await Conformance.start('wccut');
  });
  afterEach(() => {
    for (const p of procs.splice(0)) p.kill();
  });
  after(async () => {
    await c?.stop();
  });

  const podIp = (key: string, family: 4 | 6) => c.pods.get(key)!.ips.find((ip) => ip.includes(':') === (family === 6))!;
  const netnsOf = (key: string) => c.cluster.endpoint(key)!.netns;

  async function serve(key: string): Promise<void> {
    const server = new NsProcess(netnsOf(key), ECHO_SERVER, { PORT });
    procs.push(server);
    await server.waitFor('ready');
  }

  /** A connection from `from` to `to` that has carried one echo. */
  async function connect(from: string, to: string, family: 4 | 6): Promise<NsProcess> {
    const p = new NsProcess(netnsOf(from), ECHO_CLIENT, { HOST: podIp(to, family), PORT, CONNECT_MS: '3000' });
    procs.push(p);
    await p.waitFor('connected');
    p.send('before');
    await p.waitFor('echo:before');
    return p;
  }

  /** Tracked connections to PORT from `src` in a node's namespace. */
  async function tracked(node: string, src: string): Promise<number> {
    const family = src.includes(':') ? 'ipv6' : 'ipv4';
    const out = await inNs(c.nodeNetns(node), 'conntrack', ['-L', '-f', family, '-p', 'tcp', '--orig-src', src, '--dport', PORT]).catch(() => '');
    return out.split('\n').filter((l) => l.includes(`dport=${PORT}`)).length;
  }

  async function echoes(p: NsProcess, line: string): Promise<boolean> {
    p.send(line);
    return p.waitFor(`echo:${line}`, NO_ECHO_MS).then(
      () => true,
      () => false,
    );
  }

  test('a policy with the annotation cuts the ingress connections it denies, on the node of the pod it selects, and keeps the ones it allows', async () => {
    await c.reset();
    await serve(A2);
    const kept = [await connect(A1, A2, 4), await connect(A1, A2, 6)];
    const cut = [await connect(B1, A2, 4), await connect(B1, A2, 6)];
    // a2 accepts its own namespace only: b1's connections are denied from now on.
    await c.setPolicies({
      ...(np('alpha', 'own-namespace', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ podSelector: {} }] }] }) as object),
      metadata: { namespace: 'alpha', name: 'own-namespace', annotations: CUT },
    });
    for (const family of [4, 6] as const) {
      await untilPasses(
        async () => assert.equal(await tracked('node-b', podIp(B1, family)), 0, `b1's IPv${family} connection is still tracked on node-b; agents said: ${c.agentErrors().join('\n')}`),
        5_000,
        50,
      );
      assert.ok((await tracked('node-b', podIp(A1, family))) > 0, `a1's IPv${family} connection, still allowed, was deleted`);
    }
    for (const [i, p] of cut.entries()) assert.equal(await echoes(p, `after${i}`), false, `b1's connection ${i} still carries data`);
    for (const [i, p] of kept.entries()) assert.equal(await echoes(p, `after${i}`), true, `a1's connection ${i} was cut`);
  });

  test("a namespace's annotation cuts its pods' egress connections that a policy without it now denies, and no others", async () => {
    await c.reset();
    await serve(A2);
    await serve(B2);
    const cut = [await connect(A1, A2, 4), await connect(A1, A2, 6)];
    const kept = [await connect(A1, B2, 4)];
    const beside = [await connect(B1, A2, 4)];
    c.namespaceAnnotations = { alpha: CUT };
    // a1 may reach namespace beta only.
    await c.setPolicies(np('alpha', 'to-beta', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'], egress: [{ to: [{ namespaceSelector: { matchLabels: { team: 'b' } } }] }] }));
    for (const family of [4, 6] as const) {
      await untilPasses(async () => assert.equal(await tracked('node-a', podIp(A1, family)), family === 4 ? 1 : 0, `a1's IPv${family} connections tracked on node-a`), 5_000, 50);
    }
    for (const [i, p] of cut.entries()) assert.equal(await echoes(p, `after${i}`), false, `a1 -> a2 connection ${i} still carries data`);
    for (const p of [...kept, ...beside]) assert.equal(await echoes(p, 'after'), true, 'a connection still allowed was cut');
  });

  test('without the annotation, the same change leaves every established connection running', async () => {
    await c.reset();
    await serve(A2);
    const running = [await connect(B1, A2, 4), await connect(B1, A2, 6)];
    await c.setPolicies(np('alpha', 'own-namespace', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ podSelector: {} }] }] }));
    // Time enough for a cut to have happened, had one been asked for.
    await sleep(500);
    for (const [i, p] of running.entries()) assert.equal(await echoes(p, `after${i}`), true, `connection ${i} was cut without the annotation`);
  });
});
