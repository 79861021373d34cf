// kube-proxy's IPVS mode, as far as this machine can test it. Its kernel has no ip_vs (and so no
// xt_ipvs match): no IPVS packet can be sent here, and no rule with `-m ipvs` can be loaded. So:
// - the OUTPUT hook's kernel fate is asserted as it is: refused whole (nothing half-written)
//   where xt_ipvs is missing, installed first in OUTPUT where it exists;
// - everything else the hook relies on is proven with real packets in the simulated cluster,
//   with the hook minus its `-m ipvs` match (which takes a superset of the hook's packets): the
//   kernel accepts Weir's chains reached from OUTPUT, and the node's own traffic (kubelet-like
//   and API-server-like TCP, DNS-like UDP, to its pods, from its pods, to the outside, on
//   loopback) never meets them, even to and from pods that policy isolates both ways.
// The rendering of the hook itself is in test/unit/dataplane.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { makeNames } from '../../src/calc/names.ts';
import { RestoreError } from '../../src/errors.ts';
import { silentLogger } from '../../src/log.ts';
import { createDataplane } from '../../src/dataplane/dataplane.ts';
import { ipvsHookSpec } from '../../src/dataplane/render.ts';
import { processRunner, netnsRunner } from '../../src/exec/runner.ts';
import type { Family } from '../../src/model/types.ts';
import { createNs, deleteAllNs, inNs, uniquePrefix } from '../../src/sim/netns.ts';
import type { ProbeProto } from '../../src/sim/probe-protocol.ts';
import { openProbeClient, type ProbeClient } from '../../src/sim/prober.ts';
import { A1, A2, B1, Conformance, EXTERNAL, np } from '../conformance/harness.ts';
import { accept, desired, jump } from '../unit/dataplane/fixtures.ts';
import type { IptablesBackend } from './kube-proxy.ts';
import { chainRules, hookIndex, iptablesSave } from './inspect.ts';

const BACKENDS: readonly IptablesBackend[] = ['nft', 'legacy'];
const FAMILIES: readonly Family[] = [4, 6];
const tool = (b: IptablesBackend, f: Family) => `${f === 4 ? 'iptables' : 'ip6tables'}-${b}`;
const nsPrefix = uniquePrefix('wipvs');
after(() => deleteAllNs(nsPrefix));

/** Whether this kernel loads the ipvs match at all (a scratch chain in a scratch namespace). */
async function kernelHasIpvsMatch(backend: IptablesBackend): Promise<boolean> {
  const ns = `${nsPrefix}probe-${backend}`;
  await createNs(ns);
  const r = await execa('ip', ['netns', 'exec', ns, `iptables-${backend}-restore`, '--noflush'], {
    input: '*mangle\n:probe - [0:0]\n-A probe -m ipvs --ipvs -j RETURN\nCOMMIT\n',
    reject: false,
  });
  return r.exitCode === 0;
}

describe('the OUTPUT hook for IPVS mode in the kernel', () => {
  for (const backend of BACKENDS) {
    test(`${backend}: refused whole where the kernel lacks xt_ipvs (a loud failure, nothing half-written); first in OUTPUT where it has it`, async () => {
      const ns = `${nsPrefix}${backend}`;
      await createNs(ns);
      const names = makeNames('cali');
      const dp = createDataplane({ runner: netnsRunner(ns, processRunner()), names, families: [4, 6], backend, log: silentLogger(), ipvs: 'on' });
      const d = desired({ chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [accept] }, chains6: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [accept] } });
      if (await kernelHasIpvsMatch(backend)) {
        await dp.apply(d);
        for (const f of FAMILIES) {
          const save = await iptablesSave(ns, backend, f, 'mangle');
          assert.equal(hookIndex(chainRules(save, 'mangle', 'OUTPUT')), 0, `IPv${f}: OUTPUT hook first`);
          assert.equal(hookIndex(chainRules(save, 'mangle', 'FORWARD')), 0, `IPv${f}: FORWARD hook first`);
        }
        assert.equal(await dp.hookIntact(), true);
        return;
      }
      process.stdout.write(`# ${backend}: this kernel cannot load -m ipvs (no ip_vs): the IPVS hook is tested by rendering and by its ipvs-less part only\n`);
      await assert.rejects(dp.apply(d), (e: unknown) => e instanceof RestoreError && /ipvs/.test(e.message));
      for (const f of FAMILIES) {
        const save = (await iptablesSave(ns, backend, f, 'mangle')) + (await iptablesSave(ns, backend, f, 'filter'));
        assert.doesNotMatch(save, /cali-|weir:/, `IPv${f}: a refused payload left nothing behind`);
      }
      assert.equal(dp.status().inSync, false, 'not ready: the agent reports the failure and retries');
    });
  }
});

// A node's own servers: kubelet-like TCP 10250, DNS-like UDP and TCP 53.
const SERVER = fileURLToPath(new URL('../../src/sim/podserver.ts', import.meta.url));
const NODE_PORTS = [10250, 53];

