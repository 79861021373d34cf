// What Weir's agent and controller may do in a cluster, on a real kube-apiserver:
// deploy/rbac.yaml grants each exactly the verbs its code uses (the agent: its source and its
// node's NodePolicyStatus; the controller: its model, NetworkPolicyStatus, the status of
// ClusterNetworkPolicies, Events and its own Lease), deploy/admission-policy.yaml lets an agent write only its own node's
// NodePolicyStatus, from the node name the API server puts into a pod-bound token, and the
// controller create no Lease but its own.

import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { AuthorizationV1Api, KubeConfig } from '@kubernetes/client-node';
import { CommandError } from '../../src/errors.ts';
import { APPLY_PATCH, createKubeClient } from '../../src/kube/client.ts';
import { agentFieldManager, applyQuery, nodeStatusPath } from '../../src/status/bodies.ts';
import { createPolicyStatusAggregator } from '../../src/controller/aggregator.ts';
import { createEventRecorder } from '../../src/controller/events.ts';
import { createNodeStatusReporter } from '../../src/status/index.ts';
import type { PassResult } from '../../src/status/index.ts';
import { captureLog, Results, until } from '../unit/status/fake-api.ts';
import { eventually } from '../support/eventually.ts';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

const CRDS = fileURLToPath(new URL('../../crds/', import.meta.url));
const RBAC = fileURLToPath(new URL('../../deploy/rbac.yaml', import.meta.url));
const ADMISSION = fileURLToPath(new URL('../../deploy/admission-policy.yaml', import.meta.url));
const AGENT = 'system:serviceaccount:kube-system:weir';
const CONTROLLER = 'system:serviceaccount:kube-system:weir-controller';
const CONTROLLER_LEASE = 'weir-controller';
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
const AGENT_GRANTS: readonly Row[] = [
  { what: 'pods (source: list+watch)', group: '', resource: 'pods', namespace: NS, allowed: ['list', 'watch'] },
  { what: 'pods/status', group: '', resource: 'pods', subresource: 'status', namespace: NS, allowed: [] },
  { what: 'namespaces (source)', group: '', resource: 'namespaces', allowed: ['list', 'watch'] },
  { what: 'nodes (source; node reporter reads its Node uid)', group: '', resource: 'nodes', allowed: ['get', 'list', 'watch'] },
  { what: 'networkpolicies (source)', group: 'networking.k8s.io', resource: 'networkpolicies', namespace: NS, allowed: ['list', 'watch'] },
  { what: 'clusternetworkpolicies (source)', group: 'policy.networking.k8s.io', resource: 'clusternetworkpolicies', allowed: ['list', 'watch'] },
  { what: 'clusternetworkpolicies/status', group: 'policy.networking.k8s.io', resource: 'clusternetworkpolicies', subresource: 'status', allowed: [] },
  { what: 'nodepolicystatuses (reporter: get, apply)', group: 'weir.dev', resource: 'nodepolicystatuses', allowed: ['get', 'create', 'patch'] },
  { what: 'nodepolicystatuses/status (reporter: apply)', group: 'weir.dev', resource: 'nodepolicystatuses', subresource: 'status', allowed: ['patch'] },
  { what: 'networkpolicystatuses', group: 'weir.dev', resource: 'networkpolicystatuses', namespace: NS, allowed: [] },
  { what: 'networkpolicystatuses/status', group: 'weir.dev', resource: 'networkpolicystatuses', subresource: 'status', namespace: NS, allowed: [] },
  { what: 'events', group: '', resource: 'events', namespace: NS, allowed: [] },
  { what: 'events.k8s.io events', group: 'events.k8s.io', resource: 'events', namespace: NS, allowed: [] },
  { what: "the controller's lease", group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', name: CONTROLLER_LEASE, allowed: [] },
  { what: 'leases in kube-system', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', allowed: [] },
  { what: 'node heartbeats kube-node-lease/node-b', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-node-lease', name: 'node-b', allowed: [] },
  { what: 'its DaemonSet (the uninstall signal: read)', group: 'apps', resource: 'daemonsets', namespace: 'kube-system', name: 'weir', allowed: ['get', 'list', 'watch'] },
  { what: 'other DaemonSets', group: 'apps', resource: 'daemonsets', namespace: 'kube-system', name: 'kube-proxy', allowed: [] },
  { what: 'secrets in kube-system', group: '', resource: 'secrets', namespace: 'kube-system', allowed: [] },
  { what: 'serviceaccounts/token', group: '', resource: 'serviceaccounts', subresource: 'token', namespace: 'kube-system', name: 'weir', allowed: [] },
];

// src/controller/*, and the aggregator, elector and event recorder of src/status/.
const CONTROLLER_GRANTS: readonly Row[] = [
  { what: 'pods (model: list+watch)', group: '', resource: 'pods', namespace: NS, allowed: ['list', 'watch'] },
  { what: 'namespaces (model)', group: '', resource: 'namespaces', allowed: ['list', 'watch'] },
  { what: 'nodes', group: '', resource: 'nodes', allowed: [] },
  { what: 'networkpolicies (model)', group: 'networking.k8s.io', resource: 'networkpolicies', namespace: NS, allowed: ['list', 'watch'] },
  { what: 'clusternetworkpolicies (model)', group: 'policy.networking.k8s.io', resource: 'clusternetworkpolicies', allowed: ['list', 'watch'] },
  { what: 'clusternetworkpolicies/status (apply its conditions)', group: 'policy.networking.k8s.io', resource: 'clusternetworkpolicies', subresource: 'status', allowed: ['patch'] },
  { what: 'nodepolicystatuses (digests, apply failures: list+watch)', group: 'weir.dev', resource: 'nodepolicystatuses', allowed: ['list', 'watch'] },
  { what: 'nodepolicystatuses/status', group: 'weir.dev', resource: 'nodepolicystatuses', subresource: 'status', allowed: [] },
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
  { what: 'its lease (elector: get, POST, PUT)', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', name: CONTROLLER_LEASE, allowed: ['get', 'create', 'update'] },
  // RBAC cannot tell a create's name (a POST names the collection): the admission policy does.
  { what: 'lease kube-system/kube-scheduler', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', name: 'kube-scheduler', allowed: ['create'] },
  { what: 'leases in kube-system', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-system', allowed: ['create'] },
  { what: 'node heartbeats kube-node-lease/node-b', group: 'coordination.k8s.io', resource: 'leases', namespace: 'kube-node-lease', name: 'node-b', allowed: [] },
  { what: 'leases in default', group: 'coordination.k8s.io', resource: 'leases', namespace: 'default', allowed: [] },
  { what: "the agents' DaemonSet (the uninstall signal: read)", group: 'apps', resource: 'daemonsets', namespace: 'kube-system', name: 'weir', allowed: ['get', 'list', 'watch'] },
  { what: 'other DaemonSets', group: 'apps', resource: 'daemonsets', namespace: 'kube-system', name: 'kube-proxy', allowed: [] },
  { what: 'secrets in kube-system', group: '', resource: 'secrets', namespace: 'kube-system', allowed: [] },
];

describe("the agent's and the controller's RBAC and admission policies on a real API server", () => {
  let cp: ControlPlane;
  let admin: KubeConfig;
  /** Tokens of the agent's service account, bound to its pod on node-a / node-b. */
  let tokenA: string;
  let tokenB: string;
  /** A token of the same service account bound to nothing: it carries no node name. */
  let unbound: string;
  /** A token of the controller's service account. */
  let controllerToken: string;
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
    // Null conditions right after the create read as an error to kubectl wait: retried.
    const crds = ['crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev', 'crd/clusternetworkpolicies.policy.networking.k8s.io'];
    await eventually(
      'the CRDs Established',
      () => cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', ...crds]),
      () => true,
      60_000,
    );
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
    controllerToken = (await cp.kubectl(['create', 'token', 'weir-controller', '-n', 'kube-system', '--duration=1h'])).trim();
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

  const grantsOf = async (token: string, user: string, rows: readonly Row[]): Promise<string[]> => {
    const authz = kubeConfigFor(token).makeApiClient(AuthorizationV1Api);
    const wrong: string[] = [];
    const table: string[] = [];
    for (const row of rows) {
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
    console.log(`as ${user}:\n  ${table.join('\n  ')}`);
    return wrong;
  };

  test('the agent is granted exactly the verbs its code uses: its source, and its NodePolicyStatus', async () => {
    assert.deepEqual(await grantsOf(tokenA, AGENT, AGENT_GRANTS), []);
  });

  test('the controller is granted exactly the verbs its code uses: its model, NetworkPolicyStatus, Events, its Lease', async () => {
    assert.deepEqual(await grantsOf(controllerToken, CONTROLLER, CONTROLLER_GRANTS), []);
  });

  test('kubectl auth can-i, as the agent and as the controller, says no to every write that is not theirs', async () => {
    // can-i prints yes and exits 0, or prints no and exits 1.
    const canI = (user: string, args: string[]) =>
      cp.kubectl(['auth', 'can-i', ...args, `--as=${user}`]).then(
        (o) => `${user === AGENT ? 'agent' : 'controller'} ${args.join(' ')}: ${o.trim()}`,
        (e: unknown) => (e instanceof CommandError && e.exitCode === 1 ? `${user === AGENT ? 'agent' : 'controller'} ${args.join(' ')}: no` : Promise.reject(e)),
      );
    const cases: [string, string[], string][] = [
      [AGENT, ['get', `leases/${CONTROLLER_LEASE}`, '-n', 'kube-system'], 'no'],
      [AGENT, ['update', `leases/${CONTROLLER_LEASE}`, '-n', 'kube-system'], 'no'],
      [AGENT, ['create', 'leases', '-n', 'kube-system'], 'no'],
      [AGENT, ['update', 'leases/weir-policy-status', '-n', 'kube-system'], 'no'],
      [AGENT, ['patch', 'networkpolicystatuses.weir.dev/web', '-n', NS], 'no'],
      [AGENT, ['patch', 'networkpolicystatuses.weir.dev/web', '--subresource=status', '-n', NS], 'no'],
      [AGENT, ['create', 'events', '-n', NS], 'no'],
      [AGENT, ['list', 'nodepolicystatuses.weir.dev'], 'no'],
      [AGENT, ['delete', 'nodepolicystatuses.weir.dev'], 'no'],
      [AGENT, ['get', 'pods', '-n', NS], 'no'],
      [CONTROLLER, ['patch', 'nodepolicystatuses.weir.dev/node-a'], 'no'],
      [CONTROLLER, ['patch', 'nodepolicystatuses.weir.dev/node-a', '--subresource=status'], 'no'],
      [CONTROLLER, ['create', 'nodepolicystatuses.weir.dev'], 'no'],
      [CONTROLLER, ['update', 'leases/kube-scheduler', '-n', 'kube-system'], 'no'],
      [CONTROLLER, ['delete', `leases/${CONTROLLER_LEASE}`, '-n', 'kube-system'], 'no'],
      [CONTROLLER, ['get', 'secrets', '-n', 'kube-system'], 'no'],
      [CONTROLLER, ['patch', 'networkpolicies/web', '-n', NS], 'no'],
      [CONTROLLER, ['patch', 'clusternetworkpolicies.policy.networking.k8s.io/tenants'], 'no'],
      [AGENT, ['patch', 'clusternetworkpolicies.policy.networking.k8s.io/tenants', '--subresource=status'], 'no'],
    ];
    const answers = await Promise.all(cases.map(([user, args]) => canI(user, args)));
    assert.deepEqual(
      answers,
      cases.map(([user, args, want]) => `${user === AGENT ? 'agent' : 'controller'} ${args.join(' ')}: ${want}`),
    );
  });

  test("the agent's token is refused every write but its NodePolicyStatus: NetworkPolicyStatus, Events, any Lease", async () => {
    const refused = async (what: string, args: string[], pattern: RegExp, input?: string) => {
      await assert.rejects(as(tokenA, args, input), pattern, what);
    };
    const forbidden = /forbidden/i;
    const policyStatus = { apiVersion: 'weir.dev/v1alpha1', kind: 'NetworkPolicyStatus', metadata: { name: 'web', namespace: NS } };
    await refused('create a NetworkPolicyStatus', ['create', '-f', '-'], forbidden, JSON.stringify(policyStatus));
    await cp.kubectl(['apply', '--server-side', '-f', '-'], JSON.stringify(policyStatus));
    await refused('apply a NetworkPolicyStatus', ['apply', '--server-side', '-f', '-'], forbidden, JSON.stringify({ ...policyStatus, metadata: { ...policyStatus.metadata, labels: { x: 'y' } } }));
    await refused('mark a policy Enforced', ['patch', 'networkpolicystatus', 'web', '-n', NS, '--subresource=status', '--type=merge', '-p', '{"status":{"realized":"9/9"}}'], forbidden);
    await refused('delete a NetworkPolicyStatus', ['delete', 'networkpolicystatus', 'web', '-n', NS], forbidden);
    await refused(
      'create an Event',
      ['create', '-f', '-'],
      forbidden,
      JSON.stringify({ apiVersion: 'v1', kind: 'Event', metadata: { name: 'x', namespace: NS }, involvedObject: { kind: 'NetworkPolicy', name: 'web', namespace: NS }, reason: 'R', message: 'm' }),
    );
    await refused('create the controller lease', ['create', '-f', '-'], forbidden, JSON.stringify(lease('kube-system', CONTROLLER_LEASE, 'thief')));
    await refused('create the old status lease', ['create', '-f', '-'], forbidden, JSON.stringify(lease('kube-system', 'weir-policy-status', 'thief')));
    await refused('get the scheduler lease', ['get', 'lease', 'kube-scheduler', '-n', 'kube-system'], forbidden);
    await refused('patch the scheduler lease', ['patch', 'lease', 'kube-scheduler', '-n', 'kube-system', '--type=merge', '-p', '{"spec":{"holderIdentity":"thief"}}'], forbidden);
    await refused('fake a node heartbeat', ['patch', 'lease', 'node-a', '-n', 'kube-node-lease', '--type=merge', '-p', '{"spec":{"renewTime":"2030-01-01T00:00:00.000000Z"}}'], forbidden);
    await refused('read a pod by name', ['get', 'pod', 'weir-node-a', '-n', 'kube-system'], forbidden);
    await refused('write a pod status', ['patch', 'pod', 'weir-node-a', '-n', 'kube-system', '--subresource=status', '--type=merge', '-p', '{"status":{"phase":"Failed"}}'], forbidden);
    await refused('read secrets', ['get', 'secrets', '-n', 'kube-system'], forbidden);
    await cp.kubectl(['apply', '--server-side', '-f', '-'], JSON.stringify(nodeStatus('node-b')));
    await refused('delete a NodePolicyStatus', ['delete', 'nodepolicystatus', 'node-b'], forbidden);
    // Leases stay as they were.
    const sched = JSON.parse(await cp.kubectl(['get', 'lease', 'kube-scheduler', '-n', 'kube-system', '-o', 'json'])) as { spec: { holderIdentity: string } };
    assert.equal(sched.spec.holderIdentity, 'scheduler-1');
    await assert.rejects(cp.kubectl(['get', 'lease', CONTROLLER_LEASE, '-n', 'kube-system']), /not found/i);
  });

  test("the controller's token is refused every NodePolicyStatus write, other Leases, and what it only reads", async () => {
    const refused = async (what: string, args: string[], pattern: RegExp, input?: string) => {
      await assert.rejects(as(controllerToken, args, input), pattern, what);
    };
    const forbidden = /forbidden/i;
    await cp.kubectl(['apply', '--server-side', '-f', '-'], JSON.stringify(nodeStatus('node-a')));
    await refused(
      'apply a NodePolicyStatus',
      ['apply', '--server-side', '--field-manager=thief', '-f', '-'],
      forbidden,
      JSON.stringify({ ...nodeStatus('node-a'), metadata: { name: 'node-a', labels: { x: 'y' } } }),
    );
    await refused('create a NodePolicyStatus', ['create', '-f', '-'], forbidden, JSON.stringify(nodeStatus('node-z')));
    await refused("rewrite a node's status", ['patch', 'nodepolicystatus', 'node-a', '--subresource=status', '--type=merge', '-p', '{"status":{"counts":{"rules":0}}}'], forbidden);
    await refused('delete a NodePolicyStatus', ['delete', 'nodepolicystatus', 'node-a'], forbidden);
    await refused('edit a NetworkPolicy', ['label', 'networkpolicy', 'web', '-n', NS, 'x=y'], forbidden);
    await refused('read a Node', ['get', 'node', 'node-a'], forbidden);
    await refused('patch the scheduler lease', ['patch', 'lease', 'kube-scheduler', '-n', 'kube-system', '--type=merge', '-p', '{"spec":{"holderIdentity":"thief"}}'], forbidden);
    await refused('create a lease in default', ['create', '-f', '-'], forbidden, JSON.stringify(lease('default', CONTROLLER_LEASE, 'thief')));
    // RBAC lets a create through whatever its name; the admission policy stops other names.
    await refused(
      'create another lease in kube-system',
      ['create', '-f', '-'],
      new RegExp(`creates no Lease but kube-system/${CONTROLLER_LEASE}`),
      JSON.stringify(lease('kube-system', 'kube-controller-manager', 'thief')),
    );
    await refused('delete its own lease', ['delete', 'lease', CONTROLLER_LEASE, '-n', 'kube-system'], forbidden);
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

  test('the status writers run with their own tokens (reporter: the agent; aggregator and events: the controller): nothing is refused', async () => {
    const kc = kubeConfigFor(tokenA);
    const ckc = kubeConfigFor(controllerToken);
    const logs = captureLog();
    const node = new Results<PassResult>();
    const policy = new Results<PassResult>();
    const events = new Results<'ok' | 'error'>();
    const reporter = createNodeStatusReporter({ kubeConfig: kc, nodeName: 'node-a', log: logs.log, minIntervalMs: 100, onWrite: node.push });
    const agg = createPolicyStatusAggregator({ kubeConfig: ckc, identity: 'controller-0', leaseName: CONTROLLER_LEASE, log: logs.log, minIntervalMs: 200, onWrite: policy.push });
    const rec = createEventRecorder({ kubeConfig: ckc, component: 'weir-controller', host: 'controller-0', log: logs.log, windowMs: 200, onWrite: events.push });
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
      await until(() => agg.isHolder(), 'the controller holds the lease', 10_000);
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
    const held = await get<{ spec: { leaseTransitions: number } }>(['get', 'lease', CONTROLLER_LEASE, '-n', 'kube-system']);
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
