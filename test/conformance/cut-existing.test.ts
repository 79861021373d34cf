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
import { A1, A2, B1, B2, Conformance, cnp, np } from './harness.ts';

const CUT = { 'weir.dev/cut-existing': 'true' };
const PORT = '8080';
/** Long enough for an echo over a live connection many times over. */
const NO_ECHO_MS = 2_000;

/** Long-lived connections between the pods of a Conformance cluster, and what became of them. */
class Connections {
  readonly #c: Conformance;
  readonly #procs: NsProcess[] = [];

  constructor(c: Conformance) {
    this.#c = c;
  }

  podIp(key: string, family: 4 | 6): string {
    return this.#c.pods.get(key)!.ips.find((ip) => ip.includes(':') === (family === 6))!;
  }

  #netns(key: string): string {
    return this.#c.cluster.endpoint(key)!.netns;
  }

  async serve(key: string): Promise<void> {
    const server = NsProcess.inNetns(this.#netns(key), ECHO_SERVER, { PORT });
    this.#procs.push(server);
    await server.waitFor('ready');
  }

  /** A connection from `from` to `to` that has carried one echo. */
  async connect(from: string, to: string, family: 4 | 6): Promise<NsProcess> {
    const p = NsProcess.inNetns(this.#netns(from), ECHO_CLIENT, { HOST: this.podIp(to, family), PORT, CONNECT_MS: '3000' });
    this.#procs.push(p);
    await p.waitFor('connected');
    p.send('before');
    await p.waitFor('echo:before');
    return p;
  }

  /** Tracked connections to PORT from `src` in a node's namespace. */
  async tracked(node: string, src: string): Promise<number> {
    const family = src.includes(':') ? 'ipv6' : 'ipv4';
    const out = await inNs(this.#c.nodeNetns(node), 'conntrack', ['-L', '-f', family, '-p', 'tcp', '--orig-src', src, '--dport', PORT]).catch(() => '');
    return out.split('\n').filter((l) => l.includes(`dport=${PORT}`)).length;
  }

  /** Waits until `src` has `count` connections tracked on `node`. */
  async untilTracked(node: string, src: string, count: number): Promise<void> {
    await untilPasses(async () => assert.equal(await this.tracked(node, src), count, `connections from ${src} tracked on ${node}; agents said: ${this.#c.agentErrors().join('\n')}`), 5_000, 50);
  }

  async echoes(p: NsProcess, line: string): Promise<boolean> {
    p.send(line);
    return p.waitFor(`echo:${line}`, NO_ECHO_MS).then(
      () => true,
      () => false,
    );
  }

  killAll(): void {
    for (const p of this.#procs.splice(0)) p.kill();
  }
}

/** a2 accepts its own namespace only: b1's connections to it are denied from then on. */
const ownNamespaceOnly = (annotations?: Record<string, string>) => ({
  metadata: { namespace: 'alpha', name: 'own-namespace', ...(annotations ? { annotations } : {}) },
  spec: { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ podSelector: {} }] }] },
});

