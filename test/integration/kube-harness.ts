// The integration tier: a real kube-apiserver + etcd (scripts/control-plane.sh), the simulated
// two-node Flannel cluster of the conformance suite, one `weir agent --kubeconfig` process
// per node inside that node's namespace, reaching the API server through a bridge (bridge.ts),
// and, when asked, one `weir controller` on node-a's host network, which writes the policies' status.
// Pods are created through the API with their status subresource set to the simulated IPs;
// policies, labels and deletions are driven with real kubectl; assertions are real packets.

import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createCluster, type Cluster } from '../../src/sim/cluster.ts';
import type { Cell, Matrix } from '../../src/sim/prober.ts';
import { expectConverged } from '../support/eventually.ts';
import { basePods, baseNamespaces, NODES, type PodDef } from '../conformance/harness.ts';
import { AgentProcess } from '../support/agent-process.ts';
import { bridgeApiServer, type Bridge } from './bridge.ts';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

export type { Cell };
const CRDS = fileURLToPath(new URL('../../crds/', import.meta.url));
const RBAC = fileURLToPath(new URL('../../deploy/rbac.yaml', import.meta.url));
const ADMISSION = fileURLToPath(new URL('../../deploy/admission-policy.yaml', import.meta.url));

export interface AgentOptions {
  /** Extra flags, e.g. a short --watch-idle-timeout for the stall test. */
  readonly args?: readonly string[];
  /** Another kubeconfig than the admin's (the RBAC test). */
  readonly kubeconfig?: string;
  /** Also start a controller (without it nothing writes NetworkPolicyStatus or Events). */
  readonly controller?: boolean;
  /** Create the chart's DaemonSet object, kube-system/weir (no pods: the agents run here),
   *  and have the agents and the controller watch it for the uninstall signal. */
  readonly daemonSet?: boolean;
}

export class KubeIntegration {
  readonly cp: ControlPlane;
  readonly cluster: Cluster;
  readonly agents: AgentProcess[] = [];
  readonly controllers: AgentProcess[] = [];
  readonly bridges = new Map<string, Bridge>();
  /** Each node's agent kubeconfig: the service account of deploy/rbac.yaml, with a token bound
   *  to that node's agent pod (as the kubelet mounts it), so the admission policy knows the node. */
  readonly agentKubeconfigs = new Map<string, string>();
  #opts: AgentOptions = {};

  private constructor(cp: ControlPlane, cluster: Cluster) {
    this.cp = cp;
    this.cluster = cluster;
  }

  static async start(options: AgentOptions = {}): Promise<KubeIntegration> {
    const opts = options;
    const cp = await startControlPlane();
    let cluster: Cluster | undefined;
    let k: KubeIntegration | undefined;
    try {
      cluster = await createCluster({
        tag: 'wint',
        nodes: NODES.map((n) => ({ name: n.name, podCIDRs: [...n.podCIDRs] })),
        pods: basePods().map((p) => ({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips })),
      });
      k = new KubeIntegration(cp, cluster);
      k.#opts = opts;
      await k.#createObjects();
      if (opts.daemonSet) await k.apply(daemonSetObject());
      // Agents run as the service account of deploy/rbac.yaml under deploy/admission-policy.yaml,
      // so what Weir ships is proven.
      if (opts.kubeconfig === undefined) {
        for (const node of cluster.nodes) {
          await k.apply(agentPod(node.name));
          k.agentKubeconfigs.set(node.name, await k.serviceAccountKubeconfig('weir', 'kube-system', `agent-${node.name}.kubeconfig`, agentPodName(node.name)));
        }
      }
      const port = Number(new URL(cp.server).port);
      for (const node of cluster.nodes) k.bridges.set(node.name, await bridgeApiServer(node.netns, port));
      for (const node of cluster.nodes) k.startAgent(node.name, opts);
      if (opts.controller) await k.startController('c0');
      await Promise.all(k.agents.map((a) => a.waitFor((r) => r.msg === 'resynced dataplane', 30_000, 'first sync')));
      return k;
    } catch (err) {
      if (k) await k.stop();
      else {
        await cluster?.destroy();
        await cp.stop();
      }
      throw err;
    }
  }

