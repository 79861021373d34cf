// The conformance harness: a simulated two-node Flannel cluster (network namespaces), one real
// `weir agent` process per node running inside that node's namespace, a manifests directory
// both agents watch, and assertions made with real packets over the full truth table.
//
// Fixed cast (every scenario starts from it; see reset()):
//   namespaces alpha {team: a}, beta {team: b}, gamma {}
//   alpha/a1 node-a  v4+v6  {app: web}  ports http=80/TCP
//   alpha/a2 node-b  v4+v6  {app: db}   ports http=81/TCP (same name, other number)
//   beta/b1  node-a  v4+v6  {app: web}  no named ports
//   beta/b2  node-b  v4     {app: db}   ports http=80/TCP
//   gamma/g1 node-a  v6     {app: web}  ports http=80/TCP, dns=81/UDP
//   external: a host outside the pod CIDRs (172.31.0.200, fd00:172:31::200)
// Every pod and the external host serve TCP and UDP on ports 80 and 81.

import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createCluster, type Cluster } from '../../src/sim/cluster.ts';
import { diffMatrix, expectMatrix, probeMatrix, renderMatrix, type Cell, type Matrix, type MatrixOptions } from '../../src/sim/prober.ts';
import { manifestRevision } from '../../src/sources/index.ts';
import { AgentProcess } from '../support/agent-process.ts';
import { forgetProbeFlows } from '../support/conntrack.ts';

export type { Cell };
/** Flags added to every agent's, or a function giving each node's. */
export type AgentArgs = readonly string[] | ((node: string) => readonly string[]);
export const EXTERNAL = 'external';

export interface PodDef {
  readonly namespace: string;
  readonly name: string;
  readonly node: 'node-a' | 'node-b';
  readonly ips: readonly string[];
  labels: Record<string, string>;
  readonly ports: readonly { name: string; containerPort: number; protocol: 'TCP' | 'UDP' | 'SCTP' }[];
  phase?: string;
  hostNetwork?: boolean;
}

export const NODES = [
  { name: 'node-a', podCIDRs: ['10.244.1.0/24', 'fd00:10:244:1::/64'] },
  { name: 'node-b', podCIDRs: ['10.244.2.0/24', 'fd00:10:244:2::/64'] },
] as const;

export function basePods(): PodDef[] {
  return [
    { namespace: 'alpha', name: 'a1', node: 'node-a', ips: ['10.244.1.11', 'fd00:10:244:1::11'], labels: { app: 'web' }, ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] },
    { namespace: 'alpha', name: 'a2', node: 'node-b', ips: ['10.244.2.12', 'fd00:10:244:2::12'], labels: { app: 'db' }, ports: [{ name: 'http', containerPort: 81, protocol: 'TCP' }] },
    { namespace: 'beta', name: 'b1', node: 'node-a', ips: ['10.244.1.21', 'fd00:10:244:1::21'], labels: { app: 'web' }, ports: [] },
    { namespace: 'beta', name: 'b2', node: 'node-b', ips: ['10.244.2.22'], labels: { app: 'db' }, ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] },
    {
      namespace: 'gamma',
      name: 'g1',
      node: 'node-a',
      ips: ['fd00:10:244:1::31'],
      labels: { app: 'web' },
      ports: [
        { name: 'http', containerPort: 80, protocol: 'TCP' },
        { name: 'dns', containerPort: 81, protocol: 'UDP' },
      ],
    },
  ];
}

export function baseNamespaces(): Record<string, Record<string, string>> {
  return { alpha: { team: 'a' }, beta: { team: 'b' }, gamma: {} };
}

export class Conformance {
  readonly cluster: Cluster;
  readonly dir: string;
  readonly #agents: AgentProcess[] = [];
  #agentArgs: AgentArgs = [];
  /** Raw files: their last content that parses, and the ones now broken on disk. */
  readonly #goodRaw = new Map<string, string>();
  readonly #brokenRaw = new Set<string>();
  pods = new Map<string, PodDef>();
  namespaces: Record<string, Record<string, string>> = {};
  /** Annotations of the namespaces (weir.dev/audit), by namespace. */
  namespaceAnnotations: Record<string, Record<string, string>> = {};
  policies: unknown[] = [];

