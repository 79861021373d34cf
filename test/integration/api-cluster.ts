// What both integration harnesses stand on (kube-harness.ts: Weir's agents run by the test;
// helm-harness.ts: the chart installed and its pods run as a kubelet would): a real
// kube-apiserver + etcd (scripts/control-plane.sh), the simulated two-node Flannel cluster of the
// conformance suite with a bridge to the API server in each node (bridge.ts), the cast's
// namespaces, nodes and pods created through the API, kubectl, service account tokens, and the
// truth-table check against the Weir processes' errors.

import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type Cluster, createCluster } from '../../src/sim/cluster.ts';
import type { Cell, Matrix } from '../../src/sim/prober.ts';
import { baseNamespaces, basePods, NODES, type PodDef } from '../conformance/harness.ts';
import { expectConverged } from '../support/eventually.ts';
import { podObject } from '../support/kube-objects.ts';
import type { LoggedProcess } from '../support/logged-process.ts';
import { type Bridge, bridgeApiServer } from './bridge.ts';
import { type ControlPlane, startControlPlane } from './controlplane.ts';

export type { Cell };
export { podObject, policyObject } from '../support/kube-objects.ts';
// biome-ignore lint/suspicious/noExplicitAny: Kubernetes objects from kubectl's JSON, read field by field
export type Obj = Record<string, any>;

export abstract class ApiCluster {
  readonly cp: ControlPlane;
  readonly cluster: Cluster;
  readonly bridges = new Map<string, Bridge>();

  protected constructor(cp: ControlPlane, cluster: Cluster) {
    this.cp = cp;
    this.cluster = cluster;
  }

  /**
   * Starts the API server (with `alongside`, e.g. a build, meanwhile) and the simulated cluster,
   * bridges each node to the API server, then runs `setUp`. On any failure it stops what it
   * started and rethrows.
   */
  protected static async boot<T extends ApiCluster>(
    tag: string,
    make: (cp: ControlPlane, cluster: Cluster) => T,
    setUp: (c: T) => Promise<void>,
    alongside: Promise<unknown> = Promise.resolve(),
  ): Promise<T> {
    const [cp] = await Promise.all([startControlPlane(), alongside]);
    let cluster: Cluster | undefined;
    let c: T | undefined;
    try {
      cluster = await createCluster({
        tag,
        nodes: NODES.map((n) => ({ name: n.name, podCIDRs: [...n.podCIDRs] })),
        pods: basePods().map((p) => ({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips })),
      });
      c = make(cp, cluster);
      const port = Number(new URL(cp.server).port);
      for (const node of cluster.nodes) c.bridges.set(node.name, await bridgeApiServer(node.netns, port));
      await setUp(c);
      return c;
    } catch (err) {
      if (c) await c.stop();
      else {
        await cluster?.destroy();
        await cp.stop();
      }
      throw err;
    }
  }

  /** The Weir processes running: their errors fail expect(), and stop() stops them. */
  protected abstract processes(): readonly LoggedProcess[];

  kubectl(args: readonly string[], input?: string): Promise<string> {
    return this.cp.kubectl(args, input);
  }

  async getJson(args: readonly string[]): Promise<Obj> {
    return JSON.parse(await this.kubectl([...args, '-o', 'json'])) as Obj;
  }

  /** kubectl apply -f - of objects (JSON is YAML). */
  async apply(...objects: unknown[]): Promise<void> {
    await this.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
  }

  /** Probes the full truth table until it matches, and throws with the last diff otherwise. */
  expect(allowed: (c: Cell) => boolean, what: string, timeoutMs = 10_000): Promise<Matrix> {
    return expectConverged(this.cluster, allowed, what, () => this.processes().flatMap((a) => a.errors), timeoutMs);
  }

  async stop(): Promise<void> {
    await Promise.allSettled(this.processes().map((a) => a.stop()));
    for (const b of this.bridges.values()) await b.close().catch(() => {});
    await this.cluster.destroy();
    await this.cp.stop();
  }

  /** A token for a service account (TokenRequest API), bound to a pod of its namespace when
   *  asked, as the kubelet mounts one (the token then names the pod's node). */
  async token(account: string, namespace: string, duration: string, boundPod?: string): Promise<string> {
    const bound = boundPod === undefined ? [] : ['--bound-object-kind', 'Pod', '--bound-object-name', boundPod];
    return (await this.kubectl(['create', 'token', account, '-n', namespace, `--duration=${duration}`, ...bound])).trim();
  }

  /** The admin kubeconfig's cluster entry: the server and its CA. */
  async adminCluster(): Promise<Record<string, string>> {
    const admin = (await this.getJson(['config', 'view', '--raw'])) as { clusters: { cluster: Record<string, string> }[] };
    return admin.clusters[0].cluster;
  }

  /** A kubeconfig for a service account, with a token of token(), written to a file. */
  async serviceAccountKubeconfig(name: string, namespace: string, file: string, boundPod?: string): Promise<string> {
    const token = await this.token(name, namespace, '2h', boundPod);
    return this.writeFile(
      file,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: await this.adminCluster() }],
        users: [{ name: 'u', user: { token } }],
        contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'ctx',
      }),
    );
  }

  /** Writes a file in the control plane's directory (for kubectl -f, kubeconfigs). */
  async writeFile(name: string, content: string): Promise<string> {
    const path = join(this.cp.dir, name);
    await writeFile(path, content);
    return path;
  }

  /** Namespaces, Nodes (labelled as their kubelet would) and Pods of the conformance cast,
   *  created through the API. */
  protected async createCast(): Promise<void> {
    const nss = Object.entries(baseNamespaces()).map(([name, labels]) => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } }));
    const nodes = this.cluster.nodes.map((n) => ({
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name: n.name, labels: { 'kubernetes.io/os': 'linux', 'kubernetes.io/hostname': n.name } },
      spec: { podCIDRs: n.podCIDRs, podCIDR: n.podCIDRs[0] },
    }));
    await this.apply(...nss, ...nodes);
    await this.kubectl(['wait', '--for=jsonpath={.metadata.name}', 'namespace/alpha', '--timeout=30s']);
    for (const p of basePods()) await this.createPod(p);
  }

  /** Creates a pod through the API and sets its status like a kubelet would (Running, IPs). */
  async createPod(p: PodDef): Promise<void> {
    await this.apply(podObject(p));
    await this.setPodStatus(p.namespace, p.name, p.phase ?? 'Running', p.ips);
  }

  async setPodStatus(namespace: string, name: string, phase: string, ips: readonly string[]): Promise<void> {
    const status = { phase, podIP: ips[0], podIPs: ips.map((ip) => ({ ip })), conditions: [{ type: 'Ready', status: phase === 'Running' ? 'True' : 'False' }] };
    await this.kubectl(['patch', 'pod', name, '-n', namespace, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status })]);
  }
}
