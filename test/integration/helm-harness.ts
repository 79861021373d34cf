// The chart's tests' tools: helm (built by scripts/helm.sh, cached), the chart rendered and
// parsed, and a simulated cluster on a real API server where the chart is installed and its
// DaemonSet's pods are run by hand as a kubelet would (helm-kubelet.ts).

import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import type { Cluster } from '../../src/sim/cluster.ts';
import type { LoggedProcess } from '../support/logged-process.ts';
import { ok, type Run, run } from '../support/run.ts';
import { ApiCluster, type Obj } from './api-cluster.ts';
import type { ControlPlane } from './controlplane.ts';
import { ContainerProcess, containerScript, daemonSetPod, deploymentPod, jobPod } from './helm-kubelet.ts';

export type { Cell, Obj } from './api-cluster.ts';
export const REPO = fileURLToPath(new URL('../../', import.meta.url));
export const CHART = join(REPO, 'charts/weir');
const HELM_SCRIPT = join(REPO, 'scripts/helm.sh');

export { ok, type Run, run };

let helmPath: Promise<string> | undefined;

/** Builds helm unless cached (a few minutes the first time); resolves to its path. */
export function buildHelm(): Promise<string> {
  helmPath ??= run(HELM_SCRIPT, ['build'], { passStderr: true }).then((r) => ok('scripts/helm.sh build', r).trim());
  return helmPath;
}

/** Runs helm; resolves whatever its exit status. */
export async function helm(args: readonly string[], input?: string): Promise<Run> {
  return run(await buildHelm(), args, { input });
}

/** `helm template weir charts/weir -n kube-system ARGS`, parsed: one object per document. */
export async function render(args: readonly string[] = []): Promise<Obj[]> {
  const out = ok(`helm template ${args.join(' ')}`, await helm(['template', 'weir', CHART, '--namespace', 'kube-system', ...args]));
  return parseDocs(out);
}

export function parseDocs(text: string): Obj[] {
  return (loadAll(text) as (Obj | null)[]).filter((d): d is Obj => d !== null && typeof d === 'object');
}

export const find = (docs: readonly Obj[], kind: string, name?: string): Obj | undefined => docs.find((d) => d.kind === kind && (name === undefined || d.metadata.name === name));

/**
 * A real API server (no controllers, no kubelet) and the simulated two-node Flannel cluster
 * of the conformance suite (api-cluster.ts), with its namespaces, nodes and pods created through
 * the API, and nothing of Weir's: the chart brings the CRDs, RBAC and admission policies.
 */
export class ChartCluster extends ApiCluster {
  readonly containers: ContainerProcess[] = [];
  #runs = 0;

  private constructor(cp: ControlPlane, cluster: Cluster) {
    super(cp, cluster);
  }

  static start(): Promise<ChartCluster> {
    return ApiCluster.boot(
      'whelm',
      (cp, cluster) => new ChartCluster(cp, cluster),
      (c) => c.createCast(),
      buildHelm(),
    );
  }

  protected processes(): readonly LoggedProcess[] {
    return this.containers;
  }

  /** helm against this API server; resolves whatever its exit status. */
  helm(args: readonly string[], input?: string): Promise<Run> {
    return helm([...args, '--kubeconfig', this.cp.kubeconfig], input);
  }

  /**
   * Does for each node what the DaemonSet controller, the scheduler and the kubelet would:
   * creates the DaemonSet's pod there, gets it a token bound to it (TokenRequest), and runs
   * its containers as written. Resolves once every agent has written its first full sync.
   */
  async runDaemonSet(namespace: string, name: string): Promise<ContainerProcess[]> {
    const ds = await this.getJson(['get', 'daemonset', name, '-n', namespace]);
    const started: ContainerProcess[] = [];
    for (const node of this.cluster.nodes) {
      const created = JSON.parse(await this.kubectl(['create', '-f', '-', '-o', 'json'], JSON.stringify(daemonSetPod(ds, node.name)))) as Obj;
      started.push(...(await this.runPod(namespace, created.metadata.name)));
    }
    await Promise.all(started.map((c) => c.waitFor((r) => r.msg === 'resynced dataplane', 30_000, 'first sync')));
    return started;
  }