  private constructor(cluster: Cluster, dir: string) {
    this.cluster = cluster;
    this.dir = dir;
  }

  /** Builds the cluster, writes the base manifests and starts one agent per node, each with
   *  `agentArgs` added to its flags (or the flags it returns for that node). */
  static async start(tag = 'wconf', agentArgs: AgentArgs = []): Promise<Conformance> {
    const pods = basePods();
    const cluster = await createCluster({
      tag,
      nodes: NODES.map((n) => ({ name: n.name, podCIDRs: [...n.podCIDRs] })),
      pods: pods.map((p) => ({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips })),
    });
    let c: Conformance | undefined;
    try {
      const dir = await mkdtemp(join(tmpdir(), 'weir-conf-'));
      c = new Conformance(cluster, dir);
      c.#agentArgs = agentArgs;
      c.pods = new Map(pods.map((p) => [`${p.namespace}/${p.name}`, p]));
      c.namespaces = baseNamespaces();
      await c.#writeAll();
      for (const node of cluster.nodes) c.#agents.push(c.#spawnAgent(node.name, node.netns));
      await c.settle();
      return c;
    } catch (err) {
      await c?.stop();
      await cluster.destroy();
      throw err;
    }
  }

  /** Back to the fixed cast with no policy, and wait until both agents hold it. */
  async reset(): Promise<void> {
    for (const key of [...this.pods.keys()]) if (!basePods().some((p) => `${p.namespace}/${p.name}` === key)) await this.removePod(key, false);
    this.pods = new Map(basePods().map((p) => [`${p.namespace}/${p.name}`, p]));
    this.namespaces = baseNamespaces();
    this.namespaceAnnotations = {};
    this.policies = [];
    await this.#writeAll();
    await this.settle();
  }

  /** Replaces every policy (objects in networking.k8s.io/v1 shape, apiVersion/kind optional). */
  async setPolicies(...policies: unknown[]): Promise<void> {
    this.policies = policies;
    await this.#writeAll();
    await this.settle();
  }

  async setPodLabels(key: string, labels: Record<string, string>): Promise<void> {
    this.#pod(key).labels = labels;
    await this.#writeAll();
    await this.settle();
  }

  async setPodPhase(key: string, phase: string): Promise<void> {
    this.#pod(key).phase = phase;
    await this.#writeAll();
    await this.settle();
  }

  async setNamespaceLabels(ns: string, labels: Record<string, string>): Promise<void> {
    this.namespaces[ns] = labels;
    await this.#writeAll();
    await this.settle();
  }

  /** Adds a pod to the simulated cluster and to the manifests. */
  async addPod(def: PodDef): Promise<void> {
    await this.cluster.addPod({ namespace: def.namespace, name: def.name, node: def.node, ips: def.ips });
    this.pods.set(`${def.namespace}/${def.name}`, def);
    await this.#writeAll();
    await this.settle();
  }

  async removePod(key: string, write = true): Promise<void> {
    this.pods.delete(key);
    if (write) {
      await this.#writeAll();
      await this.settle();
    }
    await this.cluster.removePod(key);
  }

  /** Writes a raw file into the manifests directory (for invalid-input scenarios). */
  async writeRaw(name: string, content: string): Promise<void> {
    this.#goodRaw.set(name, content);
    this.#brokenRaw.delete(name);
    await writeFile(join(this.dir, name), content);
    await this.settle();
  }

