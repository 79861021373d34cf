// The Services scenarios, run once per kube-proxy mode and iptables backend (one test file
// each, one control plane per file). Expectations are written from the semantics (docs/
// semantics: a Service connection is policed as a connection to the backend pod it reaches)
// and from what kube-proxy does to addresses (masquerade after FORWARD), never from Weir's code.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { execa } from 'execa';
import { EXTERNAL_KEY } from '../../src/sim/cluster.ts';
import type { ProbeProto } from '../../src/sim/probe-protocol.ts';
import type { Family } from '../../src/model/types.ts';
import { A1, A2, B1, B2, basePods, G1, type PodDef } from '../conformance/harness.ts';
import { countArrivals, sendUdp, unwatchArrivals, watchArrivals } from '../conformance/spoofing.ts';
import { flowsTo } from '../support/conntrack.ts';
import { EXTERNAL_IPS, GATEWAYS, NODE_IPS, policyObject, type ReachCase, SERVICE_PORT, Services, type ServicesOptions, TARGET_PORT } from './harness.ts';
import { chainRules, hookIndex, iptablesSave, kubeLines, kubeProxyTable, timeWaitPeers } from './inspect.ts';

const ip = (key: string, f: Family): string | undefined =>
  basePods()
    .find((p) => `${p.namespace}/${p.name}` === key)
    ?.ips.find((a) => (f === 4 ? !a.includes(':') : a.includes(':')));
const FAMILIES: readonly Family[] = [4, 6];
const ip4 = (ep: { readonly ips: readonly string[] }): string => ep.ips.find((a) => !a.includes(':'))!;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const WEB_NODEPORT = 30080;
const LOCAL_NODEPORT = 30081;
/** The agents' default --hook-check-interval. */
const HOOK_CHECK_MS = 5_000;
/** Every family's address of a host, as ipBlocks (/32, /128). */
const blocks = (addrs: Readonly<Record<Family, string>>) => FAMILIES.map((f) => ({ ipBlock: { cidr: `${addrs[f]}/${f === 4 ? 32 : 128}` } }));

