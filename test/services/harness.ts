// The Services tier: the integration tier's real API server, simulated two-node cluster and
// one `weir agent --kubeconfig` per node (kube-harness.ts), plus one real kube-proxy per node
// in that node's namespace, fed by the same API server. With no controller-manager, the tests
// create each Service's EndpointSlices themselves (as the EndpointSlice controller would, from
// the pods' addresses and nodes). Assertions are real packets from pods and the external host.

import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { EXTERNAL_KEY, type Endpoint } from '../../src/sim/cluster.ts';
import type { ProbeProto, ProbeResult } from '../../src/sim/probe-protocol.ts';
import { openProbeClient, type ProbeClient } from '../../src/sim/prober.ts';
import { familyOf, type Family } from '../../src/model/types.ts';
import { basePods, NODES, type PodDef } from '../conformance/harness.ts';
import { buildControlPlane } from '../integration/controlplane.ts';
import { KubeIntegration, policyObject } from '../integration/kube-harness.ts';
import { forgetProbeFlows } from '../support/conntrack.ts';
import { KubeProxy, type IptablesBackend, type ProxyMode } from './kube-proxy.ts';

export { policyObject };
export const CLUSTER_CIDRS = ['10.244.0.0/16', 'fd00:10:244::/48'] as const;
/** The underlay addresses: node-a is .1, node-b .2, the external host .200. */
export const NODE_IPS: Readonly<Record<string, Readonly<Record<Family, string>>>> = {
  'node-a': { 4: '172.31.0.1', 6: 'fd00:172:31::1' },
  'node-b': { 4: '172.31.0.2', 6: 'fd00:172:31::2' },
};
export const EXTERNAL_IPS: Readonly<Record<Family, string>> = { 4: '172.31.0.200', 6: 'fd00:172:31::200' };
/** cni0's addresses (the first host of each pod CIDR): what a pod sees after masquerade. */
export const GATEWAYS: Readonly<Record<string, Readonly<Record<Family, string>>>> = {
  'node-a': { 4: '10.244.1.1', 6: 'fd00:10:244:1::1' },
  'node-b': { 4: '10.244.2.1', 6: 'fd00:10:244:2::1' },
};
/** Every Service forwards this port to the pods' port 80, TCP and UDP. */
export const SERVICE_PORT = 8080;
export const TARGET_PORT = 80;

export interface ServicesOptions {
  readonly mode: ProxyMode;
  readonly backend: IptablesBackend;
  /** Extra flags for the agents. */
  readonly agentArgs?: readonly string[];
}

export interface ServiceDef {
  readonly namespace: string;
  readonly name: string;
  /** Pod keys ("ns/name") of the endpoints. */
  readonly backends: readonly string[];
  readonly type?: 'ClusterIP' | 'NodePort';
  /** NodePort services: the node port, for TCP and UDP alike. */
  readonly nodePort?: number;
  readonly externalTrafficPolicy?: 'Cluster' | 'Local';
}

export interface ServiceIPs {
  /** ClusterIP per family the Service has. */
  readonly clusterIPs: Partial<Record<Family, string>>;
}

const FAMILY_TYPE: Readonly<Record<Family, string>> = { 4: 'IPv4', 6: 'IPv6' };

export class Services {
  readonly k: KubeIntegration;
  readonly opts: ServicesOptions;
  readonly proxies = new Map<string, KubeProxy>();
  readonly dir: string;
  readonly #clients = new Map<string, ProbeClient>();
  readonly #ports = new Set<number>([SERVICE_PORT, TARGET_PORT]);
  /** Pods beside the base cast, added by a test. */
  readonly #added = new Map<string, PodDef>();

  private constructor(k: KubeIntegration, opts: ServicesOptions, dir: string) {
    this.k = k;
    this.opts = opts;
    this.dir = dir;
  }

