// The chart on a real API server. `helm install` with the default values, then the DaemonSet
// it created run on each simulated node, and the controller Deployment's replicas, exactly as written (helm-kubelet.ts: the same command,
// args and env, mounts and capabilities; in-cluster config with a token bound to the agent's
// pod), bound only by the chart's RBAC and admission policies: the agents must enforce a policy
// applied with kubectl (real packets), answer the chart's probes, and write their status with
// nothing forbidden; the controller must write the policies' status, and its standby take over
// when the leader is killed. Then a rolling update: the old agents stop and the rules stay; `helm
// upgrade` with every optional part on, its DaemonSet run the same way; and `helm uninstall`,
// whose hook has the agents remove their rules, and which must leave no object behind.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { A1, B1, B2 } from '../conformance/harness.ts';
import { eventually } from '../support/eventually.ts';
import { CHART, type Cell, ChartCluster, type Obj, parseDocs, run } from './helm-harness.ts';
import type { ContainerProcess } from './helm-kubelet.ts';
import { policyObject } from './kube-harness.ts';

const NS = 'kube-system';
const ALL_ON = join(CHART, 'ci/all-on-values.yaml');

/** alpha's web pod takes port 80 from beta's pods only (and itself). */
const fromBetaOn80 = (c: Cell) => c.target !== A1 || c.source === A1 || ((c.source === B1 || c.source === B2) && c.proto === 'tcp' && c.port === 80);

const cond = (obj: Obj, type: string) => (obj.status?.conditions ?? []).find((c: { type: string }) => c.type === type);

/** Lines an agent logged that say the API server refused it something. */
const forbidden = (agents: readonly ContainerProcess[]) => agents.flatMap((a) => a.log.filter((l) => /forbid|\b403\b/i.test(l)).map((l) => `${a.node}: ${l}`));

/** Minimal Prometheus Operator CRDs (kinds only, any spec): enough for the API server to
 *  store the chart's PodMonitor and ServiceMonitor, not to check their fields. */
const monitoringCrd = (kind: string) => {
  const plural = `${kind.toLowerCase()}s`;
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { name: `${plural}.monitoring.coreos.com` },
    spec: {
      group: 'monitoring.coreos.com',
      scope: 'Namespaced',
      names: { kind, plural, listKind: `${kind}List`, singular: kind.toLowerCase() },
      versions: [{ name: 'v1', served: true, storage: true, schema: { openAPIV3Schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } } }],
    },
  };
};