  startAgent(node: string, opts: AgentOptions = {}): AgentProcess {
    const netns = this.cluster.nodes.find((n) => n.name === node)!.netns;
    const kubeconfig = opts.kubeconfig ?? this.agentKubeconfigs.get(node) ?? this.cp.kubeconfig;
    const watch = (opts.daemonSet ?? this.#opts.daemonSet) ? ['--daemonset', DAEMONSET] : [];
    const a = new AgentProcess(node, netns, ['--kubeconfig', kubeconfig, '--log-level', 'info', '--resync-interval', '5', ...watch, ...(opts.args ?? [])]);
    this.agents.push(a);
    return a;
  }

  /** A `weir controller` replica on node-a, as the service account of deploy/rbac.yaml (the
   *  chart's Deployment in kube-system), competing for its Lease. Resolves once it listed. */
  async startController(identity: string): Promise<AgentProcess> {
    const kubeconfig = await this.serviceAccountKubeconfig('weir-controller', 'kube-system', `controller-${identity}.kubeconfig`);
    const netns = this.cluster.nodes[0]!.netns;
    const watch = this.#opts.daemonSet ? ['--daemonset', DAEMONSET] : [];
    const c = new AgentProcess(identity, netns, ['--kubeconfig', kubeconfig, '--identity', identity, '--log-level', 'info', ...watch], ['controller']);
    this.controllers.push(c);
    await c.waitFor((r) => /every kind listed/.test(r.msg ?? ''), 30_000, 'the first complete view');
    return c;
  }

  kubectl(args: readonly string[], input?: string): Promise<string> {
    return this.cp.kubectl(args, input);
  }

  /** kubectl apply -f - of objects (JSON is YAML). */
  async apply(...objects: unknown[]): Promise<void> {
    await this.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
  }

  /** Probes the full truth table until it matches, and throws with the last diff otherwise. */
  expect(allowed: (c: Cell) => boolean, what: string, timeoutMs = 10_000): Promise<Matrix> {
    return expectConverged(this.cluster, allowed, what, () => this.agents.flatMap((a) => a.errors), timeoutMs);
  }

  async stop(): Promise<void> {
    await Promise.allSettled([...this.agents, ...this.controllers].map((a) => a.stop()));
    for (const b of this.bridges.values()) await b.close().catch(() => {});
    await this.cluster.destroy();
    await this.cp.stop();
  }

  /** A kubeconfig for a service account (token from the TokenRequest API), written to a file;
   *  with boundPod, the token is bound to that pod of the same namespace and names its node. */
  async serviceAccountKubeconfig(name: string, namespace: string, file: string, boundPod?: string): Promise<string> {
    const bound = boundPod === undefined ? [] : ['--bound-object-kind', 'Pod', '--bound-object-name', boundPod];
    const token = (await this.kubectl(['create', 'token', name, '-n', namespace, '--duration=2h', ...bound])).trim();
    const admin = JSON.parse(await this.kubectl(['config', 'view', '--raw', '-o', 'json'])) as { clusters: { cluster: Record<string, string> }[] };
    return this.writeFile(
      file,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: admin.clusters[0].cluster }],
        users: [{ name: 'u', user: { token } }],
        contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'ctx',
      }),
    );
  }

  /** Namespaces, Nodes and Pods of the conformance cast, created through the API. */
  async #createObjects(): Promise<void> {
    await this.kubectl(['apply', '-f', CRDS]);
    await this.kubectl(['wait', '--for=condition=Established', 'crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev', '--timeout=30s']);
    await this.kubectl(['apply', '-f', RBAC, '-f', ADMISSION]);
    const nss = Object.entries(baseNamespaces()).map(([name, labels]) => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } }));
    const nodes = NODES.map((n) => ({ apiVersion: 'v1', kind: 'Node', metadata: { name: n.name }, spec: { podCIDRs: n.podCIDRs, podCIDR: n.podCIDRs[0] } }));
    await this.apply(...nss, ...nodes);
    await this.cp.kubectl(['wait', '--for=jsonpath={.metadata.name}', 'namespace/alpha', '--timeout=30s']);
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

  /** Writes an object to a file in the control plane's directory (for kubectl -f). */
  async writeFile(name: string, content: string): Promise<string> {
    const path = join(this.cp.dir, name);
    await writeFile(path, content);
    return path;
  }
}

const agentPodName = (node: string): string => `weir-agent-${node}`;

/** The chart's DaemonSet as deploy/rbac.yaml names it. */
export const DAEMONSET = 'kube-system/weir';

/** A DaemonSet object named as the chart's (no controller manager here makes its pods). */
const daemonSetObject = () => ({
  apiVersion: 'apps/v1',
  kind: 'DaemonSet',
  metadata: { name: 'weir', namespace: 'kube-system' },
  spec: {
    selector: { matchLabels: { app: 'weir' } },
    template: { metadata: { labels: { app: 'weir' } }, spec: { containers: [{ name: 'agent', image: 'weir:0.1.0' }] } },
  },
});

/** The agent's own pod on a node, as its DaemonSet would make it (host network: never policed). */
function agentPod(node: string): unknown {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: agentPodName(node), namespace: 'kube-system', labels: { app: 'weir-agent' } },
    spec: { nodeName: node, serviceAccountName: 'weir', hostNetwork: true, containers: [{ name: 'agent', image: 'registry.invalid/weir' }] },
  };
}

export function podObject(p: PodDef): unknown {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: p.name, namespace: p.namespace, labels: p.labels },
    spec: {
      nodeName: p.node,
      hostNetwork: p.hostNetwork ?? false,
      containers: [{ name: 'server', image: 'registry.invalid/weir-sim-server', ports: p.ports }],
    },
  };
}

export function policyObject(namespace: string, name: string, spec: unknown): unknown {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { namespace, name }, spec };
}
