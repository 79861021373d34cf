// A simulated Flannel (host-gw) cluster made of network namespaces, for conformance tests
// and `weir demo`. Layout, all under one unique prefix:
//   <prefix>underlay  bridge br0: the "physical" network between nodes (172.31.0.0/24, fd00:172:31::/64)
//   <prefix>nodeN     eth0 on the underlay (.N / ::N), cni0 bridge holding the pod gateways,
//                     forwarding on, br_netfilter on (so bridged pod frames traverse FORWARD),
//                     a route to every other node's pod CIDRs via that node (host-gw).
//                     Weir's agent runs here: `ip netns exec <node.netns> ...`.
//   <prefix>podK      eth0 (veth, peer vpK on the node's cni0), default routes via cni0.
//   <prefix>ext       an external host on the underlay (.200 / ::200), pod CIDRs routed via nodes.
// Every pod and the external host run podserver.ts (servers.ts), which answers on the spec's
// ports and runs probes for prober.ts. The addresses are addressing.ts's, the links wiring.ts's.

import { spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, PreconditionError } from '../errors.ts';
import { EXTERNAL_HOST, layOutNodes, type NodeLayout, podAddressProblems, underlayIp } from './addressing.ts';
import { registerExitCleanup } from './cleanup.ts';
import { createNs, deleteAllNs, deleteNs, sh, uniquePrefix } from './netns.ts';
import { type PodServer, PodServers } from './servers.ts';
import { externalLines, FORWARDING, ipBatch, NO_DAD, nodeLines, podLines, setBridgeNetfilter, sysctl, underlayLines } from './wiring.ts';

export interface NodeSpec {
  readonly name: string;
  /** At most one per family, e.g. ['10.244.1.0/24', 'fd00:10:244:1::/64']. */
  readonly podCIDRs: readonly string[];
}

export interface PodSpec {
  readonly namespace: string;
  readonly name: string;
  /** A NodeSpec name. */
  readonly node: string;
  /** One or two addresses (at most one per family), inside the node's pod CIDRs. */
  readonly ips: readonly string[];
}

export interface ClusterSpec {
  readonly nodes: readonly NodeSpec[];
  readonly pods?: readonly PodSpec[];
  /** Ports every server answers on, TCP and UDP. Default [80, 81]. */
  readonly ports?: readonly number[];
  /** Build the external host. Default true. */
  readonly external?: boolean;
  /** Start of the namespace prefix (uniquePrefix adds random hex). Default 'wsim'. */
  readonly tag?: string;
}

/** Anything that runs a pod server: a pod or the external host. */
export interface Endpoint {
  /** "namespace/name" for pods, EXTERNAL_KEY for the external host. Servers reply with it. */
  readonly key: string;
  readonly kind: 'pod' | 'external';
  readonly netns: string;
  readonly ips: readonly string[];
  /** The server's UNIX control socket (see probe-protocol.ts). */
  readonly socketPath: string;
  readonly pid: number;
}

export interface SimPod extends Endpoint {
  readonly kind: 'pod';
  readonly namespace: string;
  readonly name: string;
  readonly node: string;
}

export interface SimNode {
  readonly name: string;
  readonly netns: string;
  readonly podCIDRs: readonly string[];
  /** cni0's addresses: the first host of each pod CIDR. */
  readonly gateways: readonly string[];
  readonly underlayIPs: readonly string[];
}

export interface Cluster {
  readonly prefix: string;
  readonly ports: readonly number[];
  readonly nodes: readonly SimNode[];
  readonly external: Endpoint | undefined;
  /** The pods that exist now, in creation order. */
  pods(): readonly SimPod[];
  endpoint(key: string): Endpoint | undefined;
  addPod(spec: PodSpec): Promise<SimPod>;
  removePod(key: string): Promise<void>;
  /** Kills every server and deletes every namespace with the prefix. Safe to call twice. */
  destroy(): Promise<void>;
}

