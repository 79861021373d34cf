// What Weir's agent may do in a cluster, on a real kube-apiserver: deploy/rbac.yaml grants
// exactly the verbs the source and the status writers use (the Lease by name, in kube-system
// only), and deploy/admission-policy.yaml lets an agent write only its own node's
// NodePolicyStatus, from the node name the API server puts into a pod-bound token.

import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { AuthorizationV1Api, KubeConfig } from '@kubernetes/client-node';
import { CommandError } from '../../src/errors.ts';
import { APPLY_PATCH, createKubeClient } from '../../src/kube/client.ts';
import { agentFieldManager, applyQuery, nodeStatusPath } from '../../src/status/bodies.ts';
import { createEventRecorder, createNodeStatusReporter, createPolicyStatusAggregator } from '../../src/status/index.ts';
import type { PassResult } from '../../src/status/index.ts';
import { captureLog, Results, until } from '../unit/status/fake-api.ts';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

const CRDS = fileURLToPath(new URL('../../crds/', import.meta.url));
const RBAC = fileURLToPath(new URL('../../deploy/rbac.yaml', import.meta.url));
const ADMISSION = fileURLToPath(new URL('../../deploy/admission-policy.yaml', import.meta.url));
const AGENT = 'system:serviceaccount:kube-system:weir';
const NS = 'weir-rbac-it';
const VERBS = ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete', 'deletecollection'] as const;

/** An agent's pod on NODE, as a DaemonSet would make it: its token is bound to this pod. */
const agentPod = (node: string) => ({
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: { name: `weir-${node}`, namespace: 'kube-system' },
  spec: { nodeName: node, serviceAccountName: 'weir', hostNetwork: true, containers: [{ name: 'agent', image: 'registry.invalid/weir' }] },
});

const lease = (namespace: string, name: string, holder?: string) => ({
  apiVersion: 'coordination.k8s.io/v1',
  kind: 'Lease',
  metadata: { name, namespace },
  spec: holder === undefined ? {} : { holderIdentity: holder, leaseDurationSeconds: 15 },
});

const nodeStatus = (node: string) => ({ apiVersion: 'weir.dev/v1alpha1', kind: 'NodePolicyStatus', metadata: { name: node } });

interface Row {
  readonly what: string;
  readonly group: string;
  readonly resource: string;
  readonly subresource?: string;
  readonly namespace?: string;
  readonly name?: string;
  readonly allowed: readonly (typeof VERBS)[number][];
}