  /** Writes a file that does not parse, and waits until every agent has reported it: an agent
   *  keeps the file's last good content, so its revision does not move. */
  async writeBrokenRaw(name: string, content: string): Promise<void> {
    const seen = this.#agents.map((a) => a.lines);
    this.#brokenRaw.add(name);
    await writeFile(join(this.dir, name), content);
    const deadline = Date.now() + 10_000;
    const newLines = (a: AgentProcess, since: number) => (a.lines > since ? a.log.slice(-Math.min(a.log.length, a.lines - since)) : []);
    while (!this.#agents.every((a, i) => newLines(a, seen[i]).some((l) => l.includes(name) && /"level":(4|5)0/.test(l)))) {
      if (Date.now() > deadline) throw new Error(`agents did not report the broken file ${name}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    await this.settle();
  }

  async removeRaw(name: string): Promise<void> {
    this.#goodRaw.delete(name);
    this.#brokenRaw.delete(name);
    await rm(join(this.dir, name), { force: true });
    await this.settle();
  }

  /** Probes the full truth table and throws with every mismatching cell, plus both matrices. */
  async expect(allowed: (c: Cell) => boolean, what = '', opts: MatrixOptions = {}): Promise<Matrix> {
    const expected = expectMatrix(this.cluster, opts, allowed);
    await forgetProbeFlows(this.cluster);
    let actual = await probeMatrix(this.cluster, opts);
    let diff = diffMatrix(expected, actual);
    if (diff.length > 0) {
      // One more wave before failing: a probe can lose its first packet to neighbour resolution.
      await forgetProbeFlows(this.cluster);
      actual = await probeMatrix(this.cluster, { ...opts, timeoutMs: 600 });
      diff = diffMatrix(expected, actual);
    }
    if (diff.length > 0) {
      throw new Error(
        `${what ? what + ': ' : ''}${diff.length} cells differ:\n  ${diff.slice(0, 40).join('\n  ')}\n\nexpected:\n${renderMatrix(expected)}\n\nactual:\n${renderMatrix(actual)}\n\nagent errors: ${this.#agents.flatMap((a) => a.errors).join('\n') || 'none'}`,
      );
    }
    return actual;
  }

  /** Like expect, for the cells pod -> external host (expect probes pods as targets only). */
  expectToExternal(allowed: (c: Cell) => boolean, what = ''): Promise<Matrix> {
    return this.expect(allowed, `${what} (pod -> external)`, { sources: this.cluster.pods().map((p) => p.key), targets: [EXTERNAL] });
  }

  /** Waits until every agent has applied the current content of the manifests directory. */
  async settle(timeoutMs = 10_000): Promise<void> {
    const want = await this.revision();
    const deadline = Date.now() + timeoutMs;
    while (this.#agents.some((a) => a.revision !== want)) {
      const dead = this.#agents.find((a) => a.exited);
      if (dead) throw new Error(`agent on ${dead.node} exited ${dead.child.exitCode}:\n${dead.log.slice(-20).join('\n')}`);
      if (Date.now() > deadline) {
        throw new Error(
          `agents did not apply revision ${want.slice(0, 12)} within ${timeoutMs} ms: ${this.#agents.map((a) => `${a.node}=${a.revision.slice(0, 12)}`).join(', ')}\n${this.#agents.flatMap((a) => a.log.slice(-5)).join('\n')}`,
        );
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  async revision(): Promise<string> {
    const names = (await readdir(this.dir)).filter((n) => /\.(ya?ml|json)$/.test(n) && !n.startsWith('.')).sort();
    const content = async (name: string) => (this.#brokenRaw.has(name) ? this.#goodRaw.get(name)! : await readFile(join(this.dir, name), 'utf8'));
    return manifestRevision(await Promise.all(names.map(async (name) => ({ name, content: await content(name) }))));
  }

  /** Writes the manifests of the current cast and policies, then waits until applied. */
  async writeManifests(): Promise<void> {
    await this.#writeAll();
    await this.settle();
  }

  /** Stops a node's agent (SIGTERM, as a rolling update does): its rules stay in the kernel. */
  async stopAgent(node: string): Promise<void> {
    const i = this.#agents.findIndex((a) => a.node === node);
    if (i < 0) return;
    await this.#agents[i].stop();
    this.#agents.splice(i, 1);
  }

  /** Starts a node's agent: with `args`, with those flags instead of the harness's own (and
   *  then settle() cannot wait for it: stop it, and start a normal one, before the next). */
  startAgent(node: string, args?: readonly string[]): AgentProcess {
    const netns = this.nodeNetns(node);
    const agent = args ? new AgentProcess(node, netns, args) : this.#spawnAgent(node, netns);
    this.#agents.push(agent);
    return agent;
  }

  /** What layered writes left for the tidy on each node's agent, as of its last write. */
  tidyPending(): Record<string, number> {
    return Object.fromEntries(this.#agents.map((a) => [a.node, a.tidyPending]));
  }

  /** Waits until no agent owes a tidy: every node holds only the desired rules. */
  async settledTidy(timeoutMs: number): Promise<void> {
    await Promise.all(this.#agents.map((a) => a.settled(timeoutMs)));
  }

  agentErrors(): string[] {
    return this.#agents.flatMap((a) => a.errors.map((e) => `${a.node}: ${e}`));
  }

  /** Runs a command in a node's namespace (to inspect iptables/ipset, or to cause drift). */
  nodeNetns(node: string): string {
    return this.cluster.nodes.find((n) => n.name === node)!.netns;
  }

  async stop(): Promise<void> {
    await Promise.all(this.#agents.map((a) => a.stop()));
    await rm(this.dir, { recursive: true, force: true });
    await this.cluster.destroy();
  }

  #pod(key: string): PodDef {
    const p = this.pods.get(key);
    if (!p) throw new Error(`no pod ${key}`);
    return p;
  }

  #spawnAgent(node: string, netns: string): AgentProcess {
    const extra = typeof this.#agentArgs === 'function' ? this.#agentArgs(node) : this.#agentArgs;
    return new AgentProcess(node, netns, ['--manifests', this.dir, '--log-level', 'info', '--resync-interval', '5', ...extra]);
  }

  async #writeAll(): Promise<void> {
    const items: unknown[] = [
      ...Object.entries(this.namespaces).map(([name, labels]) => ({
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name, labels, ...(this.namespaceAnnotations[name] ? { annotations: this.namespaceAnnotations[name] } : {}) },
      })),
      ...NODES.map((n) => ({ apiVersion: 'v1', kind: 'Node', metadata: { name: n.name }, spec: { podCIDRs: n.podCIDRs } })),
      ...[...this.pods.values()].map((p) => ({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name: p.name, namespace: p.namespace, labels: p.labels },
        spec: { nodeName: p.node, hostNetwork: p.hostNetwork ?? false, containers: [{ name: 'c', image: 'x', ports: p.ports }] },
        status: { phase: p.phase ?? 'Running', podIPs: p.ips.map((ip) => ({ ip })) },
      })),
    ];
    const policies = this.policies.map((p) => ({ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', ...(p as object) }));
    await writeFile(join(this.dir, '00-cluster.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items }, null, 1));
    await writeFile(join(this.dir, '30-policies.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items: policies }, null, 1));
  }
}

/** A NetworkPolicy object, for scenarios. */
export function np(namespace: string, name: string, spec: unknown): unknown {
  return { metadata: { namespace, name }, spec };
}

/** A ClusterNetworkPolicy object (policy.networking.k8s.io/v1beta1), for scenarios. */
export function cnp(name: string, spec: unknown, annotations?: Record<string, string>): unknown {
  return { apiVersion: 'policy.networking.k8s.io/v1beta1', kind: 'ClusterNetworkPolicy', metadata: { name, ...(annotations ? { annotations } : {}) }, spec };
}

/** Every pod key of the fixed cast plus the external host, for predicates. */
export const A1 = 'alpha/a1',
  A2 = 'alpha/a2',
  B1 = 'beta/b1',
  B2 = 'beta/b2',
  G1 = 'gamma/g1';
export const nsOf = (key: string) => (key === EXTERNAL ? '' : key.split('/')[0]);