export const EXTERNAL_KEY = 'external';
export const DEFAULT_PORTS: readonly number[] = [80, 81];
export function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

/** Builds the whole cluster; on any failure it removes what it made and rethrows. */
export async function createCluster(spec: ClusterSpec): Promise<Cluster> {
  const nodes = layOutNodes(spec);
  const cluster = new SimCluster(uniquePrefix(spec.tag ?? 'wsim'), spec.ports ?? DEFAULT_PORTS, nodes);
  try {
    await cluster.build(spec.external ?? true);
    // allSettled: destroy() must not race pods still being built.
    const added = await Promise.allSettled((spec.pods ?? []).map((p) => cluster.addPod(p)));
    const failed = added.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
  } catch (err) {
    await cluster.destroy();
    throw err;
  }
  return cluster;
}

interface NodeState extends SimNode, NodeLayout {}

interface PodState {
  /** Creation order, so pods() lists pods in the order they were asked for. */
  readonly seq: number;
  readonly pod: SimPod;
  readonly server: PodServer;
  readonly nodeVeth: string;
}

class SimCluster implements Cluster {
  readonly prefix: string;
  readonly ports: readonly number[];
  readonly nodes: readonly NodeState[];
  external: Endpoint | undefined;
  readonly #pods = new Map<string, PodState>();
  readonly #reserved = new Set<string>(); // pod keys being added, so two adds cannot race
  readonly #namespaces = new Set<string>();
  readonly #servers: PodServers;
  readonly #unregister: () => void;
  #dir = '';
  #seq = 0;
  #destroying: Promise<void> | undefined;
  #destroyed = false;