// Every verb the code uses, and nothing else (src/sources/kube/resources.ts, src/status/*).
const GRANTS: readonly Row[] = [
  { what: 'pods (source: list+watch)', group: '', resource: 'pods', namespace: NS, allowed: ['list', 'watch'] },
  { what: 'pods/status', group: '', resource: 'pods', subresource: 'status', namespace: NS, allowed: [] },
  { what: 'namespaces (source)', group: '', resource: 'namespaces', allowed: ['list', 'watch'] },
  { what: 'nodes (source; node reporter reads its Node uid)', group: '', resource: 'nodes', allowed: ['get', 'list', 'watch'] },
  { what: 'networkpolicies (source)', group: 'networking.k8s.io', resource: 'networkpolicies', namespace: NS, allowed: ['list', 'watch'] },
  { what: 'nodepolicystatuses (reporter: get, apply; aggregator: list+watch)', group: 'weir.dev', resource: 'nodepolicystatuses', allowed: ['get', 'list', 'watch', 'create', 'patch'] },
  { what: 'nodepolicystatuses/status (reporter: apply)', group: 'weir.dev', resource: 'nodepolicystatuses', subresource: 'status', allowed: ['patch'] },
  {
    what: 'networkpolicystatuses (aggregator: list+watch, apply, delete orphans)',
    group: 'weir.dev',
    resource: 'networkpolicystatuses',
    namespace: NS,
    allowed: ['list', 'watch', 'create', 'patch', 'delete'],
  },
  { what: 'networkpolicystatuses/status (aggregator: apply)', group: 'weir.dev', resource: 'networkpolicystatuses', subresource: 'status', namespace: NS, allowed: ['patch'] },
  { what: 'events (recorder: POST, merge-patch)', group: '', resource: 'events', namespace: NS, allowed: ['create', 'patch'] },
  { what: 'events.k8s.io events', group: 'events.k8s.io', resource: 'events', namespace: NS, allowed: [] },
  {
    what: 'lease kube-system/weir-policy-status (elector: get, POST, PUT)',
    group: 'coordination.k8s.io',
    resource: 'leases',
    namespace: 'kube-system',
    name: 'weir-policy-status',
    allowed: ['get', 'create', 'update'],
  },
  // RBAC cannot tell a create's name (a POST names the collection): the admission policy does.
  { what: 'lease kube-system/kube-scheduler', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', name: 'kube-scheduler', allowed: ['create'] },
  { what: 'leases in kube-system', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', allowed: ['create'] },
  { what: 'node heartbeats kube-node-lease/node-b', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-node-lease', name: 'node-b', allowed: [] },
  { what: 'leases in default', group: 'coordination.k8s.io', resource: 'leases', namespace: 'default', allowed: [] },
  { what: 'secrets in kube-system', group: '', resource: 'secrets', namespace: 'kube-system', allowed: [] },
  { what: 'serviceaccounts/token', group: '', resource: 'serviceaccounts', subresource: 'token', namespace: 'kube-system', name: 'weir', allowed: [] },
];

describe("the agent's RBAC and admission policy on a real API server", () => {
  let cp: ControlPlane;
  let admin: KubeConfig;
  /** Tokens of the agent's service account, bound to its pod on node-a / node-b. */
  let tokenA: string;
  let tokenB: string;
  /** A token of the same service account bound to nothing: it carries no node name. */
  let unbound: string;
  let policyUid: string;

  const kubeConfigFor = (token: string): KubeConfig => {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: admin.clusters,
      users: [{ name: 'agent', token }],
      contexts: [{ name: 'agent', cluster: admin.getCurrentCluster()!.name, user: 'agent' }],
      currentContext: 'agent',
    });
    return kc;
  };
  const as = (token: string, args: string[], input?: string): Promise<string> => cp.kubectl(['--token', token, ...args], input);
  const boundToken = async (pod: string): Promise<string> =>
    (await cp.kubectl(['create', 'token', 'weir', '-n', 'kube-system', '--bound-object-kind', 'Pod', '--bound-object-name', pod, '--duration=1h'])).trim();

  before(async () => {
    cp = await startControlPlane();
    await cp.kubectl(['apply', '-f', CRDS]);
    await cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev']);
    await cp.kubectl(['apply', '-f', RBAC, '-f', ADMISSION]);
    const objects = [
      { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-a' } },
      { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-b' } },
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } },
      { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name: 'web', namespace: NS }, spec: { podSelector: {}, policyTypes: ['Ingress'] } },
      agentPod('node-a'),
      agentPod('node-b'),
      // What a stolen token must not take over: the scheduler's lease, a node's heartbeat.
      lease('kube-system', 'kube-scheduler', 'scheduler-1'),
      lease('kube-node-lease', 'node-a', 'node-a'),
    ];
    await cp.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
    admin = new KubeConfig();
    admin.loadFromFile(cp.kubeconfig);
    tokenA = await boundToken('weir-node-a');
    tokenB = await boundToken('weir-node-b');
    unbound = (await cp.kubectl(['create', 'token', 'weir', '-n', 'kube-system', '--duration=1h'])).trim();
    policyUid = (JSON.parse(await cp.kubectl(['get', 'networkpolicy', 'web', '-n', NS, '-o', 'json'])) as { metadata: { uid: string } }).metadata.uid;
    // The admission policy takes effect once the API server has loaded it: wait (dry run, no
    // side effect) until another node's status is refused.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const denied = await as(tokenA, ['apply', '--server-side', '--dry-run=server', '-f', '-'], JSON.stringify(nodeStatus('node-b'))).then(
        () => false,
        () => true,
      );
      if (denied) break;
      if (Date.now() > deadline) throw new Error('the admission policy did not take effect within 30 s');
      await new Promise((r) => setTimeout(r, 200));
    }
  });
  after(async () => {
    await cp?.stop();
  });

  test("a token bound to the agent's pod carries its node name", async () => {
    const review = JSON.parse(await as(tokenA, ['auth', 'whoami', '-o', 'json'])) as { status: { userInfo: { username: string; extra?: Record<string, string[]> } } };
    assert.equal(review.status.userInfo.username, AGENT);
    assert.deepEqual(review.status.userInfo.extra?.['authentication.kubernetes.io/node-name'], ['node-a']);
  });

  test('the agent is granted exactly the verbs Weir uses', async () => {
    const authz = kubeConfigFor(tokenA).makeApiClient(AuthorizationV1Api);
    const wrong: string[] = [];
    const table: string[] = [];
    for (const row of GRANTS) {
      const allowed = await Promise.all(
        VERBS.map(async (verb) => {
          const r = await authz.createSelfSubjectAccessReview({
            body: { spec: { resourceAttributes: { verb, group: row.group, resource: row.resource, subresource: row.subresource, namespace: row.namespace, name: row.name } } },
          });
          return r.status?.allowed === true;
        }),
      );
      const got = VERBS.filter((_, i) => allowed[i]);
      table.push(`${row.what}: ${got.join(', ') || '-'}`);
      if (got.join() !== row.allowed.join()) wrong.push(`${row.what}: granted [${got.join(', ')}], expected [${row.allowed.join(', ')}]`);
    }
    console.log(`as ${AGENT}:\n  ${table.join('\n  ')}`);
    assert.deepEqual(wrong, []);
  });

  test('kubectl auth can-i, as the agent, says no to other leases and to every verb it lost', async () => {
    // can-i prints yes and exits 0, or prints no and exits 1.
    const canI = (args: string[]) =>
      cp.kubectl(['auth', 'can-i', ...args, `--as=${AGENT}`]).then(
        (o) => o.trim(),
        (e: unknown) => (e instanceof CommandError && e.exitCode === 1 ? 'no' : Promise.reject(e)),
      );
    const cases: [string[], string][] = [
      [['get', 'leases/weir-policy-status', '-n', 'kube-system'], 'yes'],
      [['update', 'leases/weir-policy-status', '-n', 'kube-system'], 'yes'],
      [['update', 'leases/kube-scheduler', '-n', 'kube-system'], 'no'],
      [['get', 'leases/kube-scheduler', '-n', 'kube-system'], 'no'],
      [['update', 'leases/node-a', '-n', 'kube-node-lease'], 'no'],
      [['create', 'leases', '-n', 'kube-node-lease'], 'no'],
      [['delete', 'leases/weir-policy-status', '-n', 'kube-system'], 'no'],
      [['delete', 'nodepolicystatuses.weir.dev'], 'no'],
      [['get', 'networkpolicystatuses.weir.dev', '-n', NS], 'no'],
      [['create', 'events.events.k8s.io', '-n', NS], 'no'],
      [['get', 'pods', '-n', NS], 'no'],
      [['get', 'secrets', '-n', 'kube-system'], 'no'],
    ];
    const answers = await Promise.all(cases.map(([args]) => canI(args)));
    assert.deepEqual(
      answers.map((a, i) => `${cases[i][0].join(' ')}: ${a}`),
      cases.map(([args, want]) => `${args.join(' ')}: ${want}`),
    );
  });

  test("the agent's token is refused the scheduler's lease, node heartbeats, other namespaces' leases and the verbs it lost", async () => {
    const refused = async (what: string, args: string[], pattern: RegExp, input?: string) => {
      await assert.rejects(as(tokenA, args, input), pattern, what);
    };
    const forbidden = /forbidden/i;
    await refused('get the scheduler lease', ['get', 'lease', 'kube-scheduler', '-n', 'kube-system'], forbidden);
    await refused('replace the scheduler lease', ['replace', '-f', '-'], forbidden, JSON.stringify(lease('kube-system', 'kube-scheduler', 'thief')));
    await refused('patch the scheduler lease', ['patch', 'lease', 'kube-scheduler', '-n', 'kube-system', '--type=merge', '-p', '{"spec":{"holderIdentity":"thief"}}'], forbidden);
    await refused('fake a node heartbeat', ['patch', 'lease', 'node-a', '-n', 'kube-node-lease', '--type=merge', '-p', '{"spec":{"renewTime":"2030-01-01T00:00:00.000000Z"}}'], forbidden);
    await refused('create a node heartbeat', ['create', '-f', '-'], forbidden, JSON.stringify(lease('kube-node-lease', 'node-b', 'node-b')));
    await refused('create a lease in default', ['create', '-f', '-'], forbidden, JSON.stringify(lease('default', 'weir-policy-status', 'thief')));
    await refused('delete its own lease', ['delete', 'lease', 'weir-policy-status', '-n', 'kube-system'], forbidden);
    // RBAC lets a create through whatever its name; the admission policy stops other names.
    await refused('create another lease in kube-system', ['create', '-f', '-'], /weir-policy-status/, JSON.stringify(lease('kube-system', 'kube-controller-manager', 'thief')));
    await refused('read a pod by name', ['get', 'pod', 'weir-node-a', '-n', 'kube-system'], forbidden);
    await refused('write a pod status', ['patch', 'pod', 'weir-node-a', '-n', 'kube-system', '--subresource=status', '--type=merge', '-p', '{"status":{"phase":"Failed"}}'], forbidden);
    await refused('read secrets', ['get', 'secrets', '-n', 'kube-system'], forbidden);
    await refused(
      'write events.k8s.io events',
      ['create', '-f', '-'],
      forbidden,
      JSON.stringify({
        apiVersion: 'events.k8s.io/v1',
        kind: 'Event',
        metadata: { name: 'x', namespace: NS },
        eventTime: '2030-01-01T00:00:00.000000Z',
        reportingController: 'weir',
        reportingInstance: 'x',
        action: 'A',
        reason: 'R',
        type: 'Normal',
        regarding: { kind: 'NetworkPolicy', name: 'web', namespace: NS },
      }),
    );
    await cp.kubectl(['apply', '--server-side', '-f', '-'], JSON.stringify(nodeStatus('node-b')));
    await refused('delete a NodePolicyStatus', ['delete', 'nodepolicystatus', 'node-b'], forbidden);
    // Leases stay as they were.
    const sched = JSON.parse(await cp.kubectl(['get', 'lease', 'kube-scheduler', '-n', 'kube-system', '-o', 'json'])) as { spec: { holderIdentity: string } };
    assert.equal(sched.spec.holderIdentity, 'scheduler-1');
  });

  test('a Role cannot limit create by resourceNames: a POST names no object, so it is refused', async () => {
    await cp.kubectl(['create', 'serviceaccount', 'named-create', '-n', 'kube-system']);
    await cp.kubectl(['create', 'role', 'named-create', '-n', 'kube-system', '--verb=create,get,update', '--resource=leases.coordination.k8s.io', '--resource-name=probe']);
    await cp.kubectl(['create', 'rolebinding', 'named-create', '-n', 'kube-system', '--role=named-create', '--serviceaccount=kube-system:named-create']);
    const token = (await cp.kubectl(['create', 'token', 'named-create', '-n', 'kube-system'])).trim();
    // The access review names the object and says yes; the real request does not, and fails.
    assert.equal((await as(token, ['auth', 'can-i', 'create', 'leases/probe', '-n', 'kube-system'])).trim(), 'yes');
    await assert.rejects(as(token, ['create', '-f', '-'], JSON.stringify(lease('kube-system', 'probe'))), /forbidden/i);
  });

  test("the status writers run with the agent's own token: nothing they do is refused", async () => {
    const kc = kubeConfigFor(tokenA);
    const logs = captureLog();
    const node = new Results<PassResult>();
    const policy = new Results<PassResult>();
    const events = new Results<'ok' | 'error'>();
    const reporter = createNodeStatusReporter({ kubeConfig: kc, nodeName: 'node-a', log: logs.log, minIntervalMs: 100, onWrite: node.push });
    const agg = createPolicyStatusAggregator({ kubeConfig: kc, identity: 'node-a', log: logs.log, minIntervalMs: 200, onWrite: policy.push });
    const rec = createEventRecorder({ kubeConfig: kc, component: 'weir-agent', host: 'node-a', log: logs.log, windowMs: 200, onWrite: events.push });
    await cp.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'weir.dev/v1alpha1', kind: 'NetworkPolicyStatus', metadata: { name: 'orphan', namespace: NS } }));
    try {
      reporter.update({
        synced: true,
        lastApply: { ok: true },
        lastSyncTime: Date.now(),
        counts: { localPods: 1, policies: 1, sets: 1, chains: 4, rules: 7 },
        policies: [{ namespace: NS, name: 'web', uid: policyUid, generation: 1 }],
      });
      assert.equal(await node.next(10_000), 'ok');
      agg.start();
      await until(() => agg.isHolder(), 'node-a holds the lease', 10_000);
      agg.update({ policies: [{ namespace: NS, name: 'web', uid: policyUid, generation: 1, accepted: { ok: true, message: '' }, desiredNodes: ['node-a'] }] });
      for (let r = await policy.next(10_000); r !== 'ok'; r = await policy.next(10_000));
      const ref = { namespace: NS, name: 'web', uid: policyUid };
      rec.record(ref, 'Warning', 'ApplyFailed', 'first');
      assert.equal(await events.next(10_000), 'ok');
      rec.record(ref, 'Warning', 'ApplyFailed', 'again');
      rec.record(ref, 'Warning', 'ApplyFailed', 'and again');
      assert.equal(await events.next(10_000), 'ok', 'the repeat is a merge-patch of the same Event');
    } finally {
      await rec.stop();
      await agg.stop();
      await reporter.stop();
    }
    assert.deepEqual(
      logs.warnings().map((w) => `${w.msg} ${String(w.error ?? '')}`),
      [],
    );
    const get = async <T>(args: string[]) => JSON.parse(await cp.kubectl([...args, '-o', 'json'])) as T;
    assert.equal((await get<{ status: { counts: { rules: number } } }>(['get', 'nodepolicystatus', 'node-a'])).status.counts.rules, 7);
    assert.equal((await get<{ status: { realized: string } }>(['get', 'networkpolicystatus', 'web', '-n', NS])).status.realized, '1/1');
    await assert.rejects(cp.kubectl(['get', 'networkpolicystatus', 'orphan', '-n', NS]), /not found/i);
    const held = await get<{ spec: { leaseTransitions: number } }>(['get', 'lease', 'weir-policy-status', '-n', 'kube-system']);
    assert.equal(typeof held.spec.leaseTransitions, 'number', 'the lease was created and written');
    const ev = await get<{ items: { count: number }[] }>(['get', 'events', '-n', NS, '--field-selector', 'involvedObject.name=web']);
    assert.deepEqual(
      ev.items.map((e) => e.count),
      [3],
    );
  });

  test("an agent writes only its own node's NodePolicyStatus: allowed for node-a's, refused for node-b's", async () => {
    // The requests the node reporter sends: server-side apply of the object, then of its status.
    const apply = (token: string, node: string, subresource?: 'status') =>
      createKubeClient(kubeConfigFor(token)).send({
        method: 'PATCH',
        path: nodeStatusPath(node, subresource),
        query: applyQuery(agentFieldManager(node)),
        body: subresource === undefined ? nodeStatus(node) : { ...nodeStatus(node), status: { counts: { rules: 42 } } },
        contentType: APPLY_PATCH,
      });
    const notYours =
      /403 Forbidden: .*ValidatingAdmissionPolicy 'weir-agent-own-node-status' .*denied request: the Weir agent of node node-a may write only the NodePolicyStatus named node-a, not node-b/;

    await cp.kubectl(['delete', 'nodepolicystatus', 'node-a', 'node-b', '--ignore-not-found']);
    // Its own: create, then the status subresource.
    await apply(tokenA, 'node-a');
    await apply(tokenA, 'node-a', 'status');
    // Another node's: neither create nor status.
    await assert.rejects(apply(tokenA, 'node-b'), notYours);
    await assert.rejects(cp.kubectl(['get', 'nodepolicystatus', 'node-b']), /not found/i, 'the refused create made nothing');
    await apply(tokenB, 'node-b');
    await assert.rejects(apply(tokenA, 'node-b', 'status'), notYours);
    await apply(tokenB, 'node-b', 'status');
    // A token that names no node writes no node's status.
    await assert.rejects(apply(unbound, 'node-a', 'status'), /only with a token bound to a pod on a node/);
    // Nobody else is concerned by the policy (the admin here).
    await cp.kubectl(['patch', 'nodepolicystatus', 'node-a', '--subresource=status', '--type=merge', '-p', '{"status":{"counts":{"rules":1}}}']);
    const managers = async (node: string) =>
      ((JSON.parse(await cp.kubectl(['get', 'nodepolicystatus', node, '-o', 'json', '--show-managed-fields'])) as { metadata: { managedFields?: { manager: string }[] } }).metadata.managedFields ?? [])
        .map((m) => m.manager)
        .filter((m) => m.startsWith('weir-agent'));
    assert.deepEqual([...new Set(await managers('node-b'))], ['weir-agent-node-b'], "node-b's status was written by node-b's agent only");
  });

  test("a node reporter given another node's name is refused by the API server, and says so", async () => {
    const logs = captureLog();
    const results = new Results<PassResult>();
    const reporter = createNodeStatusReporter({ kubeConfig: kubeConfigFor(tokenA), nodeName: 'node-b', log: logs.log, minIntervalMs: 50, retryMinMs: 50, retryMaxMs: 100, onWrite: results.push });
    try {
      reporter.update({ synced: true, lastApply: { ok: true }, lastSyncTime: Date.now(), counts: { localPods: 0, policies: 0, sets: 0, chains: 0, rules: 99 }, policies: [] });
      assert.equal(await results.next(10_000), 'error');
    } finally {
      await reporter.stop();
    }
    assert.match(String(logs.warnings()[0]?.error ?? ''), /may write only the NodePolicyStatus named node-a/);
  });
});
