// Faults a real API server produces (restarts, 410 Gone after history is lost) and ones it
// will not produce on demand (a stalled watch, via the bridge): enforcement stays correct
// throughout and recovers without restarting the agent.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { A1, A2, B1, B2, G1 } from '../conformance/harness.ts';
import { eventually } from '../support/eventually.ts';
import { KubeIntegration, policyObject, type Cell } from './kube-harness.ts';

const WATCHDOG_S = 3;

describe('kube faults', () => {
  let k: KubeIntegration;
  before(async () => {
    k = await KubeIntegration.start({ args: ['--watch-idle-timeout', String(WATCHDOG_S)] });
  });
  after(async () => {
    await k?.stop();
  });

  const onlyFrom = (srcs: string[]) => (c: Cell) => c.target !== A1 || c.source === A1 || srcs.includes(c.source);
  const allowFrom = (...apps: string[]) =>
    policyObject('alpha', 'a1-ingress', {
      podSelector: { matchLabels: { app: 'web' } },
      ingress: [{ from: apps.map((app) => ({ namespaceSelector: {}, podSelector: { matchLabels: { app } } })) }],
    });

  test('the API server restarts: enforcement holds while it is down, and later changes are enforced', async () => {
    await k.apply(allowFrom('web'));
    await k.expect(onlyFrom([B1, G1]), 'before the restart');
    const restarted = k.cp.restartApiServer();
    // While the API server is away the kernel keeps enforcing the last state.
    await k.expect(onlyFrom([B1, G1]), 'during the restart', 2000);
    await restarted;
    await k.apply(allowFrom('web', 'db'));
    await k.expect(onlyFrom([B1, G1, B2, A2]), 'after the restart', 20_000);
    assert.ok(k.agents.every((a) => !a.exited));
  });

  test('a stalled watch is restarted by the watchdog and the change it missed is enforced', async () => {
    await k.apply(allowFrom('web'));
    await k.expect(onlyFrom([B1, G1]), 'before the stall');
    // An agent drops its connection pool when a watchdog restarts a watch (every 3 s of silence
    // here), so a node can be between connections for a moment: stall only once every node has
    // one open, checked and frozen in the same tick.
    const bridges = [...k.bridges.values()];
    const frozen = await eventually(
      "a connection open through every node's bridge, then frozen",
      async () => (bridges.every((b) => b.openConnections() > 0) ? bridges.map((b) => b.stallOpenConnections()) : []),
      (f) => f.length > 0,
      5_000,
    );
    assert.ok(
      frozen.every((n) => n >= 1),
      `expected every node's watch connections to freeze, got ${frozen.join(', ')}`,
    );
    const t0 = Date.now();
    await k.apply(allowFrom('web', 'db'));
    try {
      await k.expect(onlyFrom([B1, G1, B2, A2]), 'after the stall', 20_000);
    } catch (e) {
      console.log(k.agents[0].log.slice(-40).join('\n'));
      throw e;
    }
    console.log(`missed change enforced ${Date.now() - t0} ms after the stall (watchdog ${WATCHDOG_S} s)`);
  });

  test('410 Gone after history is lost: the relist repairs a deletion the agent never saw', async () => {
    await k.apply(allowFrom('web'), policyObject('beta', 'deny-b1', { podSelector: { matchLabels: { app: 'web' } } }));
    const both = (c: Cell) => onlyFrom([B1, G1])(c) && (c.target !== B1 || c.source === B1);
    await k.expect(both, 'two policies');
    // Cut the agents off, delete a policy, compact etcd's history past that deletion and
    // restart the API server (its watch cache starts after it): resuming from the old
    // resourceVersion can only get 410 Gone.
    const relisted = Promise.all(
      k.agents.map((a) => a.waitFor((r) => typeof r.msg === 'string' && r.msg.startsWith('NetworkPolicy relist repaired') && String(r.why).includes('410'), 60_000, 'a relist after 410 Gone')),
    );
    for (const b of k.bridges.values()) b.setBlocked(true);
    await k.kubectl(['delete', 'networkpolicy', 'deny-b1', '-n', 'beta']);
    await k.kubectl(['label', 'namespace', 'gamma', 'moved=on']); // history after the delete
    await k.cp.compactEtcd();
    await k.cp.restartApiServer();
    for (const b of k.bridges.values()) b.setBlocked(false);
    await k.expect(onlyFrom([B1, G1]), 'deletion repaired by relist', 30_000);
    await relisted;
  });
});

describe('RBAC denies status writes', () => {
  let k: KubeIntegration;
  before(async () => {
    k = await KubeIntegration.start();
  });
  after(async () => {
    await k?.stop();
  });

  test('an agent that may read but not write status still enforces, and says what it lacks', async () => {
    // A service account that can read what Weir watches, and nothing else.
    await k.apply(
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'weir-readonly', namespace: 'kube-system' } },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRole',
        metadata: { name: 'weir-readonly' },
        rules: [
          { apiGroups: [''], resources: ['pods', 'namespaces', 'nodes'], verbs: ['get', 'list', 'watch'] },
          { apiGroups: ['networking.k8s.io'], resources: ['networkpolicies'], verbs: ['get', 'list', 'watch'] },
          { apiGroups: ['policy.networking.k8s.io'], resources: ['clusternetworkpolicies'], verbs: ['get', 'list', 'watch'] },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: { name: 'weir-readonly' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'weir-readonly' },
        subjects: [{ kind: 'ServiceAccount', name: 'weir-readonly', namespace: 'kube-system' }],
      },
    );
    const kubeconfig = await k.serviceAccountKubeconfig('weir-readonly', 'kube-system', 'readonly.kubeconfig');
    const old = k.agents.findIndex((a) => a.node === 'node-b');
    await k.agents[old].stop();
    k.agents.splice(old, 1);
    const agent = k.startAgent('node-b', { kubeconfig });
    const denied = agent.waitFor((r, line) => (r.level ?? 0) >= 40 && /forbidden|403/i.test(line) && /status/i.test(line), 30_000, 'a warning that status writes are forbidden');
    await agent.waitFor((r) => r.msg === 'resynced dataplane', 30_000, 'first sync');
    await k.apply(policyObject('alpha', 'db-deny', { podSelector: { matchLabels: { app: 'db' } } }));
    await k.expect((c) => c.target !== A2 || c.source === A2, 'a2 (node-b) isolated by an agent without status rights');
    const warning = await denied;
    console.log(`warning: ${String(warning.msg).slice(0, 200)}`);
    assert.ok(!agent.exited);
    assert.equal(agent.errors.length, 0, agent.errors.join('\n'));
  });
});