async function startNodeServer(netns: string, name: string): Promise<{ client: ProbeClient; stop: () => void }> {
  const sock = join(tmpdir(), `${nsPrefix}${name}.sock`);
  rmSync(sock, { force: true });
  const child = spawn('ip', ['netns', 'exec', netns, process.execPath, SERVER, '--name', name, '--ports', NODE_PORTS.join(','), '--control', sock], { stdio: 'ignore' });
  const deadline = Date.now() + 15_000;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect(sock);
      s.once('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    });
    if (ok) break;
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`node server in ${netns} did not start`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const client = await openProbeClient({ key: name, socketPath: sock });
  return {
    client,
    stop: () => {
      client.close();
      child.kill('SIGKILL');
      rmSync(sock, { force: true });
    },
  };
}

for (const backend of BACKENDS) {
  describe(`${backend}: the IPVS hook never touches the node's own traffic`, () => {
    let c: Conformance;
    let node: Awaited<ReturnType<typeof startNodeServer>>;
    const NODE_A = { 4: '172.31.0.1', 6: 'fd00:172:31::1' } as const;
    const GATEWAY_A = { 4: '10.244.1.1', 6: 'fd00:10:244:1::1' } as const;
    const LOOPBACK = { 4: '127.0.0.1', 6: '::1' } as const;
    const ip = (key: string, f: Family) => c.cluster.endpoint(key)!.ips.find((a) => a.includes(':') === (f === 6))!;

    before(async () => {
      c = await Conformance.start('wipvs', ['--backend', backend]);
      node = await startNodeServer(c.nodeNetns('node-a'), 'node-a');
      // a1 isolated both ways: whatever reaches it or leaves it through Weir's chains drops.
      await c.setPolicies(np('alpha', 'a1-isolated', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Ingress', 'Egress'] }));
    });
    after(async () => {
      node?.stop();
      await c?.stop();
    });

    const clients = new Map<string, ProbeClient>();
    after(() => {
      for (const cl of clients.values()) cl.close();
    });
    /** Probes from node-a itself (its own process) or from a pod or the external host. */
    const probe = async (from: string, to: string, port: number, proto: ProbeProto = 'tcp') => {
      let client = from === 'node-a' ? node.client : clients.get(from);
      if (!client) {
        client = await openProbeClient(c.cluster.endpoint(from)!);
        clients.set(from, client);
      }
      const r = await client.probe({ proto, ip: to, port, timeoutMs: 500 });
      return r.ok ? r.reply : null;
    };
    const nodeTraffic = () =>
      FAMILIES.flatMap((f) => [
        { what: `node-a to isolated a1 (kubelet probe), IPv${f} tcp`, run: () => probe('node-a', ip(A1, f), 80), expect: A1 },
        { what: `node-a to isolated a1, IPv${f} udp`, run: () => probe('node-a', ip(A1, f), 80, 'udp'), expect: A1 },
        { what: `node-a to a2 on node-b, IPv${f}`, run: () => probe('node-a', ip(A2, f), 80), expect: A2 },
        { what: `node-a to the external host (an API server elsewhere), IPv${f}`, run: () => probe('node-a', f === 4 ? '172.31.0.200' : 'fd00:172:31::200', 80), expect: EXTERNAL },
        { what: `node-a on loopback (an API server on localhost), IPv${f}`, run: () => probe('node-a', LOOPBACK[f], 10250), expect: 'node-a' },
        { what: `isolated a1 to its node's kubelet port, IPv${f}`, run: () => probe(A1, GATEWAY_A[f], 10250), expect: 'node-a' },
        { what: `isolated a1 to DNS on its node, IPv${f} udp`, run: () => probe(A1, GATEWAY_A[f], 53, 'udp'), expect: 'node-a' },
        // TCP: a UDP server bound to any address answers from the address routing picks (the
        // bridge's), which a client that sent to another of the node's addresses ignores.
        { what: `b1 to DNS on its node's underlay address, IPv${f} tcp`, run: () => probe(B1, NODE_A[f], 53), expect: 'node-a' },
        { what: `the external host to node-a's kubelet port, IPv${f}`, run: () => probe(EXTERNAL, NODE_A[f], 10250), expect: 'node-a' },
      ]);

    /** Installs a rule at mangle OUTPUT 1 (where Weir's hook goes) in both families for the duration of fn. */
    async function withOutputRule(spec: string[], fn: () => Promise<void>): Promise<void> {
      const ns = c.nodeNetns('node-a');
      for (const f of FAMILIES) await inNs(ns, tool(backend, f), ['-t', 'mangle', '-I', 'OUTPUT', '1', ...spec]);
      try {
        await fn();
      } finally {
        for (const f of FAMILIES) await execa('ip', ['netns', 'exec', ns, tool(backend, f), '-t', 'mangle', '-D', 'OUTPUT', ...spec], { reject: false });
      }
    }

    test('the hook minus its ipvs match (a superset of its packets) is accepted by the kernel from OUTPUT, and node traffic never meets Weir’s chains', async () => {
      // The real hook is this plus `-m ipvs --ipvs --vdir ORIGINAL` in front.
      const hook = ipvsHookSpec('cali-FORWARD');
      const withoutIpvs = hook.replace('-m ipvs --ipvs --vdir ORIGINAL ', '');
      assert.notEqual(withoutIpvs, hook);
      const spec = withoutIpvs.replace('"weir:hook"', 'weir-test-ipvs-hook').split(' ');
      const disturbed = async () => {
        const wrong = [];
        for (const t of nodeTraffic()) {
          const got = await t.run();
          if (got !== t.expect) wrong.push(`${t.what}: expected ${t.expect}, got ${got ?? 'blocked'}`);
        }
        return wrong;
      };
      assert.deepEqual(await disturbed(), [], 'node traffic broken before any OUTPUT hook');
      await withOutputRule(spec, async () => {
        assert.deepEqual(await disturbed(), [], 'node traffic disturbed by the hook');
      });
    });

    test('control: the same jump without the not-the-node’s-own-address guard would drop the node’s probes of an isolated pod', async () => {
      await withOutputRule(['-m', 'comment', '--comment', 'weir-test-unguarded', '-j', 'cali-FORWARD'], async () => {
        for (const f of FAMILIES) assert.equal(await probe('node-a', ip(A1, f), 80), null, `IPv${f}: node-a reached isolated a1 through Weir's chains`);
      });
      // And without any rule, as before.
      for (const f of FAMILIES) assert.equal(await probe('node-a', ip(A1, f), 80), A1);
    });
  });
}