export function servicesSuite(opts: ServicesOptions): void {
  describe(`Services through kube-proxy (${opts.mode} mode, iptables ${opts.backend}) with weir agents`, () => {
    let s: Services;
    const svc: Record<string, Partial<Record<Family, string>>> = {};
    before(async () => {
      s = await Services.start(opts);
      svc.web = (await s.service({ namespace: 'alpha', name: 'web', backends: [A1] })).clusterIPs;
      svc.db = (await s.service({ namespace: 'alpha', name: 'db', backends: [A2] })).clusterIPs;
      await s.service({ namespace: 'alpha', name: 'web-np', backends: [A1], type: 'NodePort', nodePort: WEB_NODEPORT, externalTrafficPolicy: 'Cluster' });
      await s.service({ namespace: 'alpha', name: 'web-local', backends: [A1], type: 'NodePort', nodePort: LOCAL_NODEPORT, externalTrafficPolicy: 'Local' });
    });
    after(async () => {
      await s?.stop();
    });

    /** Through the Service and straight to the pod, in every family both ends have. */
    const viaServiceAndDirect = (from: string, to: string, service: string, expect: boolean, why: string, protos: readonly ProbeProto[] = ['tcp']): ReachCase[] =>
      FAMILIES.filter((f) => ip(from, f) && ip(to, f)).flatMap((f) =>
        protos.flatMap((proto) => [
          { from, ip: svc[service][f]!, port: SERVICE_PORT, proto, expect: expect ? to : null, why: `${why}, IPv${f} via Service ${service}` },
          { from, ip: ip(to, f)!, port: TARGET_PORT, proto, expect: expect ? to : null, why: `${why}, IPv${f} direct` },
        ]),
      );

    test('ClusterIP: the backend’s ingress policy decides a Service connection as it decides a direct one, same node and cross node', async () => {
      await s.setPolicies(policyObject('alpha', 'web-from-team-b', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }] }] }));
      await s.expectReach('a1 admits team b only', [
        ...viaServiceAndDirect(B1, A1, 'web', true, 'b1 same node, team b', ['tcp', 'udp']),
        ...viaServiceAndDirect(G1, A1, 'web', false, 'g1 same node, no team'),
        ...viaServiceAndDirect(B2, A1, 'web', true, 'b2 cross node, team b', ['tcp', 'udp']),
        ...viaServiceAndDirect(A2, A1, 'web', false, 'a2 cross node, team a', ['tcp', 'udp']),
      ]);
      // The other way round, to a backend on node-b: nothing isolates a2, so all pass.
      await s.expectReach('a2 not isolated', [...viaServiceAndDirect(A1, A2, 'db', true, 'a1 cross node'), ...viaServiceAndDirect(B2, A2, 'db', true, 'b2 same node')]);
    });

    test('ClusterIP: the client’s egress policy applies to the backend pod the Service picks, never to the ClusterIP', async () => {
      const b1Egress = (to: unknown[]) => policyObject('beta', 'b1-out', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'], egress: [{ to }] });
      await s.setPolicies(b1Egress([{ namespaceSelector: { matchLabels: { team: 'a' } }, podSelector: { matchLabels: { app: 'db' } } }]));
      await s.expectReach('b1 may reach alpha db pods only', [
        ...viaServiceAndDirect(B1, A2, 'db', true, 'backend a2 (cross node) allowed', ['tcp', 'udp']),
        ...viaServiceAndDirect(B1, A1, 'web', false, 'backend a1 (same node) not allowed', ['tcp', 'udp']),
      ]);
      // The ClusterIP ranges themselves allowed, and a1's own addresses: only web's backend is.
      const serviceCIDRs = [{ ipBlock: { cidr: '10.96.0.0/16' } }, { ipBlock: { cidr: 'fd00:10:96::/112' } }];
      const a1Blocks = FAMILIES.map((f) => ({ ipBlock: { cidr: `${ip(A1, f)}/${f === 4 ? 32 : 128}` } }));
      await s.setPolicies(b1Egress([...serviceCIDRs, ...a1Blocks]));
      await s.expectReach('b1 may reach the Service CIDRs and a1', [
        ...viaServiceAndDirect(B1, A1, 'web', true, 'backend a1 allowed by ipBlock', ['tcp', 'udp']),
        ...viaServiceAndDirect(B1, A2, 'db', false, 'backend a2 not allowed although its ClusterIP is', ['tcp', 'udp']),
      ]);
      await s.setPolicies(b1Egress(serviceCIDRs));
      await s.expectReach('b1 may reach the Service CIDRs only', [
        ...viaServiceAndDirect(B1, A1, 'web', false, 'no backend allowed'),
        ...viaServiceAndDirect(B1, A2, 'db', false, 'no backend allowed'),
      ]);
    });

    test('a pod reaches itself through its own Service (hairpin) even when isolated both ways', async () => {
      await s.setPolicies(policyObject('alpha', 'web-isolated', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Ingress', 'Egress'] }));
      const cases: ReachCase[] = FAMILIES.flatMap((f) =>
        (['tcp', 'udp'] as const).flatMap((proto) => [
          { from: A1, ip: svc.web[f]!, port: SERVICE_PORT, proto, expect: A1, why: `a1 to itself via its Service, IPv${f}` },
          // The isolation is real: others cannot come in, and a1 cannot go out.
          { from: B1, ip: svc.web[f]!, port: SERVICE_PORT, proto, expect: null, why: `b1 to isolated a1 via the Service, IPv${f}` },
          { from: A1, ip: svc.db[f]!, port: SERVICE_PORT, proto, expect: null, why: `isolated a1 to a2 via the Service, IPv${f}` },
        ]),
      );
      await s.expectReach('a1 isolated both ways', cases);
    });

    test('a pod given a deleted backend’s address inherits none of the flows that reached the old pod through a Service', async () => {
      // A flow through a Service is tracked with the ClusterIP as its original destination: the
      // backend's address is only its reply source. The EndpointSlice still lists the address
      // afterwards, as it may for a while after a real deletion.
      const ip = '10.244.1.72';
      const gone: PodDef = { namespace: 'alpha', name: 'gone', node: 'node-a', ips: [ip], labels: { app: 'gone' }, ports: [] };
      const heir: PodDef = { ...gone, name: 'heir', labels: { app: 'heir' } };
      // The heir may neither receive nor send: whatever passes went through an old flow.
      await s.setPolicies(policyObject('alpha', 'isolate-heir', { podSelector: { matchLabels: { app: 'heir' } }, policyTypes: ['Ingress', 'Egress'] }));
      await s.addPod(gone);
      const senders = [B1, A2].map((k) => s.endpoint(k)); // same node, other node
      const a2 = senders[1];
      try {
        const goneIP = (await s.service({ namespace: 'alpha', name: 'gone', backends: ['alpha/gone'] })).clusterIPs[4]!;
        await s.expectReach('gone behind its Service', [{ from: B1, ip: goneIP, port: SERVICE_PORT, proto: 'udp', expect: 'alpha/gone', why: 'b1 via Service gone' }]);
        await s.forgetFlows();
        const SOURCE_PORT = 40126;
        for (const e of senders) await sendUdp(e.netns, ip4(e), goneIP, SERVICE_PORT, 1, { fromPort: SOURCE_PORT, awaitReply: true });
        // And a flow gone opened itself, through db's Service to a2.
        const OWN_PORT = 40127;
        await sendUdp(s.endpoint('alpha/gone').netns, ip, svc.db[4]!, SERVICE_PORT, 1, { fromPort: OWN_PORT, awaitReply: true });
        const nodeA = s.netns('node-a');
        assert.equal(await flowsTo(nodeA, ip), senders.length, 'node-a tracks both flows to gone');
        await s.removePod('alpha/gone');
        // The agent deletes them beside its loop, after the write that stops dispatching the address.
        for (let i = 0; (await flowsTo(nodeA, ip)) > 0; i++) {
          assert.ok(i < 100, "node-a still tracks the deleted pod's flows 5 s after its removal was applied");
          await sleep(50);
        }
        await s.addPod(heir);
        // Until node-a dispatches the heir's address, it drops everything to and from it, old
        // flows too: wait for its dispatch rule, so that what follows tests the heir's own chains.
        for (let i = 0; !(await iptablesSave(nodeA, opts.backend, 4, 'mangle')).split('\n').some((l) => l.includes(`-d ${ip}/32`) && l.includes('-g cali-tw-')); i++) {
          assert.ok(i < 100, 'node-a does not dispatch the heir 5 s after its creation');
          await sleep(50);
        }
        const h = s.endpoint('alpha/heir');
        for (const e of senders) await watchArrivals(h.netns, ip4(e), TARGET_PORT);
        for (const e of senders) await sendUdp(e.netns, ip4(e), goneIP, SERVICE_PORT, 5, { fromPort: SOURCE_PORT });
        await watchArrivals(a2.netns, ip, TARGET_PORT);
        await sendUdp(h.netns, ip, svc.db[4]!, SERVICE_PORT, 5, { fromPort: OWN_PORT });
        await sleep(200);
        const arrived = Object.fromEntries(await Promise.all(senders.map(async (e) => [`${e.key} -> heir`, await countArrivals(h.netns, ip4(e), TARGET_PORT)] as const)));
        arrived[`heir -> ${A2}`] = await countArrivals(a2.netns, ip, TARGET_PORT);
        assert.deepEqual(arrived, { [`${B1} -> heir`]: 0, [`${A2} -> heir`]: 0, [`heir -> ${A2}`]: 0 });
      } finally {
        await unwatchArrivals(a2.netns, ip, TARGET_PORT);
        await s.k.kubectl(['delete', 'service/gone', 'endpointslice/gone-ipv4', '-n', 'alpha', '--ignore-not-found']);
        await s.removeAddedPods();
      }
    });

    describe('NodePort from the external host', () => {
      const np = (node: string, port: number, f: Family, expect: boolean, why: string): ReachCase => ({
        from: EXTERNAL_KEY,
        ip: NODE_IPS[node][f],
        port,
        expect: expect ? A1 : null,
        why: `${why}, IPv${f}`,
      });
      const clusterLocal = (f: Family, expect: boolean) => np('node-a', WEB_NODEPORT, f, expect, 'Cluster policy, backend on the receiving node');
      const clusterRemote = (f: Family, expect: boolean) => np('node-b', WEB_NODEPORT, f, expect, 'Cluster policy, backend on the other node');
      const localLocal = (f: Family, expect: boolean) => np('node-a', LOCAL_NODEPORT, f, expect, 'Local policy, backend on the receiving node');
      const webFrom = (name: string, peers: unknown[]) => policyObject('alpha', name, { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: peers }] });

      test('the address a backend’s ipBlock rules match: the client’s, except with Cluster policy through another node (that node’s)', async () => {
        await s.setPolicies(webFrom('from-external', blocks(EXTERNAL_IPS)));
        await s.expectReach(
          'a1 admits the external host',
          FAMILIES.flatMap((f) => [clusterLocal(f, true), clusterRemote(f, false), localLocal(f, true)]),
        );
        await s.setPolicies(webFrom('from-node-b', blocks(NODE_IPS['node-b'])));
        await s.expectReach(
          'a1 admits node-b',
          FAMILIES.flatMap((f) => [clusterLocal(f, false), clusterRemote(f, true), localLocal(f, false)]),
        );
        // What a1 itself sees after a masquerade on its own node is the bridge's address: not
        // what policy matched (FORWARD comes before POSTROUTING's masquerade).
        await s.setPolicies(webFrom('from-gateway', blocks(GATEWAYS['node-a'])));
        await s.expectReach(
          'a1 admits its gateway only',
          FAMILIES.flatMap((f) => [clusterLocal(f, false), clusterRemote(f, false), localLocal(f, false)]),
        );
        // Local policy through a node without a local endpoint: kube-proxy drops it itself.
        await s.setPolicies();
        await s.expectReach('no policy', [
          ...FAMILIES.flatMap((f) => [clusterLocal(f, true), clusterRemote(f, true), localLocal(f, true)]),
          ...FAMILIES.map((f) => np('node-b', LOCAL_NODEPORT, f, false, 'Local policy, no endpoint on the receiving node')),
        ]);
      });

      test('the address the backend pod itself sees (masqueraded with Cluster policy), while Weir’s mark bits are in use', async () => {
        // a1 isolated, admitting the external host and node-b: every flow below crosses Weir's
        // policy chains, which set Weir's accept bit, and is still masqueraded by kube-proxy's
        // 0x4000 bit when its policy says so.
        await s.setPolicies(webFrom('from-external-and-node-b', [...blocks(EXTERNAL_IPS), ...blocks(NODE_IPS['node-b'])]));
        const a1 = s.endpoint(A1);
        const seen = async (c: ReachCase): Promise<string> => {
          const before = await timeWaitPeers(a1.netns);
          await s.expectReach(c.why, [c]);
          for (let i = 0; i < 50; i++) {
            const fresh = [...(await timeWaitPeers(a1.netns))].filter((p) => !before.has(p));
            if (fresh.length === 1) return fresh[0].split(' ')[0];
            if (fresh.length > 1) assert.fail(`${c.why}: ${fresh.length} new connections seen by a1: ${fresh.join(', ')}`);
            await new Promise((r) => setTimeout(r, 20));
          }
          return assert.fail(`${c.why}: a1 saw no connection`);
        };
        for (const f of FAMILIES) {
          assert.equal(await seen(clusterLocal(f, true)), GATEWAYS['node-a'][f], `IPv${f} Cluster, local backend: masqueraded to node-a's bridge address`);
          assert.equal(await seen(clusterRemote(f, true)), NODE_IPS['node-b'][f], `IPv${f} Cluster, remote backend: masqueraded to node-b's address`);
          assert.equal(await seen(localLocal(f, true)), EXTERNAL_IPS[f], `IPv${f} Local: the client's own address`);
        }
      });
    });

    test('marks: kube-proxy’s bits 0x4000 and 0x8000 pass Weir’s chains unchanged while Weir’s accept bit is set', async () => {
      await s.setPolicies(policyObject('alpha', 'web-from-external', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: blocks(EXTERNAL_IPS) }] }));
      const ns = s.netns('node-a');
      // Instruments in node-a's mangle table (its own namespace): 0x8000 set on the NodePort
      // flow before kube-proxy marks it 0x4000 for masquerade; a counter after FORWARD (and
      // Weir) for packets to a1 carrying both bits and Weir's accept bit.
      const tag = 'weir-test-marks';
      const rules = (op: '-A' | '-D', f: Family) => [
        ['-t', 'mangle', op, 'PREROUTING', '-p', 'tcp', '--dport', String(WEB_NODEPORT), '-m', 'comment', '--comment', tag, '-j', 'MARK', '--set-xmark', '0x8000/0x8000'],
        ['-t', 'mangle', op, 'POSTROUTING', '-d', ip(A1, f)!, '-p', 'tcp', '--dport', '80', '-m', 'mark', '--mark', '0x1c000/0x1c000', '-m', 'comment', '--comment', tag],
      ];
      const tool = (f: Family) => `${f === 4 ? 'iptables' : 'ip6tables'}-${opts.backend}`;
      for (const f of FAMILIES) for (const r of rules('-A', f)) await execa('ip', ['netns', 'exec', ns, tool(f), ...r]);
      try {
        await s.expectReach(
          'masqueraded NodePort flow to isolated a1',
          FAMILIES.map((f) => ({ from: EXTERNAL_KEY, ip: NODE_IPS['node-a'][f], port: WEB_NODEPORT, expect: A1, why: `IPv${f}` })),
        );
        for (const f of FAMILIES) {
          const c = await execa('ip', ['netns', 'exec', ns, tool(f), '-t', 'mangle', '-L', 'POSTROUTING', '-v', '-n', '-x']);
          const line = c.stdout.split('\n').find((l) => l.includes(tag));
          const packets = Number(line?.trim().split(/\s+/)[0]);
          assert.ok(packets > 0, `IPv${f}: no packet to a1 carried 0x8000, 0x4000 and Weir's 0x10000 after FORWARD:\n${c.stdout}`);
        }
      } finally {
        for (const f of FAMILIES) for (const r of rules('-D', f)) await execa('ip', ['netns', 'exec', ns, tool(f), ...r], { reject: false });
      }
      // kube-proxy v1.35 itself no longer uses 0x8000 (no KUBE-MARK-DROP); say so if that changes.
      for (const node of ['node-a', 'node-b']) {
        const all = (await Promise.all(FAMILIES.map((f) => iptablesSave(s.netns(node), opts.backend, f)))).join('\n') + (await kubeProxyTable(s.netns(node), 4));
        assert.doesNotMatch(all, /0x8000/, `${node}: kube-proxy now uses the drop mark 0x8000`);
      }
    });

    test('coexistence: restarting kube-proxy never moves Weir’s hooks or chains; Weir’s resyncs never touch kube-proxy’s rules', async () => {
      const ns = s.netns('node-a');
      const weirState = async () =>
        (await Promise.all(FAMILIES.map(async (f) => (await iptablesSave(ns, opts.backend, f, 'mangle')) + (await iptablesSave(ns, opts.backend, f, 'filter'))))).map((t) =>
          t
            .split('\n')
            .filter((l) => /cali-|weir:/.test(l))
            .join('\n'),
        );
      const kubeState = async () => JSON.stringify(await Promise.all(FAMILIES.map(async (f) => [kubeLines(await iptablesSave(ns, opts.backend, f)), await kubeProxyTable(ns, f)])));
      await s.setPolicies(policyObject('alpha', 'web-from-team-b', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }] }] }));
      await s.expectReach('policy in force', [...viaServiceAndDirect(B1, A1, 'web', true, 'b1'), ...viaServiceAndDirect(A2, A1, 'web', false, 'a2')]);
      const agent = s.k.agents.find((a) => a.node === 'node-a')!;
      await agent.settled(10_000); // the tidy after the policy's write changes Weir's chains on its own
      const weirBefore = await weirState();
      // Restart: watch FORWARD the whole time.
      const proxy = s.proxies.get('node-a')!;
      let moved = '';
      let watching = true;
      const watcher = (async () => {
        while (watching) {
          for (const f of FAMILIES) {
            // The hook into Weir's chains (mangle), and its accept hook (filter).
            for (const table of ['mangle', 'filter']) {
              const fwd = chainRules(await iptablesSave(ns, opts.backend, f, table), table, 'FORWARD');
              if (hookIndex(fwd) !== 0) moved ||= `IPv${f} ${table} FORWARD: ${fwd.join(' | ')}`;
            }
          }
          await new Promise((r) => setTimeout(r, 20));
        }
      })();
      await proxy.stop();
      proxy.start();
      await s.waitProxiesSynced();
      await new Promise((r) => setTimeout(r, 1500)); // a second sync of its own, after its first
      watching = false;
      await watcher;
      assert.equal(moved, '', 'Weir’s hook left FORWARD position 1 during a kube-proxy restart');
      assert.deepEqual(await weirState(), weirBefore, 'Weir’s chains changed during a kube-proxy restart');

      // Weir's resyncs (a policy change, then a drift repair) leave kube-proxy's rules as they were.
      const kubeBefore = await kubeState();
      await s.setPolicies(policyObject('alpha', 'web-from-team-a', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } } }] }] }));
      await s.expectReach('new policy in force', [...viaServiceAndDirect(B1, A1, 'web', false, 'b1'), ...viaServiceAndDirect(A2, A1, 'web', true, 'a2')]);
      const resynced = agent.waitFor((r) => r.msg === 'resynced dataplane', 15_000, 'a drift repair');
      await execa('ip', ['netns', 'exec', ns, `iptables-${opts.backend}`, '-t', 'mangle', '-D', 'FORWARD', '-m', 'comment', '--comment', 'weir:hook', '-j', 'cali-FORWARD']);
      await resynced;
      assert.equal(await kubeState(), kubeBefore, 'Weir changed kube-proxy’s rules');
    });

    test('kube-proxy inserting its jumps above Weir’s filter rule (first start, or after --cleanup) never lets denied masqueraded NodePort traffic through', async () => {
      // a1 admits nothing; the external host's NodePort flow through node-a is masqueraded
      // (0x4000), and KUBE-FORWARD accepts such packets in filter FORWARD, above any rule that
      // comes after its jump. Weir must have decided before filter FORWARD.
      await s.setPolicies(policyObject('alpha', 'web-isolated', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Ingress'] }));
      const denied: ReachCase = { from: EXTERNAL_KEY, ip: NODE_IPS['node-a'][4], port: WEB_NODEPORT, expect: null, why: 'NodePort to isolated a1' };
      await s.expectReach('a1 isolated', [denied, { ...denied, ip: NODE_IPS['node-b'][4], why: 'through node-b' }]);
      const ns = s.netns('node-a');
      const proxy = s.proxies.get('node-a')!;
      const kubeJumpFirst = async () => (chainRules(await iptablesSave(ns, opts.backend, 4, 'filter'), 'filter', 'FORWARD')[0] ?? '').includes('KUBE-');
      await proxy.stop();
      await proxy.cleanup();
      assert.equal(await kubeJumpFirst(), false, 'kube-proxy’s jumps gone after --cleanup');
      const t0 = performance.now();
      let above: number | undefined;
      let aboveMs = 0;
      let done = false;
      const watcher = (async () => {
        while (!done) {
          const first = await kubeJumpFirst();
          const now = performance.now() - t0;
          if (first) {
            above ??= now;
            aboveMs = now - above;
          }
          await new Promise((r) => setTimeout(r, 10));
        }
      })();
      // Probes one after another; each is a new TCP connection (a new SYN to police).
      const passed: { at: number; ms: number }[] = [];
      let probes = 0;
      const prober = (async () => {
        while (!done) {
          const at = performance.now() - t0;
          const r = await s.probe(EXTERNAL_KEY, NODE_IPS['node-a'][4], WEB_NODEPORT, 'tcp', 300);
          probes++;
          if (r.ok) passed.push({ at: Math.round(at), ms: Math.round(performance.now() - t0 - at) });
        }
      })();
      proxy.start();
      await s.waitProxiesSynced();
      // Probe through more than one hook-check interval: a repair of Weir's own must not be
      // what closes the door.
      await new Promise((r) => setTimeout(r, HOOK_CHECK_MS + 1_500));
      done = true;
      await Promise.all([watcher, prober]);
      process.stdout.write(
        `# ${opts.mode}/${opts.backend}: ${
          above === undefined ? "kube-proxy's jumps never first in filter FORWARD" : `kube-proxy's jumps first in filter FORWARD from ${Math.round(above)} ms, for at least ${Math.round(aboveMs)} ms`
        }; ${probes} probes, denied NodePort probes let through (start ms): ${passed.map((p) => p.at).join(', ') || 'none'}\n`,
      );
      assert.ok(probes > 10, `only ${probes} probes sent`);
      if (opts.mode === 'nftables') {
        // Its own tables: iptables' FORWARD never changes.
        assert.equal(above, undefined, 'kube-proxy in nftables mode changed iptables’ FORWARD');
      } else {
        assert.ok(above !== undefined, 'kube-proxy never inserted its jumps above Weir’s filter rule');
      }
      assert.deepEqual(passed, [], 'denied NodePort probes let through');
    });
  });
}