describe('the chart on a real API server: install, agents that enforce policy, upgrade, uninstall', () => {
  let k: ChartCluster;
  let agents: ContainerProcess[] = [];
  let controllers: ContainerProcess[] = [];
  /** Every object of every revision of the release (helm get manifest). */
  const released: Obj[] = [];
  before(async () => {
    k = await ChartCluster.start();
  });
  after(async () => {
    await k?.stop();
  });

  const manifest = async (revision: number) => parseDocs((await k.helm(['get', 'manifest', 'weir', '-n', NS, '--revision', String(revision)])).stdout);

  /** What `kubectl get` says of each object: its name, or the error. */
  async function lookUp(objs: readonly Obj[]): Promise<string[]> {
    return Promise.all(
      objs.map(async (o) => {
        const ref = `${o.kind}/${o.metadata.name}`;
        const ns = o.metadata.namespace ? ['-n', o.metadata.namespace] : [];
        const gv = o.apiVersion.includes('/') ? `${o.kind.toLowerCase()}.${o.apiVersion.split('/')[1]}.${o.apiVersion.split('/')[0]}` : o.kind.toLowerCase();
        try {
          await k.kubectl(['get', gv, o.metadata.name, ...ns, '-o', 'name']);
          return `${ref}: present`;
        } catch (e) {
          return `${ref}: ${/NotFound|not found/.test(String(e)) ? 'gone' : String(e)}`;
        }
      }),
    );
  }

  test('a mistyped value fails helm install with the schema error, and installs nothing', async () => {
    const r = await k.helm(['install', 'weir', CHART, '--namespace', NS, '--set', 'agent.logLevel=verbose', '--set', 'metrics.prot=9476']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /values don't meet the specifications of the schema/);
    assert.match(r.stderr, /at '\/agent\/logLevel': value must be one of 'fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'/);
    assert.match(r.stderr, /at '\/metrics': additional properties 'prot' not allowed/);
    assert.equal((await k.helm(['list', '--all-namespaces', '--all', '-q'])).stdout.trim(), '');
    assert.equal((await k.kubectl(['get', 'daemonsets,serviceaccounts', '-n', NS, '-o', 'name'])).trim(), '');
  });

  test('helm install: every object accepted; the DaemonSet run as written enforces a policy applied with kubectl', async () => {
    const installed = await k.helm(['install', 'weir', CHART, '--namespace', NS]);
    assert.equal(installed.code, 0, installed.stderr);
    assert.match(installed.stdout, /kubectl get nodepolicystatuses/, 'NOTES tell how to check the install');
    released.push(...(await manifest(1)));
    assert.deepEqual(
      (await lookUp(released)).filter((l) => !l.endsWith(': present')),
      [],
    );
    agents = await k.runDaemonSet(NS, 'weir');
    controllers = await k.runDeployment(NS, 'weir-controller');
    // Every mount is made, but /lib/modules on a machine without it (nothing reads it: the
    // agent has no CAP_SYS_MODULE; the mount is for parity with kube-proxy).
    assert.deepEqual(
      agents.flatMap((a) => a.skippedMounts).filter((m) => !m.startsWith('/lib/modules ') || existsSync('/lib/modules')),
      [],
    );
    await k.expect(() => true, 'no policy: default allow');
    await k.apply(
      policyObject('alpha', 'web-from-beta', {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ port: 80 }] }],
      }),
    );
    await k.expect(fromBetaOn80, 'web-from-beta');
  });

  test("the agents and the controller answer the chart's liveness and readiness probes where the kubelet sends them", async () => {
    for (const a of [...agents, ...controllers]) {
      for (const probe of ['livenessProbe', 'readinessProbe'] as const) {
        const r = await k.probe(a, probe);
        assert.equal(r.status, 200, `${a.node} ${probe}: ${r.status} ${r.body}`);
      }
    }
  });

  test("in the chart's read-only container the agents start their commands through the fork server", async () => {
    for (const a of agents) {
      const fallback = a.log.find((l) => /commands are started from the agent itself/.test(l));
      assert.equal(fallback, undefined, `${a.node}: ${fallback}`);
    }
  });

  test('the agents write their NodePolicyStatus, the controller the NetworkPolicyStatus, with nothing forbidden', async () => {
    for (const node of ['node-a', 'node-b']) {
      await eventually(
        `NodePolicyStatus ${node}`,
        () => k.getJson(['get', 'nodepolicystatus', node]),
        (o) => cond(o, 'Ready')?.status === 'True' && cond(o, 'Programmed')?.status === 'True',
      );
    }
    await eventually(
      'NetworkPolicyStatus alpha/web-from-beta Enforced',
      () => k.getJson(['get', 'networkpolicystatus', 'web-from-beta', '-n', 'alpha']),
      (o) => cond(o, 'Accepted')?.status === 'True' && cond(o, 'Enforced')?.status === 'True',
    );
    assert.deepEqual(forbidden([...agents, ...controllers]), []);
    assert.deepEqual(
      [...agents, ...controllers].flatMap((a) => a.errors),
      [],
    );
  });

  test('killing the leading controller hands status to the standby within 15 s', async () => {
    const lease = await k.getJson(['get', 'lease', 'weir-controller', '-n', NS]);
    const leader = controllers.find((c) => c.pod.metadata.name === lease.spec.holderIdentity);
    assert.ok(leader, `the Lease names a running replica: ${lease.spec.holderIdentity}`);
    const standby = controllers.find((c) => c !== leader)!;
    await leader.kill();
    const killedAt = Date.now();
    // A change only the leader writes: a new policy's status, Enforced once both nodes hold it.
    await k.apply(policyObject('beta', 'after-failover', { podSelector: { matchLabels: { app: 'nothing' } }, policyTypes: ['Ingress'] }));
    await eventually(
      'NetworkPolicyStatus beta/after-failover Enforced, written by the standby',
      () => k.getJson(['get', 'networkpolicystatus', 'after-failover', '-n', 'beta']),
      (o) => cond(o, 'Enforced')?.status === 'True',
      20_000,
    );
    const tookMs = Date.now() - killedAt;
    const holder = (await k.getJson(['get', 'lease', 'weir-controller', '-n', NS])).spec.holderIdentity;
    assert.equal(holder, standby.pod.metadata.name);
    console.log(`controller failover: status written ${tookMs} ms after the leader's SIGKILL`);
    assert.ok(tookMs < 15_000, `${tookMs} ms`);
    await k.kubectl(['delete', 'networkpolicy', 'after-failover', '-n', 'beta']);
    // The killed replica's pod comes back, as its ReplicaSet would make it: a standby now.
    await k.stopPods([leader]);
    controllers = [standby, ...(await k.runDeployment(NS, 'weir-controller', [leader.node]))];
  });

  test('a rolling update: stopped agents leave the rules in place; helm upgrade with every option on runs agents that take over', async () => {
    await k.stopPods(agents);
    await k.expect(fromBetaOn80, 'no agent running: the rules stay', 2_000);

    await k.apply(monitoringCrd('PodMonitor'), monitoringCrd('ServiceMonitor'));
    await k.kubectl(['wait', '--for=condition=Established', 'crd/podmonitors.monitoring.coreos.com', 'crd/servicemonitors.monitoring.coreos.com', '--timeout=30s']);
    const upgraded = await k.helm(['upgrade', 'weir', CHART, '--namespace', NS, '-f', ALL_ON]);
    assert.equal(upgraded.code, 0, upgraded.stderr);
    const second = await manifest(2);
    released.push(...second);
    assert.deepEqual(
      (await lookUp(second)).filter((l) => !l.endsWith(': present')),
      [],
    );
    for (const kind of ['Service', 'PodMonitor', 'ServiceMonitor'])
      assert.ok(
        second.some((o) => o.kind === kind),
        `${kind} in the upgraded release`,
      );
    const ds = await k.getJson(['get', 'daemonset', 'weir', '-n', NS]);
    assert.equal(ds.metadata.generation, 2);
    assert.equal(ds.spec.updateStrategy.rollingUpdate.maxUnavailable, '50%');

    agents = await k.runDaemonSet(NS, 'weir');
    // The new values are in force: debug lines, RETURN as the allow action.
    assert.ok(
      agents.every((a) => a.log.some((l) => /"level":20/.test(l))),
      'log level debug',
    );
    await k.expect(fromBetaOn80, 'the upgraded agents enforce the same policy');
    await k.kubectl(['delete', 'networkpolicy', 'web-from-beta', '-n', 'alpha']);
    await k.expect(() => true, 'policy deleted: the upgraded agents follow the cluster');
    for (const a of agents) assert.equal((await k.probe(a, 'readinessProbe')).status, 200, `${a.node} ready after the upgrade`);
    assert.deepEqual(forbidden(agents), []);
  });

  test("helm uninstall: its hook has every running agent remove Weir's rules, names the node whose agent is down with the command that cleans it, and leaves no object behind", async () => {
    // node-b's agent is down at that moment: its rules stay until someone cleans the node.
    const [onA, onB] = [agents.find((a) => a.node === 'node-a')!, agents.find((a) => a.node === 'node-b')!];
    await onB.kill();
    const uninstalling = k.helm(['uninstall', 'weir', '--namespace', NS, '--wait']);
    const hook = await k.runJob(NS, 'weir-uninstall', 60_000);
    const r = await uninstalling;
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await hook.exitCode(1_000), 0, hook.log.join('\n'));
    const said = hook.log.join('\n');
    const command = 'kubectl debug node/node-b -n kube-system --profile=netadmin --image=registry.example/weir:test --arguments-only -- cleanup';
    assert.ok(said.includes(`node node-b: its agent did not confirm within 10 s`) && said.includes(command), said);
    assert.match(said, /1 of 2 nodes removed Weir's rules/);
    assert.ok(
      onA.log.some((l) => /removed everything Weir owned/.test(l)),
      onA.log.slice(-20).join('\n'),
    );
    const nodeA = await k.getJson(['get', 'nodepolicystatus', 'node-a']);
    assert.equal(cond(nodeA, 'Programmed')?.reason, 'Removed');
    assert.match(nodeA.status.removedFor, /^\d{14}-[0-9a-f]{6}$/);
    // What only Weir wrote is gone with it: no policy status says Enforced, no Lease is left.
    assert.equal((await k.kubectl(['get', 'networkpolicystatuses', '-A', '-o', 'name'])).trim(), '');
    await assert.rejects(k.kubectl(['get', 'lease', 'weir-controller', '-n', NS]), /NotFound|not found/);

    // The DaemonSet and the Deployment are gone: the kubelet stops their pods (SIGTERM).
    await k.stopPods([...agents, ...controllers, hook]);
    assert.deepEqual(
      (await lookUp(released)).filter((l) => !l.endsWith(': gone')),
      [],
    );
    assert.equal((await k.helm(['list', '--all-namespaces', '--all', '-q'])).stdout.trim(), '');
    assert.equal((await k.kubectl(['get', 'secrets', '-n', NS, '-l', 'owner=helm', '-o', 'name'])).trim(), '', 'no release record left');
    // The hook's Job stays for its log, an hour (the TTL controller deletes it); its account does not.
    assert.equal((await k.getJson(['get', 'job', 'weir-uninstall', '-n', NS])).spec.ttlSecondsAfterFinished, 3600);
    assert.equal((await k.kubectl(['get', 'serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings', '-A', '-l', 'app.kubernetes.io/instance=weir', '-o', 'name'])).trim(), '');
    // Helm never deletes the CRDs of a chart's crds/ (their objects would go with them).
    const crds = await readFile(join(CHART, 'crds/weir.dev_nodepolicystatuses.yaml'), 'utf8');
    assert.match(crds, /name: nodepolicystatuses\.weir\.dev/);
    await k.kubectl(['get', 'crd', 'nodepolicystatuses.weir.dev', 'networkpolicystatuses.weir.dev']);
  });

  test("after helm uninstall a new pod talks on a node its agent cleaned; on the node whose agent was down, once the hook's command has run", async () => {
    const B3 = 'beta/b3';
    await k.cluster.addPod({ namespace: 'alpha', name: 'a3', node: 'node-a', ips: ['10.244.1.13', 'fd00:10:244:1::13'] });
    await k.cluster.addPod({ namespace: 'beta', name: 'b3', node: 'node-b', ips: ['10.244.2.13', 'fd00:10:244:2::13'] });
    // node-b's rules, left in place, drop the traffic of every pod they do not know.
    await k.expect((c) => c.source === c.target || (c.source !== B3 && c.target !== B3), 'a3 reached from every pod; b3 cut off by the rules left on node-b');
    for (const save of ['iptables-nft-save', 'ip6tables-nft-save', 'iptables-legacy-save', 'ip6tables-legacy-save']) {
      const r = await run('ip', ['netns', 'exec', k.cluster.nodes[0]!.netns, save]);
      assert.doesNotMatch(r.stdout, /weir:/, `node-a ${save}`);
    }
    // The command the hook named, its pod run as a kubelet would.
    const out = await k.kubectl(['debug', 'node/node-b', '-n', NS, '--profile=netadmin', '--image=registry.example/weir:test', '--arguments-only', '--', 'cleanup']);
    const pod = /pod (node-debugger-\S+) /.exec(out)?.[1];
    assert.ok(pod, out);
    const [debug] = await k.runPod(NS, pod);
    assert.equal(await debug!.exitCode(20_000), 0, debug!.log.join('\n'));
    await k.expect(() => true, 'node-b cleaned: a3 and b3 reached like every pod');
    for (const node of k.cluster.nodes) {
      for (const save of ['iptables-nft-save', 'ip6tables-nft-save', 'iptables-legacy-save', 'ip6tables-legacy-save']) {
        const r = await run('ip', ['netns', 'exec', node.netns, save]);
        assert.doesNotMatch(r.stdout, /weir:/, `${node.name} ${save}`);
      }
    }
    // Forced: no kubelet here confirms the deletion of the (completed) pods.
    await k.kubectl(['delete', 'pods', '-n', NS, '--all', '--grace-period=0', '--force']);
    assert.equal((await k.kubectl(['get', 'pods', '-n', NS, '-o', 'name'])).trim(), '');
  });
});
