// The integration tier: a real kube-apiserver and the simulated two-node Flannel cluster of the
// conformance suite (api-cluster.ts), one `weir agent --kubeconfig` process per node inside that
// node's namespace, reaching the API server through its bridge, and, when asked, one
// `weir controller` on node-a's host network, which writes the policies' status.
// Pods are created through the API with their status subresource set to the simulated IPs;
// policies, labels and deletions are driven with real kubectl; assertions are real packets.

import { fileURLToPath } from 'node:url';
import type { Cluster } from '../../src/sim/cluster.ts';
import { AgentProcess } from '../support/agent-process.ts';
import { eventually } from '../support/eventually.ts';
import type { LoggedProcess } from '../support/logged-process.ts';
import { ApiCluster } from './api-cluster.ts';
import type { ControlPlane } from './controlplane.ts';

export { type Cell, podObject, policyObject } from './api-cluster.ts';
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

export class KubeIntegration extends ApiCluster {
  readonly agents: AgentProcess[] = [];
  readonly controllers: AgentProcess[] = [];
  /** Each node's agent kubeconfig: the service account of deploy/rbac.yaml, with a token bound
   *  to that node's agent pod (as the kubelet mounts it), so the admission policy knows the node. */
  readonly agentKubeconfigs = new Map<string, string>();
  readonly #opts: AgentOptions;

  private constructor(cp: ControlPlane, cluster: Cluster, opts: AgentOptions) {
    super(cp, cluster);
    this.#opts = opts;
  }

  static start(opts: AgentOptions = {}): Promise<KubeIntegration> {
    return ApiCluster.boot(
      'wint',
      (cp, cluster) => new KubeIntegration(cp, cluster, opts),
      async (k) => {
        await k.#createObjects();
        if (opts.daemonSet) await k.apply(daemonSetObject());
        // Agents run as the service account of deploy/rbac.yaml under deploy/admission-policy.yaml,
        // so what Weir ships is proven.
        if (opts.kubeconfig === undefined) {
          for (const node of k.cluster.nodes) {
            await k.apply(agentPod(node.name));
            k.agentKubeconfigs.set(node.name, await k.serviceAccountKubeconfig('weir', 'kube-system', `agent-${node.name}.kubeconfig`, agentPodName(node.name)));
          }
        }
        for (const node of k.cluster.nodes) k.startAgent(node.name, opts);
        if (opts.controller) await k.startController('c0');
        await Promise.all(k.agents.map((a) => a.waitFor((r) => r.msg === 'resynced dataplane', 30_000, 'first sync')));
      },
    );
  }

  protected processes(): readonly LoggedProcess[] {
    return [...this.agents, ...this.controllers];
  }

  startAgent(node: string, opts: AgentOptions = {}): AgentProcess {
    const netns = this.#netns(node);
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
    const netns = this.#netns(this.cluster.nodes[0]?.name ?? '');
    const watch = this.#opts.daemonSet ? ['--daemonset', DAEMONSET] : [];
    const c = new AgentProcess(identity, netns, ['--kubeconfig', kubeconfig, '--identity', identity, '--log-level', 'info', ...watch], ['controller']);
    this.controllers.push(c);
    await c.waitFor((r) => /every kind listed/.test(r.msg ?? ''), 30_000, 'the first complete view');
    return c;
  }

  #netns(node: string): string {
    const n = this.cluster.nodes.find((x) => x.name === node);
    if (n === undefined) throw new Error(`no simulated node ${node}`);
    return n.netns;
  }

  /** Weir's CRDs, RBAC and admission policies, then the conformance cast. */
  async #createObjects(): Promise<void> {
    await this.kubectl(['apply', '-f', CRDS]);
    // A CRD created a moment ago may have null conditions, which kubectl wait reads as an error,
    // not as "not yet": retried. ClusterNetworkPolicy's too, or the agents would find it only at
    // their next relist.
    const crds = ['crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev', 'crd/clusternetworkpolicies.policy.networking.k8s.io'];
    await eventually(
      'the CRDs Established',
      () => this.kubectl(['wait', '--for=condition=Established', ...crds, '--timeout=30s']),
      () => true,
      60_000,
    );
    await this.kubectl(['apply', '-f', RBAC, '-f', ADMISSION]);
    await this.createCast();
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
