// Conformance with real packets: ports (numeric, ranges, protocols, named), ipBlocks (excepts,
// overlaps, /0, host bits, families, pod IPs, the external host), invalid input, hostNetwork
// pods, connections that outlive a policy, and drift made by other programs on a node.
// Every predicate is written by hand from docs/semantics (never derived from Weir's code); the
// tables of policy states live in explain-scenarios.ts.

import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import { inNs } from '../../src/sim/netns.ts';
import { HOST_NETWORK_SCENARIOS, INVALID_POLICY_SCENARIOS, IPBLOCK_SCENARIOS, PORT_SCENARIOS, playScenario } from './explain-scenarios.ts';
import { ECHO_CLIENT, ECHO_SERVER, NsProcess } from './echo.ts';
import { A1, A2, B2, Conformance, np } from './harness.ts';
import { from, ingress, none, tcp } from './predicates.ts';

// Agents see a changed file within their 20 ms debounce; nothing can be awaited for a file that
// changes no revision, so this is a generous fixed wait.

/** Polls `check` until it returns true or the deadline passes; returns the last answer. */
async function until(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await sleep(200);
  }
}

describe('conformance: ports, ipBlocks, invalid input, hostNetwork, drift', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wcpb');
  });
  after(async () => {
    await c?.stop();
  });

  // Ports (numeric, ranges, protocols, named), ipBlocks (excepts, overlaps, /0, host bits,
  // families, pod IPs, the external host) and invalid policies: their tables live in
  // explain-scenarios.ts, where weir explain is checked over them too.
  for (const s of [...PORT_SCENARIOS, ...IPBLOCK_SCENARIOS, ...INVALID_POLICY_SCENARIOS]) test(s.name, () => playScenario(c, s));

  // ---- a broken manifest file ----------------------------------------------------------------

  test('a manifest file that stops parsing keeps its last good content; fixing or deleting it applies', async () => {
    await c.reset();
    const file = '40-raw.yaml';
    const head = ['apiVersion: networking.k8s.io/v1', 'kind: NetworkPolicy', 'metadata:', '  name: raw', '  namespace: alpha', 'spec:', '  podSelector:', '    matchLabels:', '      app: db'];
    try {
      await c.writeRaw(file, [...head, '  ingress:', '    - from:', '        - podSelector:', '            matchLabels:', '              app: web', ''].join('\n'));
      await c.expect(ingress({ [A2]: from(A1) }), 'valid file');
      await c.writeBrokenRaw(file, [...head, '  ingress: [ { from: [ {podSelector: ', ''].join('\n'));
      await c.expect(ingress({ [A2]: from(A1) }), 'broken file keeps last good content');
      await c.writeRaw(file, [...head, '  ingress:', '    - ports:', '        - port: 81', ''].join('\n'));
      await c.expect(ingress({ [A2]: tcp(81) }), 'fixed file');
      await c.removeRaw(file);
      await c.expect(() => true, 'file deleted');
    } finally {
      await c.removeRaw(file);
    }
  });

  // ---- hostNetwork ----------------------------------------------------------------------------

  // The harness has no hostNetwork switch: the step flips the pod's manifest field and rewrites
  // the files (explain-scenarios.ts says what the simulated pod then is).
  for (const s of HOST_NETWORK_SCENARIOS) test(s.name, () => playScenario(c, s));

  // ---- existing connections -------------------------------------------------------------------

  test('an established connection survives a policy that denies new ones (impl)', async () => {
    await c.reset();
    const procs: NsProcess[] = [];
    try {
      const server = NsProcess.inNetns(c.cluster.endpoint(A2)!.netns, ECHO_SERVER, { PORT: '8080' });
      procs.push(server);
      await server.waitFor('ready');
      const client = (host: string) => {
        const p = NsProcess.inNetns(c.cluster.endpoint(A1)!.netns, ECHO_CLIENT, { HOST: host, PORT: '8080', CONNECT_MS: '1500' });
        procs.push(p);
        return p;
      };
      const old4 = client('10.244.2.12');
      const old6 = client('fd00:10:244:2::12');
      for (const [i, p] of [old4, old6].entries()) {
        await p.waitFor('connected');
        p.send(`before${i}`);
        await p.waitFor(`echo:before${i}`);
      }

      await c.setPolicies(np('alpha', 'deny-db', { podSelector: { matchLabels: { app: 'db' } } }));
      await c.expect(ingress({ [A2]: none }), 'a2 denies all ingress');
      for (const [i, p] of [old4, old6].entries()) {
        p.send(`after${i}`);
        await p.waitFor(`echo:after${i}`);
      }
      const fresh = client('10.244.2.12');
      await fresh.waitFor('timeout');
      if (fresh.lines.includes('connected')) throw new Error(`a new connection got through: ${fresh.lines.join(' | ')}`);
    } finally {
      for (const p of procs) p.kill();
    }
  });

  // ---- drift made by other programs -------------------------------------------------------------

  describe('drift on node-a is repaired within the resync interval, and foreign rules survive', () => {
    const RESYNC_DEADLINE_MS = 12_000;
    const nodeA = () => c.nodeNetns('node-a');
    const ipt = (family: 4 | 6, ...args: string[]) => inNs(nodeA(), family === 4 ? 'iptables' : 'ip6tables', args);
    const forward = async (family: 4 | 6) => (await ipt(family, '-S', 'FORWARD')).split('\n').filter((l) => l.startsWith('-A FORWARD'));
    const FLANNEL = ['-s', '10.244.0.0/16', '-m', 'comment', '--comment', 'flanneld forward', '-j', 'ACCEPT'];
    const KUBE_JUMP = ['-m', 'comment', '--comment', 'kubernetes forwarding rules', '-j', 'KUBE-FORWARD'];
    const KUBE_RULE = ['-m', 'mark', '--mark', '0x4000/0x4000', '-j', 'ACCEPT'];
    // Accepts node-a's pod traffic before Weir sees it: harmless only while our hook is first.
    const TOP = ['-s', '10.244.0.0/16', '-m', 'comment', '--comment', 'foreign top', '-j', 'ACCEPT'];
    let foreignBefore = '';

    const foreignState = async () => {
      const kube = await ipt(4, '-S', 'KUBE-FORWARD');
      const fwd = (await forward(4)).filter((l) => !l.includes('weir:'));
      return `${kube}\n${fwd.join('\n')}`;
    };

    before(async () => {
      await ipt(4, '-N', 'KUBE-FORWARD');
      await ipt(4, '-A', 'KUBE-FORWARD', ...KUBE_RULE);
      await ipt(4, '-A', 'FORWARD', ...KUBE_JUMP);
      await ipt(4, '-A', 'FORWARD', ...FLANNEL);
      foreignBefore = await foreignState();
    });

    after(async () => {
      // The cluster is destroyed with the file; this only keeps the tests independent.
      await ipt(4, '-D', 'FORWARD', ...TOP).catch(() => {});
      await ipt(4, '-D', 'FORWARD', ...FLANNEL).catch(() => {});
      await ipt(4, '-D', 'FORWARD', ...KUBE_JUMP).catch(() => {});
      await ipt(4, '-F', 'KUBE-FORWARD').catch(() => {});
      await ipt(4, '-X', 'KUBE-FORWARD').catch(() => {});
    });

    test('a foreign rule inserted above the hook: the hook returns to position 1, the rule stays', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'deny', { podSelector: { matchLabels: { app: 'web' } } }));
      await ipt(4, '-I', 'FORWARD', '1', ...TOP);
      const repaired = await until(async () => {
        const rules = await forward(4);
        return rules[0]?.includes('weir:hook') === true && rules[1]?.includes('foreign top') === true;
      }, RESYNC_DEADLINE_MS);
      if (!repaired) throw new Error(`hook not first again within ${RESYNC_DEADLINE_MS} ms:\n${(await forward(4)).join('\n')}`);
      await c.expect(ingress({ [A1]: none }), 'policy enforced with the foreign rule second');
      const now = (await forward(4)).filter((l) => !l.includes('weir:'));
      if (!now.some((l) => l.includes('foreign top'))) throw new Error(`foreign rule removed:\n${now.join('\n')}`);
      await ipt(4, '-D', 'FORWARD', ...TOP);
      const foreignNow = await foreignState();
      if (foreignNow !== foreignBefore) throw new Error(`foreign rules changed:\nbefore:\n${foreignBefore}\nafter:\n${foreignNow}`);
    });

    test('a flushed cali-tw- chain is rewritten and enforcement returns', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'deny', { podSelector: { matchLabels: { app: 'web' } } }));
      // Find a1's ingress chain by the comment Weir writes into it, in both families.
      const twChain = async (family: 4 | 6) => {
        const line = (await ipt(family, '-t', 'mangle', '-S')).split('\n').find((l) => l.startsWith('-A cali-tw-') && l.includes('ingress to alpha/a1'));
        return line?.split(' ')[1];
      };
      const chains = { 4: await twChain(4), 6: await twChain(6) };
      if (!chains[4] || !chains[6]) throw new Error(`no cali-tw- chain for alpha/a1: ${JSON.stringify(chains)}`);
      await ipt(4, '-t', 'mangle', '-F', chains[4]);
      await ipt(6, '-t', 'mangle', '-F', chains[6]);
      const repaired = await until(async () => (await twChain(4)) === chains[4] && (await twChain(6)) === chains[6], RESYNC_DEADLINE_MS);
      if (!repaired) throw new Error(`${chains[4]} / ${chains[6]} not rewritten within ${RESYNC_DEADLINE_MS} ms`);
      await c.expect(ingress({ [A1]: none }), 'a1 isolated again');
      const foreignNow = await foreignState();
      if (foreignNow !== foreignBefore) throw new Error(`foreign rules changed:\nbefore:\n${foreignBefore}\nafter:\n${foreignNow}`);
    });

    test('a flushed peer set is refilled and enforcement returns', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'from-db', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } }] }] }));
      const members = async (set: string) => (await inNs(nodeA(), 'ipset', ['list', set])).split('Members:')[1]?.trim().split('\n').filter(Boolean) ?? [];
      const names = (await inNs(nodeA(), 'ipset', ['list', '-n'])).split('\n').filter((n) => n.startsWith('cali40s:'));
      let peerSet: string | undefined;
      for (const n of names) if ((await members(n)).includes('10.244.2.12')) peerSet = n;
      if (!peerSet) throw new Error(`no v4 set holding a2's address among ${names.join(', ')}`);
      const want = (await members(peerSet)).sort();
      await inNs(nodeA(), 'ipset', ['flush', peerSet]);
      const refilled = await until(async () => JSON.stringify((await members(peerSet)).sort()) === JSON.stringify(want), RESYNC_DEADLINE_MS);
      if (!refilled) throw new Error(`${peerSet} not refilled within ${RESYNC_DEADLINE_MS} ms: ${(await members(peerSet)).join(' ')}`);
      await c.expect(ingress({ [A1]: from(A2, B2) }), 'db pods reach a1 again');
      const foreignNow = await foreignState();
      if (foreignNow !== foreignBefore) throw new Error(`foreign rules changed:\nbefore:\n${foreignBefore}\nafter:\n${foreignNow}`);
    });
  });
});