  constructor(prefix: string, ports: readonly number[], nodes: readonly NodeLayout[]) {
    this.prefix = prefix;
    this.ports = [...ports];
    this.nodes = nodes.map((n) => ({ ...n, netns: this.#ns(`node${n.index}`) }));
    this.#servers = new PodServers(this.ports);
    this.#unregister = registerExitCleanup(() => this.#destroySync());
  }

  pods(): readonly SimPod[] {
    return [...this.#pods.values()].sort((a, b) => a.seq - b.seq).map((s) => s.pod);
  }

  endpoint(key: string): Endpoint | undefined {
    if (this.external && key === this.external.key) return this.external;
    return this.#pods.get(key)?.pod;
  }

  async build(withExternal: boolean): Promise<void> {
    this.#dir = await mkdtemp(join(tmpdir(), this.prefix));
    const underlay = this.#ns('underlay');
    const ext = withExternal ? this.#ns('ext') : '';
    const hosts = [...this.nodes.map((n) => ({ ns: n.netns, port: `n${n.index}` })), ...(withExternal ? [{ ns: ext, port: 'x0' }] : [])];

    await Promise.all([underlay, ...hosts.map((h) => h.ns)].map((ns) => createNs(ns)));
    await Promise.all([
      setBridgeNetfilter(underlay, false), // the underlay is a plain switch
      ...this.nodes.map(async (n) => {
        await sysctl(n.netns, [...NO_DAD, ...FORWARDING]);
        await setBridgeNetfilter(n.netns, true);
      }),
      ...(withExternal ? [sysctl(ext, NO_DAD)] : []),
    ]);
    await ipBatch(underlay, underlayLines(hosts));
    await Promise.all(this.nodes.map((n) => ipBatch(n.netns, nodeLines(n, this.nodes))));
    if (withExternal) {
      await ipBatch(ext, externalLines(this.nodes));
      const ips = [underlayIp(4, EXTERNAL_HOST), underlayIp(6, EXTERNAL_HOST)];
      const socketPath = join(this.#dir, 'ext.sock');
      const server = await this.#servers.start(EXTERNAL_KEY, ext, socketPath);
      this.external = { key: EXTERNAL_KEY, kind: 'external', netns: ext, ips, socketPath, pid: server.pid };
    }
  }

  async addPod(spec: PodSpec): Promise<SimPod> {
    if (this.#destroying || this.#destroyed) throw new PreconditionError(`cluster ${this.prefix} is destroyed`);
    const key = podKey(spec.namespace, spec.name);
    const node = this.#validatePod(spec, key);
    this.#reserved.add(key);
    const seq = ++this.#seq;
    const netns = this.#ns(`pod${seq}`);
    const nodeVeth = `vp${seq}`;
    let server: PodServer | undefined;
    try {
      await createNs(netns);
      await sysctl(netns, NO_DAD);
      await ipBatch(netns, podLines(spec.ips, nodeVeth, node));
      await sh('ip', ['-n', node.netns, 'link', 'set', nodeVeth, 'master', 'cni0', 'up']);
      const socketPath = join(this.#dir, `pod${seq}.sock`);
      server = await this.#servers.start(key, netns, socketPath);
      const pod: SimPod = {
        key,
        kind: 'pod',
        namespace: spec.namespace,
        name: spec.name,
        node: node.name,
        netns,
        ips: [...spec.ips],
        socketPath,
        pid: server.pid,
      };
      this.#pods.set(key, { seq, pod, server, nodeVeth });
      return pod;
    } catch (err) {
      if (server) await this.#servers.stop(server);
      await this.#unplug(node.netns, nodeVeth, netns);
      throw err;
    } finally {
      this.#reserved.delete(key);
    }
  }

  async removePod(key: string): Promise<void> {
    const state = this.#pods.get(key);
    if (!state) throw new ConfigError([`no pod ${key} in cluster ${this.prefix}`]);
    this.#pods.delete(key);
    await this.#servers.stop(state.server);
    const node = this.nodes.find((n) => n.name === state.pod.node);
    if (node === undefined) throw new ConfigError([`pod ${key}: no node ${state.pod.node}`]);
    await this.#unplug(node.netns, state.nodeVeth, state.pod.netns);
  }

  /** Deleting the node-side veth removes both ends at once; namespace teardown is lazy. */
  async #unplug(nodeNs: string, nodeVeth: string, podNs: string): Promise<void> {
    await sh('ip', ['-n', nodeNs, 'link', 'del', nodeVeth]).catch(() => {});
    await deleteNs(podNs);
    this.#namespaces.delete(podNs);
  }

  #validatePod(spec: PodSpec, key: string): NodeState {
    const problems: string[] = [];
    const node = this.nodes.find((n) => n.name === spec.node);
    if (this.#pods.has(key) || this.#reserved.has(key)) problems.push(`pod ${key} already exists`);
    if (!node) problems.push(`pod ${key}: no node ${spec.node}`);
    problems.push(...podAddressProblems(key, spec.ips, node, new Set(this.pods().flatMap((p) => p.ips))));
    if (problems.length || node === undefined) throw new ConfigError(problems);
    return node;
  }

  #ns(suffix: string): string {
    const name = this.prefix + suffix;
    this.#namespaces.add(name);
    return name;
  }

  destroy(): Promise<void> {
    if (this.#destroyed) return Promise.resolve();
    this.#destroying ??= (async () => {
      await this.#servers.stopAll();
      this.#pods.clear();
      await Promise.all([...this.#namespaces].map((ns) => deleteNs(ns)));
      this.#namespaces.clear();
      await deleteAllNs(this.prefix); // anything a half-finished step left behind
      if (this.#dir) await rm(this.#dir, { recursive: true, force: true });
      this.#destroyed = true;
      this.#unregister();
    })();
    return this.#destroying;
  }

  /** The exit/signal path: no awaiting possible, so kill hard and delete synchronously. */
  #destroySync(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#servers.killAll();
    for (const ns of this.#namespaces) spawnSync('ip', ['netns', 'delete', ns], { stdio: 'ignore' });
    if (this.#dir) rmSync(this.#dir, { recursive: true, force: true });
  }
}
