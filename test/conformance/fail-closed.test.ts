// Conformance with real packets: Weir fails closed for addresses it does not know. A pod whose
// IP has not reached Weir can neither send nor receive; once it does, it is enforced within a
// measured time; a pod sending with another pod's address is dropped; hostNetwork and node
// traffic are never affected (node-traffic.test.ts covers the node itself).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { inNs } from '../../src/sim/netns.ts';
import { openProbeClient } from '../../src/sim/prober.ts';
import { FAIL_CLOSED_SCENARIOS, LATE_POD, playScenario } from './explain-scenarios.ts';
import { A1, A2, B1, Conformance, np, type PodDef } from './harness.ts';
import { flowsTo } from '../support/conntrack.ts';
import { countArrivals, sendUdp, spoofIntoEstablishedFlow, unwatchArrivals, watchArrivals } from './spoofing.ts';

const NEW = LATE_POD;
const LATE = `${NEW.namespace}/${NEW.name}`;

describe('fail closed for unknown addresses', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wfcl');
  });
  after(async () => {
    await c?.stop();
  });

  for (const s of FAIL_CLOSED_SCENARIOS) test(s.name, () => playScenario(c, s));

  test('a new pod is enforced within 200 ms of its IP reaching Weir (measured)', async () => {
    await c.reset();
    await c.cluster.addPod({ namespace: NEW.namespace, name: NEW.name, node: NEW.node, ips: NEW.ips });
    const target = c.cluster.endpoint(A2)!;
    const late = c.cluster.endpoint(LATE)!;
    try {
      const client = await openProbeClient(late);
      try {
        const probe = async () => (await client.probe({ proto: 'tcp', ip: target.ips[0], port: 80, timeoutMs: 100 })).ok;
        assert.equal(await probe(), false, 'the unknown pod reached a pod before Weir knew it');
        const t0 = performance.now();
        c.pods.set(LATE, { ...NEW });
        const settled = c.writeManifests();
        let elapsed = -1;
        while (performance.now() - t0 < 5_000) {
          if (await probe()) {
            elapsed = performance.now() - t0;
            break;
          }
        }
        await settled;
        console.log(`# new pod: manifest written -> first allowed connection in ${elapsed.toFixed(0)} ms`);
        assert.ok(elapsed >= 0, 'the pod never became reachable');
        assert.ok(elapsed < 1_000, `took ${elapsed.toFixed(0)} ms`);
      } finally {
        client.close();
      }
      await c.expect(() => true, 'once known, the pod is policed like any other (no policy: open)');
    } finally {
      await c.removePod(LATE);
    }
  });

  test("a pod sending with another pod's address is dropped, same-node and cross-node", async () => {
    await c.reset();
    await c.addPod({ namespace: 'beta', name: 'near', node: 'node-a', ips: ['10.244.1.61'], labels: {}, ports: [] });
    const b1 = c.cluster.endpoint(B1)!;
    const a1ip = c.cluster.endpoint(A1)!.ips[0];
    const b1ip = b1.ips[0];
    const targets = [c.cluster.endpoint('beta/near')!, c.cluster.endpoint(A2)!, c.cluster.external!];
    const PORT = 7777;
    for (const t of targets) {
      for (const src of [a1ip, b1ip]) await watchArrivals(t.netns, src, PORT);
    }
    // b1 claims a1's address beside its own (a pod with NET_ADMIN could).
    await inNs(b1.netns, 'ip', ['addr', 'add', `${a1ip}/32`, 'dev', 'eth0']);
    try {
      for (const t of targets) {
        const to = t.ips.find((ip) => !ip.includes(':'))!;
        await sendUdp(b1.netns, b1ip, to, PORT, 5);
        await sendUdp(b1.netns, a1ip, to, PORT, 5);
        await new Promise((r) => setTimeout(r, 200));
        // The observer sees b1's own packets, so it could see spoofed ones.
        assert.equal(await countArrivals(t.netns, b1ip, PORT), 5, `${t.key}: b1's own datagrams must arrive`);
        assert.equal(await countArrivals(t.netns, a1ip, PORT), 0, `${t.key}: datagrams from b1 claiming ${a1ip} must be dropped`);
      }
    } finally {
      await inNs(b1.netns, 'ip', ['addr', 'del', `${a1ip}/32`, 'dev', 'eth0']).catch(() => undefined);
      for (const t of targets) {
        for (const src of [a1ip, b1ip]) await unwatchArrivals(t.netns, src, PORT);
      }
    }
    await c.expect(() => true, 'a1 and b1 themselves are unaffected');
    await c.removePod('beta/near');
  });

  test("a new pod given a deleted pod's address inherits none of its flows", async () => {
    await c.reset();
    const ip = '10.244.1.71';
    const gone: PodDef = { namespace: 'alpha', name: 'gone', node: 'node-a', ips: [ip], labels: { app: 'gone' }, ports: [] };
    const heir: PodDef = { ...gone, name: 'heir', labels: { app: 'heir' } };
    // The heir may neither receive nor send: whatever passes went through an old flow.
    await c.setPolicies(np('alpha', 'isolate-heir', { podSelector: { matchLabels: { app: 'heir' } }, policyTypes: ['Ingress', 'Egress'] }));
    await c.addPod(gone);
    const senders = [B1, A2].map((k) => c.cluster.endpoint(k)!); // same node, other node
    const SOURCE_PORT = 40124;
    for (const s of senders) await sendUdp(s.netns, s.ips[0], ip, 80, 1, { fromPort: SOURCE_PORT, awaitReply: true });
    // And a flow the deleted pod opened itself (its address as the original source).
    const a2 = senders[1];
    const OWN_PORT = 40125;
    await sendUdp(c.cluster.endpoint('alpha/gone')!.netns, ip, a2.ips[0], 80, 1, { fromPort: OWN_PORT, awaitReply: true });
    const nodeA = c.nodeNetns('node-a');
    assert.equal(await flowsTo(nodeA, ip), senders.length, 'both flows are tracked on node-a');
    await c.removePod('alpha/gone');
    // The agent deletes them beside its loop, after the write that stops dispatching the address.
    for (let i = 0; (await flowsTo(nodeA, ip)) > 0; i++) {
      assert.ok(i < 100, "node-a still tracks the deleted pod's flows 5 s after its removal was written");
      await new Promise((r) => setTimeout(r, 50));
    }
    await c.addPod(heir);
    const h = c.cluster.endpoint('alpha/heir')!;
    for (const s of senders) await watchArrivals(h.netns, s.ips[0], 80);
    for (const s of senders) await sendUdp(s.netns, s.ips[0], ip, 80, 5, { fromPort: SOURCE_PORT });
    await new Promise((r) => setTimeout(r, 200));
    const arrived = Object.fromEntries(await Promise.all(senders.map(async (s) => [s.key, await countArrivals(h.netns, s.ips[0], 80)] as const)));
    assert.deepEqual(arrived, { [B1]: 0, [A2]: 0 });
    await watchArrivals(a2.netns, ip, 80);
    try {
      await sendUdp(h.netns, ip, a2.ips[0], 80, 5, { fromPort: OWN_PORT });
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(await countArrivals(a2.netns, ip, 80), 0, "the heir sent through the deleted pod's own flow");
    } finally {
      await unwatchArrivals(a2.netns, ip, 80);
    }
  });

  test("a pod sending with another pod's address into that pod's established flow is dropped", async () => {
    await c.reset();
    const through = await spoofIntoEstablishedFlow(c, A1, B1, [A2, c.cluster.external!.key]);
    assert.deepEqual(Object.fromEntries(through), { [A2]: 0, [c.cluster.external!.key]: 0 });
    await c.expect(() => true, 'a1 and b1 themselves are unaffected');
  });
});
