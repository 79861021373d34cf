// The uninstall signal between `weir uninstall` and the running agents, on a real API server
// with real packets: the annotation on the agents' DaemonSet makes every agent remove Weir's
// rules and say so; taking it away makes them exit, to be started again and enforce; an agent
// that starts while the annotation is there enforces nothing. (helm.test.ts runs the whole
// hook from the chart; this covers what it does not reach.)

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { A1, A2 } from '../conformance/harness.ts';
import { eventually } from '../support/eventually.ts';
import { run } from '../support/run.ts';
import { type Cell, KubeIntegration, policyObject } from './kube-harness.ts';

const ANNOTATION = 'weir.dev/uninstall';

describe('the uninstall signal on the agents’ DaemonSet', () => {
  let k: KubeIntegration;
  before(async () => {
    k = await KubeIntegration.start({ daemonSet: true, controller: true });
  });
  after(async () => {
    await k?.stop();
  });

  const onlyAlpha = (c: Cell) => c.target !== A1 || c.source === A1 || c.source === A2;
  const weirRules = async (): Promise<string[]> => {
    const found: string[] = [];
    for (const node of k.cluster.nodes) {
      for (const save of ['iptables-nft-save', 'ip6tables-nft-save', 'iptables-legacy-save', 'ip6tables-legacy-save']) {
        const r = await run('ip', ['netns', 'exec', node.netns, save]);
        if (/weir:|cali-/.test(r.stdout)) found.push(`${node.name} ${save}`);
      }
    }
    return found;
  };
  const removedFor = async (node: string): Promise<string | undefined> =>
    (JSON.parse(await k.kubectl(['get', 'nodepolicystatus', node, '-o', 'json'])) as { status?: { removedFor?: string } }).status?.removedFor;

  test('annotated: every agent removes every rule of Weir’s, says so in its NodePolicyStatus, and the pods are open', async () => {
    await k.apply(policyObject('alpha', 'web-from-alpha', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: {} }] }] }));
    await k.expect(onlyAlpha, 'policy enforced');
    const removed = k.agents.map((a) => a.waitFor((r) => r.msg === 'removed everything Weir owned', 15_000, 'removal'));
    await k.kubectl(['annotate', 'daemonset', 'weir', '-n', 'kube-system', `${ANNOTATION}=t-1`]);
    await Promise.all(removed);
    for (const node of ['node-a', 'node-b'])
      await eventually(
        `NodePolicyStatus ${node} removedFor`,
        () => removedFor(node),
        (t) => t === 't-1',
      );
    await k.expect(() => true, 'nothing enforced');
    assert.deepEqual(await weirRules(), []);
    // The controller stopped too: it let go of its Lease.
    await eventually(
      'the controller Lease released',
      async () => JSON.parse(await k.kubectl(['get', 'lease', 'weir-controller', '-n', 'kube-system', '-o', 'json'])) as { spec: { holderIdentity?: string } },
      (l) => !l.spec.holderIdentity,
    );
  });

  test('the annotation taken away (the uninstall called off): agents and controller exit, and agents started again enforce', async () => {
    const exits = [...k.agents, ...k.controllers].map((p) => new Promise<number | null>((resolve) => p.child.once('exit', (code) => resolve(code))));
    await k.kubectl(['annotate', 'daemonset', 'weir', '-n', 'kube-system', `${ANNOTATION}-`]);
    assert.deepEqual(await Promise.all(exits), [1, 1, 1]);
    assert.ok(k.agents.every((a) => a.log.some((l) => /was called off/.test(l))));
    const restarted = k.cluster.nodes.map((n) => k.startAgent(n.name));
    await Promise.all(restarted.map((a) => a.waitFor((r) => r.msg === 'resynced dataplane', 30_000, 'first sync')));
    await k.expect(onlyAlpha, 'enforced again');
  });

  test('an agent that starts while the DaemonSet asks for an uninstall enforces nothing', async () => {
    const node = k.cluster.nodes[0]!.name;
    const running = k.agents.filter((a) => a.node === node && !a.exited);
    const removed = running.map((a) => a.waitFor((r) => r.msg === 'removed everything Weir owned', 15_000, 'removal'));
    await k.kubectl(['annotate', 'daemonset', 'weir', '-n', 'kube-system', `${ANNOTATION}=t-2`]);
    await Promise.all(removed);
    for (const a of running) await a.stop();
    const late = k.startAgent(node);
    await late.waitFor((r) => r.msg === 'removed everything Weir owned', 15_000, 'removal at start');
    assert.ok(late.log.some((l) => /asks for an uninstall: enforcing nothing/.test(l)));
    await new Promise((r) => setTimeout(r, 1_000));
    assert.deepEqual(
      (await weirRules()).filter((w) => w.startsWith(node)),
      [],
    );
    assert.equal(await removedFor(node), 't-2');
  });
});