  /**
   * Does what the Deployment's ReplicaSet, the scheduler and the kubelet would: one pod of its
   * template per replica, each on its own node (the chart's anti-affinity), run as written.
   * Resolves once every replica has listed the cluster. `onNodes`: only these replicas.
   */
  async runDeployment(namespace: string, name: string, onNodes?: readonly string[]): Promise<ContainerProcess[]> {
    const deployment = await this.getJson(['get', 'deployment', name, '-n', namespace]);
    const replicas: number = deployment.spec.replicas ?? 1;
    if (replicas > this.cluster.nodes.length) throw new Error(`deployment ${name}: ${replicas} replicas, one per node, on ${this.cluster.nodes.length} nodes`);
    const started: ContainerProcess[] = [];
    for (const node of onNodes ?? this.cluster.nodes.slice(0, replicas).map((n) => n.name)) {
      const created = JSON.parse(await this.kubectl(['create', '-f', '-', '-o', 'json'], JSON.stringify(deploymentPod(deployment, node)))) as Obj;
      started.push(...(await this.runPod(namespace, created.metadata.name)));
    }
    await Promise.all(started.map((c) => c.waitFor((r) => /every kind listed/.test(r.msg ?? ''), 30_000, 'the first complete view')));
    return started;
  }

  /**
   * What the Job controller and a kubelet would do for a Job, once it appears: runs its pod on
   * the first node, waits for it to exit, and records the outcome in the Job's status (as
   * `helm` waits for a hook Job to complete).
   */
  async runJob(namespace: string, name: string, timeoutMs: number): Promise<ContainerProcess> {
    const deadline = Date.now() + timeoutMs;
    let job: Obj | undefined;
    while (job === undefined) {
      try {
        job = await this.getJson(['get', 'job', name, '-n', namespace]);
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`job ${namespace}/${name} did not appear within ${timeoutMs} ms: ${err}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    const startTime = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    const node = this.cluster.nodes[0];
    if (node === undefined) throw new Error('the simulated cluster has no node');
    const created = JSON.parse(await this.kubectl(['create', '-f', '-', '-o', 'json'], JSON.stringify(jobPod(job, node.name)))) as Obj;
    const [c] = await this.runPod(namespace, created.metadata.name);
    if (c === undefined) throw new Error(`job ${namespace}/${name}: its pod has no container`);
    const code = await c.exitCode(Math.max(1_000, deadline - Date.now()));
    const now = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    const cond = (type: string) => ({ type, status: 'True', lastProbeTime: now, lastTransitionTime: now });
    const status =
      code === 0
        ? { startTime, completionTime: now, succeeded: 1, conditions: [cond('SuccessCriteriaMet'), cond('Complete')] }
        : {
            startTime,
            failed: 1,
            conditions: [
              { ...cond('FailureTarget'), reason: 'BackoffLimitExceeded' },
              { ...cond('Failed'), reason: 'BackoffLimitExceeded' },
            ],
          };
    await this.kubectl(['patch', 'job', name, '-n', namespace, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status })]);
    return c;
  }

  /**
   * The kubelet's part for a pod bound to a simulated node: sets its status (host network:
   * the node's addresses), mounts it a token bound to it, and starts its containers.
   */
  async runPod(namespace: string, podName: string): Promise<ContainerProcess[]> {
    const bound = await this.getJson(['get', 'pod', podName, '-n', namespace]);
    const node = this.cluster.nodes.find((n) => n.name === bound.spec.nodeName);
    if (node === undefined) throw new Error(`pod ${namespace}/${podName} is not bound to a simulated node (${bound.spec.nodeName})`);
    const ips = node.underlayIPs.map((ip) => ({ ip }));
    const status = { phase: 'Running', hostIP: ips[0].ip, hostIPs: ips, podIP: ips[0].ip, podIPs: ips, conditions: [{ type: 'Ready', status: 'True' }] };
    await this.kubectl(['patch', 'pod', podName, '-n', namespace, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status })]);
    const pod = await this.getJson(['get', 'pod', podName, '-n', namespace]);
    const sa: string = pod.spec.serviceAccountName ?? 'default';
    // Without a controller manager only the chart's account exists: another pod gets none.
    const accounts = await this.kubectl(['get', 'serviceaccounts', '-n', namespace, '-o', 'name']);
    const token = accounts.split('\n').includes(`serviceaccount/${sa}`) ? await this.token(sa, namespace, '1h', podName) : '';
    const caCrt = Buffer.from((await this.adminCluster())['certificate-authority-data'], 'base64').toString();
    const started: ContainerProcess[] = [];
    this.#runs++;
    for (const container of pod.spec.containers as Obj[]) {
      const dir = join(this.cp.dir, `kubelet-${this.#runs}-${node.name}-${container.name}`);
      await mkdir(dir, { recursive: true });
      const script = join(dir, 'run.sh');
      const made = await containerScript({ pod, container, netns: node.netns, dir, token, caCrt, apiHost: '127.0.0.1', apiPort: Number(new URL(this.cp.server).port) });
      await writeFile(script, made.script);
      const c = new ContainerProcess({ node: node.name, netns: node.netns, pod, container, script, skippedMounts: made.skipped });
      this.containers.push(c);
      started.push(c);
    }
    return started;
  }

  /**
   * The container's liveness or readiness probe, sent as the kubelet sends it: an HTTP GET
   * from the node (its own network namespace) to the pod's IP (the node's, on the host
   * network) and the named port. Resolves to the status and body (status 0: no answer).
   */
  async probe(c: ContainerProcess, which: 'livenessProbe' | 'readinessProbe'): Promise<{ status: number; body: string }> {
    const get = c.container[which]?.httpGet;
    if (get === undefined) throw new Error(`container ${c.container.name} has no ${which}.httpGet`);
    const port = typeof get.port === 'number' ? get.port : (c.container.ports ?? []).find((p: Obj) => p.name === get.port)?.containerPort;
    if (port === undefined) throw new Error(`${which}: no container port named ${get.port}`);
    const host: string = get.host ?? c.pod.status.podIP;
    const url = `${(get.scheme ?? 'HTTP').toLowerCase()}://${host.includes(':') ? `[${host}]` : host}:${port}${get.path ?? '/'}`;
    const timeoutMs = (c.container[which].timeoutSeconds ?? 1) * 1000;
    const script = `fetch(${JSON.stringify(url)}, { signal: AbortSignal.timeout(${timeoutMs}) }).then(async (r) => console.log(JSON.stringify({ status: r.status, body: await r.text() })), (e) => console.log(JSON.stringify({ status: 0, body: String(e) })))`;
    const r = await run('ip', ['netns', 'exec', c.netns, process.execPath, '-e', script]);
    return JSON.parse(ok(`probe ${url}`, r)) as { status: number; body: string };
  }

  /** What a rolling update or an uninstall does to each pod: the kubelet stops the
   *  container (SIGTERM, SIGKILL after the grace period) and the pod object goes. */
  async stopPods(containers: readonly ContainerProcess[]): Promise<void> {
    await Promise.all(containers.map((c) => c.stop((c.pod.spec.terminationGracePeriodSeconds ?? 30) * 1000)));
    for (const c of containers) await this.kubectl(['delete', 'pod', c.pod.metadata.name, '-n', c.pod.metadata.namespace, '--grace-period=0', '--force', '--ignore-not-found']);
  }
}