describe('conformance: cutting the connections a policy starts to deny (weir.dev/cut-existing)', () => {
  let c: Conformance;
  let x: Connections;
  before(async () => {
    c = await Conformance.start('wccut');
    x = new Connections(c);
  });
  afterEach(() => x.killAll());
  after(async () => {
    await c?.stop();
  });

  test('a policy with the annotation cuts the ingress connections it denies, on the node of the pod it selects, and keeps the ones it allows', async () => {
    await c.reset();
    await x.serve(A2);
    const kept = [await x.connect(A1, A2, 4), await x.connect(A1, A2, 6)];
    const cut = [await x.connect(B1, A2, 4), await x.connect(B1, A2, 6)];
    await c.setPolicies(ownNamespaceOnly(CUT));
    for (const family of [4, 6] as const) {
      await x.untilTracked('node-b', x.podIp(B1, family), 0);
      assert.ok((await x.tracked('node-b', x.podIp(A1, family))) > 0, `a1's IPv${family} connection, still allowed, was deleted`);
    }
    for (const [i, p] of cut.entries()) assert.equal(await x.echoes(p, `after${i}`), false, `b1's connection ${i} still carries data`);
    for (const [i, p] of kept.entries()) assert.equal(await x.echoes(p, `after${i}`), true, `a1's connection ${i} was cut`);
  });

  test("a namespace's annotation cuts its pods' egress connections that a policy without it now denies, and no others", async () => {
    await c.reset();
    await x.serve(A2);
    await x.serve(B2);
    const cut = [await x.connect(A1, A2, 4), await x.connect(A1, A2, 6)];
    const kept = [await x.connect(A1, B2, 4)];
    const beside = [await x.connect(B1, A2, 4)];
    c.namespaceAnnotations = { alpha: CUT };
    // a1 may reach namespace beta only.
    await c.setPolicies(np('alpha', 'to-beta', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'], egress: [{ to: [{ namespaceSelector: { matchLabels: { team: 'b' } } }] }] }));
    for (const family of [4, 6] as const) await x.untilTracked('node-a', x.podIp(A1, family), family === 4 ? 1 : 0);
    for (const [i, p] of cut.entries()) assert.equal(await x.echoes(p, `after${i}`), false, `a1 -> a2 connection ${i} still carries data`);
    for (const p of [...kept, ...beside]) assert.equal(await x.echoes(p, 'after'), true, 'a connection still allowed was cut');
  });

  test('a ClusterNetworkPolicy with the annotation cuts the connections its Admin Deny denies to the pods of its subject, and keeps the others', async () => {
    await c.reset();
    await x.serve(A2);
    const kept = [await x.connect(A1, A2, 4), await x.connect(A1, A2, 6)];
    const cut = [await x.connect(B1, A2, 4), await x.connect(B1, A2, 6)];
    await c.setPolicies(
      cnp(
        'no-beta-to-db',
        {
          tier: 'Admin',
          priority: 10,
          subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } } },
          ingress: [{ action: 'Deny', from: [{ namespaces: { matchLabels: { team: 'b' } } }] }],
        },
        CUT,
      ),
    );
    for (const family of [4, 6] as const) await x.untilTracked('node-b', x.podIp(B1, family), 0);
    for (const [i, p] of cut.entries()) assert.equal(await x.echoes(p, `after${i}`), false, `b1's connection ${i} still carries data`);
    for (const [i, p] of kept.entries()) assert.equal(await x.echoes(p, `after${i}`), true, `a1's connection ${i} was cut`);
  });

  test('without the annotation, the same change leaves every established connection running', async () => {
    await c.reset();
    await x.serve(A2);
    const running = [await x.connect(B1, A2, 4), await x.connect(B1, A2, 6)];
    await c.setPolicies(ownNamespaceOnly());
    // Time enough for a cut to have happened, had one been asked for.
    await sleep(500);
    for (const [i, p] of running.entries()) assert.equal(await x.echoes(p, `after${i}`), true, `connection ${i} was cut without the annotation`);
  });
});

describe('conformance: --cut-existing cuts for every pod, with no annotation', () => {
  let c: Conformance;
  let x: Connections;
  before(async () => {
    c = await Conformance.start('wccug', ['--cut-existing']);
    x = new Connections(c);
  });
  afterEach(() => x.killAll());
  after(async () => {
    await c?.stop();
  });

  test('the connections a policy without the annotation denies are cut, the ones it allows kept', async () => {
    await x.serve(A2);
    const kept = await x.connect(A1, A2, 6);
    const cut = await x.connect(B1, A2, 6);
    await c.setPolicies(ownNamespaceOnly());
    await x.untilTracked('node-b', x.podIp(B1, 6), 0);
    assert.equal(await x.echoes(cut, 'after'), false, "b1's connection still carries data");
    assert.equal(await x.echoes(kept, 'after'), true, "a1's connection was cut");
  });
});