  /** Control plane, cluster, agents (waiting for their first sync), then the kube-proxies. */
  static async start(opts: ServicesOptions): Promise<Services> {
    const bin = await buildControlPlane();
    const k = await KubeIntegration.start({ args: ['--backend', opts.backend, ...(opts.agentArgs ?? [])] });
    let s: Services | undefined;
    try {
      s = new Services(k, opts, await mkdtemp(join(tmpdir(), 'weir-services-')));
      await s.hairpinAll();
      // kube-proxy learns its node's addresses (NodePort, primary family) from the Node object.
      for (const n of NODES) {
        const addresses = Object.values(NODE_IPS[n.name]).map((address) => ({ type: 'InternalIP', address }));
        await k.kubectl(['patch', 'node', n.name, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: { addresses } })]);
      }
      for (const node of k.cluster.nodes) {
        const p = new KubeProxy({
          bin: join(bin, 'kube-proxy'),
          node: node.name,
          netns: node.netns,
          kubeconfig: k.cp.kubeconfig,
          mode: opts.mode,
          backend: opts.backend,
          dir: s.dir,
          clusterCIDRs: CLUSTER_CIDRS,
        });
        s.proxies.set(node.name, p);
        p.start();
      }
      await s.waitProxiesSynced();
      return s;
    } catch (err) {
      if (s) await s.stop();
      else await k.stop();
      throw err;
    }
  }

  get cluster() {
    return this.k.cluster;
  }

  netns(node: string): string {
    return this.cluster.nodes.find((n) => n.name === node)!.netns;
  }

  /**
   * Turns hairpin mode on for every pod port of every node's bridge, as Flannel's CNI config
   * does (the bridge plugin's hairpinMode): a pod reaching itself through a Service comes back
   * on the port it left by, since br_netfilter bridges a DNATed frame whose new destination is
   * on the same bridge, and a bridge sends nothing back out of its ingress port otherwise.
   */
  async hairpinAll(): Promise<void> {
    for (const n of this.cluster.nodes) {
      const ports = JSON.parse((await execa('ip', ['-n', n.netns, '-j', 'link', 'show', 'master', 'cni0'])).stdout) as { ifname: string }[];
      for (const { ifname } of ports) await execa('ip', ['-n', n.netns, 'link', 'set', 'dev', ifname, 'type', 'bridge_slave', 'hairpin', 'on']);
    }
  }

  /** Waits until every kube-proxy has written its rules at least once since it (re)started. */
  async waitProxiesSynced(timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (const p of this.proxies.values()) {
      for (;;) {
        if (!p.running) throw new Error(`kube-proxy on ${p.node} exited:\n${p.tail()}`);
        // Logged at -v=2 after every successful write of its rules, per family (both modes).
        const done = p.grep(/SyncProxyRules complete/).join('\n');
        if (done.includes('ipFamily="IPv4"') && done.includes('ipFamily="IPv6"')) break;
        if (Date.now() > deadline) throw new Error(`kube-proxy on ${p.node} wrote no rules within ${timeoutMs} ms:\n${p.tail()}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  /** Creates (or replaces) a Service and its EndpointSlices, one per family of the backends. */
  async service(def: ServiceDef): Promise<ServiceIPs> {
    const pods = def.backends.map((key) => {
      const p = basePods().find((b) => `${b.namespace}/${b.name}` === key) ?? this.#added.get(key);
      if (!p) throw new Error(`no pod ${key}`);
      return p;
    });
    const families = ([4, 6] as const).filter((f) => pods.some((p) => p.ips.some((ip) => familyOf(ip) === f)));
    const ports = (['TCP', 'UDP'] as const).map((protocol) => ({
      name: protocol.toLowerCase(),
      protocol,
      port: SERVICE_PORT,
      targetPort: TARGET_PORT,
      ...(def.nodePort === undefined ? {} : { nodePort: def.nodePort }),
    }));
    const svc = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { namespace: def.namespace, name: def.name },
      spec: {
        type: def.type ?? 'ClusterIP',
        ipFamilyPolicy: families.length === 2 ? 'RequireDualStack' : 'SingleStack',
        ipFamilies: families.map((f) => FAMILY_TYPE[f]),
        ports,
        ...(def.externalTrafficPolicy ? { externalTrafficPolicy: def.externalTrafficPolicy } : {}),
      },
    };
    const slices = families.map((f) => ({
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {
        namespace: def.namespace,
        name: `${def.name}-ipv${f}`,
        labels: { 'kubernetes.io/service-name': def.name, 'endpointslice.kubernetes.io/managed-by': 'weir-services-test' },
      },
      addressType: FAMILY_TYPE[f],
      ports: ports.map((p) => ({ name: p.name, protocol: p.protocol, port: TARGET_PORT })),
      endpoints: pods
        .filter((p) => p.ips.some((ip) => familyOf(ip) === f))
        .map((p) => ({
          addresses: [p.ips.find((ip) => familyOf(ip) === f)!],
          conditions: { ready: true, serving: true, terminating: false },
          nodeName: p.node,
          targetRef: { kind: 'Pod', namespace: p.namespace, name: p.name },
        })),
    }));
    await this.k.apply(svc, ...slices);
    if (def.nodePort !== undefined) this.#ports.add(def.nodePort);
    const got = JSON.parse(await this.k.kubectl(['get', 'service', def.name, '-n', def.namespace, '-o', 'json'])) as { spec: { clusterIPs: string[] } };
    const clusterIPs: Partial<Record<Family, string>> = {};
    for (const ip of got.spec.clusterIPs) clusterIPs[familyOf(ip)] = ip;
    return { clusterIPs };
  }

  /** A pod beside the base cast: its namespace on the node, then its API object, Running. */
  async addPod(def: PodDef): Promise<void> {
    const key = `${def.namespace}/${def.name}`;
    await this.cluster.addPod({ namespace: def.namespace, name: def.name, node: def.node, ips: def.ips });
    this.#added.set(key, def);
    await this.k.createPod(def);
  }

  /** Deletes an added pod's API object (as a kubelet confirms a deletion), then its namespace. */
  async removePod(key: string): Promise<void> {
    const def = this.#added.get(key);
    if (!def) throw new Error(`no added pod ${key}`);
    await this.k.kubectl(['delete', 'pod', def.name, '-n', def.namespace, '--grace-period=0', '--force']);
    this.#added.delete(key);
    await this.cluster.removePod(key);
  }

  async removeAddedPods(): Promise<void> {
    for (const key of [...this.#added.keys()]) await this.removePod(key);
  }

  /** Replaces every NetworkPolicy with these (policyObject shapes). */
  async setPolicies(...policies: unknown[]): Promise<void> {
    await this.k.kubectl(['delete', 'networkpolicy', '--all', '--all-namespaces', '--wait=true']);
    if (policies.length > 0) await this.k.apply(...policies);
  }

  /** One probe from an endpoint's namespace (a pod or the external host). UDP flows of
   *  Service and target ports are forgotten first: a probe measures what a new flow gets. */
  async probe(from: string, ip: string, port: number, proto: ProbeProto = 'tcp', timeoutMs = 400): Promise<ProbeResult> {
    await this.forgetFlows();
    let c = this.#clients.get(from);
    if (!c) {
      const ep = this.cluster.endpoint(from);
      if (!ep) throw new Error(`no endpoint ${from}`);
      c = await openProbeClient(ep);
      this.#clients.set(from, c);
    }
    return c.probe({ proto, ip, port, timeoutMs });
  }

  /** The name of the server that answered, or null when the probe got no answer. */
  async reach(from: string, ip: string, port: number, proto: ProbeProto = 'tcp'): Promise<string | null> {
    const r = await this.probe(from, ip, port, proto);
    return r.ok ? (r.reply ?? '') : null;
  }

  /**
   * Polls until every probe gives what is expected (a server's name, or null for blocked),
   * all in the same round: the agents and kube-proxies converge asynchronously.
   */
  async expectReach(what: string, cases: readonly ReachCase[], timeoutMs = 15_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const got = await Promise.all(cases.map((c) => this.reach(c.from, c.ip, c.port, c.proto ?? 'tcp')));
      const wrong = cases.map((c, i) => ({ c, got: got[i] })).filter(({ c, got }) => got !== c.expect);
      if (wrong.length === 0) return;
      if (Date.now() > deadline) {
        assert.fail(
          `${what}: ${wrong.length} of ${cases.length} probes differ:\n  ${wrong
            .map(({ c, got }) => `${c.from} -> ${c.ip}:${c.port}/${c.proto ?? 'tcp'} (${c.why}): expected ${c.expect ?? 'blocked'}, got ${got ?? 'blocked'}`)
            .join('\n  ')}\nagent errors: ${this.k.agents.flatMap((a) => a.errors).join('\n') || 'none'}`,
        );
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** Forgets the UDP flows of every port the tests use, in every node (kube-proxy's NAT
   *  flows would otherwise carry a later probe from the same source port as ESTABLISHED). */
  async forgetFlows(): Promise<void> {
    await forgetProbeFlows({ nodes: this.cluster.nodes, ports: [...this.#ports] });
  }

  endpoint(key: string): Endpoint {
    const ep = key === EXTERNAL_KEY ? this.cluster.external : this.cluster.endpoint(key);
    if (!ep) throw new Error(`no endpoint ${key}`);
    return ep;
  }

  async stop(): Promise<void> {
    for (const c of this.#clients.values()) c.close();
    await Promise.allSettled([...this.proxies.values()].map((p) => p.stop()));
    await this.k.stop();
    await rm(this.dir, { recursive: true, force: true });
  }
}

export interface ReachCase {
  readonly from: string;
  readonly ip: string;
  readonly port: number;
  readonly proto?: ProbeProto;
  /** The answering server's name, or null: blocked. */
  readonly expect: string | null;
  /** Why, for the failure message. */
  readonly why: string;
}
