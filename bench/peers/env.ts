// The bench's world: one real kube-apiserver (scripts/control-plane.sh) holding every object,
// and, for each turn of an enforcer, a fresh simulated two-node Flannel cluster (src/sim) with
// the same pods at the same addresses, the API server bridged into each node, and the enforcer
// started in each node's namespace. Fresh namespaces per turn mean no rule, set or conntrack
// entry of one enforcer can help or hurt the next; the API objects are the same for all.
//
// Pods exist in two kinds: simulated pods (a network namespace, a veth on the node's cni0 and a
// pod server answering on 80 and 81) on node-a and node-b, and "phantom" pods that exist only in
// the API, on nodes no enforcer runs on, that make the cluster large (peer-set members, policy
// selectors) without a process each. Both enforcers see the same objects: kube-router picks its
// local pods by status.hostIP (the node's address), Weir by spec.nodeName; both are set.

import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { createCluster, type Cluster, type SimPod } from '../../src/sim/cluster.ts';
import { registerExitCleanup } from '../../src/sim/cleanup.ts';
import { openProbeClient, type ProbeClient } from '../../src/sim/prober.ts';
import { bridgeApiServer, type Bridge } from '../../test/integration/bridge.ts';
import { startControlPlane, type ControlPlane } from '../../test/integration/controlplane.ts';
import { podObject, policyObject } from '../../test/support/kube-objects.ts';
import { Api, inParallel } from './api.ts';
import { EnforcerProcess, type EnforcerSpec } from './enforcers.ts';

const CRDS = fileURLToPath(new URL('../../crds/', import.meta.url));

export interface SimNodeDef {
  readonly name: string;
  readonly podCIDRs: readonly string[];
  /** Its address on the simulated underlay (src/sim/cluster.ts numbers nodes from .1). */
  readonly hostIPs: readonly string[];
}

export const SIM_NODES: readonly SimNodeDef[] = [
  { name: 'node-a', podCIDRs: ['10.244.1.0/24', 'fd00:10:244:1::/64'], hostIPs: ['172.31.0.1', 'fd00:172:31::1'] },
  { name: 'node-b', podCIDRs: ['10.244.2.0/24', 'fd00:10:244:2::/64'], hostIPs: ['172.31.0.2', 'fd00:172:31::2'] },
];

export interface PodDef {
  readonly namespace: string;
  readonly name: string;
  readonly node: string;
  readonly ips: readonly string[];
  labels: Record<string, string>;
  readonly ports?: readonly { name: string; containerPort: number; protocol: 'TCP' | 'UDP' | 'SCTP' }[];
  phase?: string;
  readonly hostNetwork?: boolean;
}

export const key = (p: { namespace: string; name: string }): string => `${p.namespace}/${p.name}`;

/** Phantom nodes: 100 pods each at most, like a kubelet's default. */
export const PHANTOM_PODS_PER_NODE = 100;
export const phantomNode = (i: number): string => `node-p${i}`;
/** Phantom node n: its pod CIDR (in 10.128.0.0/9, outside the simulated nodes') and address. */
export function phantomNodeInfo(n: number): { name: string; podCIDR: string; hostIP: string } {
  return { name: phantomNode(n), podCIDR: `10.${128 + (n >> 8)}.${n & 255}.0/24`, hostIP: `172.30.${Math.floor(n / 250)}.${(n % 250) + 1}` };
}

/** The i-th phantom pod's node and IPv4 address. */
export function phantomPlace(i: number): { node: string; ip: string; hostIP: string } {
  const n = Math.floor(i / PHANTOM_PODS_PER_NODE);
  const info = phantomNodeInfo(n);
  return { node: info.name, ip: info.podCIDR.replace(/0\/24$/, String((i % PHANTOM_PODS_PER_NODE) + 2)), hostIP: info.hostIP };
}

// The Pod and NetworkPolicy objects live in test/support with the API-server tiers'; the peer modules take them from here.
export { podObject, policyObject };

export class BenchEnv {
  readonly cp: ControlPlane;
  readonly api: Api;
  /** Simulated pods: rebuilt with each turn's cluster. */
  readonly simPods = new Map<string, PodDef>();
  readonly #hostIP = new Map(SIM_NODES.map((n) => [n.name, n.hostIPs[0]]));
  readonly #phantomNodes = new Set<string>();
  #nextPhantom = 0;

  private constructor(cp: ControlPlane) {
    this.cp = cp;
    this.api = new Api(cp.server, cp.token, cp.kubeconfig);
  }

  static async start(log: (s: string) => void): Promise<BenchEnv> {
    const cp = await startControlPlane();
    const env = new BenchEnv(cp);
    try {
      log(`kube-apiserver ready in ${(cp.startMs / 1000).toFixed(1)} s at ${cp.server}`);
      // Weir writes its status objects: their CRDs exist, as in a real install.
      await cp.kubectl(['apply', '-f', CRDS]);
      for (const n of SIM_NODES) await env.#applyNode(n.name, [...n.podCIDRs], n.hostIPs);
      return env;
    } catch (e) {
      await env.stop();
      throw e;
    }
  }

  async #applyNode(name: string, podCIDRs: string[], hostIPs: readonly string[]): Promise<void> {
    await this.api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name }, spec: { podCIDRs, podCIDR: podCIDRs[0] } });
    // kube-router finds its own node's address in the Node's status (InternalIP), and needs it.
    const addresses = hostIPs.map((address) => ({ type: 'InternalIP', address }));
    await this.api.patch('Node', undefined, name, { status: { addresses, conditions: [{ type: 'Ready', status: 'True' }] } }, 'status');
  }

  async ensureNamespace(name: string, labels: Record<string, string> = {}): Promise<void> {
    await this.api.apply({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels: { ...labels, 'kubernetes.io/metadata.name': name } } });
  }

  /** A simulated pod: its API object now, its namespace and server with each turn's cluster. */
  async addSimPod(p: PodDef): Promise<void> {
    this.simPods.set(key(p), p);
    await this.putPod(p, this.#hostIP.get(p.node)!);
  }

  /** Creates or updates a pod's object and then its status, as a kubelet would (two writes). */
  async putPod(p: PodDef, hostIP: string): Promise<void> {
    await this.api.apply(podObject(p));
    await this.setPodStatus(p, hostIP);
  }

  setPodStatus(p: PodDef, hostIP: string): Promise<unknown> {
    const phase = p.phase ?? 'Running';
    const status = {
      phase,
      hostIP,
      hostIPs: [{ ip: hostIP }],
      podIP: p.ips[0],
      podIPs: p.ips.map((ip) => ({ ip })),
      conditions: [{ type: 'Ready', status: phase === 'Running' ? 'True' : 'False' }],
    };
    return this.api.patch('Pod', p.namespace, p.name, { status }, 'status');
  }

  hostIPOf(node: string): string {
    return this.#hostIP.get(node) ?? '';
  }

  /** Reserves `n` phantom pod numbers (each has its own address); returns the first. */
  reservePhantoms(n: number): number {
    const first = this.#nextPhantom;
    this.#nextPhantom += n;
    return first;
  }

  /** Phantom pods [from, to) of a generator, created in parallel (16 requests in flight). */
  async addPhantomPods(from: number, to: number, make: (i: number) => PodDef): Promise<void> {
    const ids = Array.from({ length: to - from }, (_, k) => from + k);
    for (const n of new Set(ids.map((i) => Math.floor(i / PHANTOM_PODS_PER_NODE)))) {
      const info = phantomNodeInfo(n);
      if (this.#phantomNodes.has(info.name)) continue;
      await this.#applyNode(info.name, [info.podCIDR], [info.hostIP]);
      this.#hostIP.set(info.name, info.hostIP);
      this.#phantomNodes.add(info.name);
    }
    await inParallel(ids, 16, async (i) => {
      const p = make(i);
      await this.putPod(p, phantomPlace(i).hostIP);
    });
  }

  /** One enforcer's turn on a fresh simulated cluster; everything it started is gone after. */
  async turn<T>(spec: EnforcerSpec, fn: (t: Turn) => Promise<T>, opts: { tag?: string; syncTimeoutMs?: number } = {}): Promise<T> {
    const t = await Turn.start(this, spec, opts);
    try {
      return await fn(t);
    } finally {
      await t.stop();
    }
  }

  async stop(): Promise<void> {
    this.api.close();
    await this.cp.stop();
  }
}

export class Turn {
  readonly env: BenchEnv;
  readonly spec: EnforcerSpec;
  readonly cluster: Cluster;
  readonly bridges = new Map<string, Bridge>();
  readonly procs = new Map<string, EnforcerProcess>();
  /** When the enforcers were started (performance.now()). */
  startedAt = 0;
  /** Helper processes of the turn (servers in pods), killed with it. */
  readonly #helpers = new Set<ChildProcess>();
  readonly #clients = new Map<string, ProbeClient>();
  readonly #unregister: () => void;

  private constructor(env: BenchEnv, spec: EnforcerSpec, cluster: Cluster) {
    this.env = env;
    this.spec = spec;
    this.cluster = cluster;
    // The exit path: enforcers die with the bench (the cluster's own cleanup deletes the namespaces).
    this.#unregister = registerExitCleanup(() => {
      for (const p of this.procs.values()) if (!p.exited) p.child.kill('SIGKILL');
      for (const h of this.#helpers) h.kill('SIGKILL');
      // close() kills the bridge's process in the node at once, before its first await.
      for (const b of this.bridges.values()) void b.close().catch(() => {});
    });
  }

  static async start(env: BenchEnv, spec: EnforcerSpec, opts: { tag?: string; syncTimeoutMs?: number }): Promise<Turn> {
    const cluster = await createCluster({
      tag: opts.tag ?? 'wpeer',
      nodes: SIM_NODES.map((n) => ({ name: n.name, podCIDRs: [...n.podCIDRs] })),
      pods: [...env.simPods.values()].map((p) => ({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips })),
    });
    const t = new Turn(env, spec, cluster);
    try {
      const port = Number(new URL(env.cp.server).port);
      for (const n of cluster.nodes) t.bridges.set(n.name, await bridgeApiServer(n.netns, port));
      t.startedAt = performance.now();
      for (const n of cluster.nodes) t.startEnforcer(n.name);
      await Promise.all([...t.procs.values()].map((p) => p.nextSync(opts.syncTimeoutMs ?? 180_000)));
      return t;
    } catch (e) {
      await t.stop();
      throw e;
    }
  }

  netns(node: string): string {
    return this.cluster.nodes.find((n) => n.name === node)!.netns;
  }

  /** Starts the enforcer on a node (again, after a kill); none starts nothing. */
  startEnforcer(node: string): EnforcerProcess | undefined {
    const argv = this.spec.argv(node, this.env.cp.kubeconfig);
    if (!argv) return undefined;
    const p = new EnforcerProcess(this.spec, node, this.netns(node), argv);
    this.procs.set(node, p);
    return p;
  }

  pod(k: string): SimPod {
    const p = this.cluster.pods().find((x) => x.key === k);
    if (!p) throw new Error(`no simulated pod ${k}`);
    return p;
  }

  /** Adds a simulated pod to this turn's cluster (its API object is the caller's business). */
  addSimPod(p: PodDef): Promise<SimPod> {
    return this.cluster.addPod({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips });
  }

  /** One TCP connect from a simulated pod: true when the target's server answered. */
  async connects(from: string, ip: string, port = 80, timeoutMs = 300): Promise<boolean> {
    let c = this.#clients.get(from);
    if (!c) {
      c = await openProbeClient(this.pod(from));
      this.#clients.set(from, c);
    }
    return (await c.probe({ proto: 'tcp', ip, port, timeoutMs })).ok;
  }

  /** When the probes of the last until() that held were sent (performance.now()). */
  heldSince = 0;

  /** Polls until every (from, to-ip, expected) holds at once; returns the ms from the call to the
   *  sending of the probes that held. Not to their answers: a denied probe of an enforcer that
   *  drops waits out its 300 ms timeout, one that rejects is answered at once, and that is no
   *  difference in when the policy held. */
  async until(cells: readonly { from: string; ip: string; allowed: boolean; port?: number }[], timeoutMs: number, what: string): Promise<number> {
    const t0 = performance.now();
    for (;;) {
      const sent = performance.now();
      const got = await Promise.all(cells.map((c) => this.connects(c.from, c.ip, c.port ?? 80, 300)));
      if (got.every((g, i) => g === cells[i].allowed)) {
        this.heldSince = sent;
        return sent - t0;
      }
      if (performance.now() - t0 > timeoutMs) {
        const bad = cells.filter((_, i) => got[i] !== cells[i].allowed).map((c) => `${c.from} -> ${c.ip}:${c.port ?? 80} expected ${c.allowed ? 'ALLOW' : 'DENY'}`);
        throw new Error(`${this.spec.name}: ${what}: not enforced after ${timeoutMs} ms: ${bad.join('; ')}`);
      }
      await sleep(50);
    }
  }

  /** A helper of the turn (a server in a pod), killed with it. */
  async spawnHelper(netns: string, argv: readonly string[]): Promise<ChildProcess> {
    return startHelper(netns, argv, (child) => {
      this.#helpers.add(child);
      child.once('exit', () => this.#helpers.delete(child));
    });
  }

  /** Runs a command inside a node's namespace (conntrack, iptables-save...). */
  inNode(node: string, cmd: string, args: readonly string[]): string {
    const r = spawnSync('ip', ['netns', 'exec', this.netns(node), cmd, ...args], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 });
    return r.stdout ?? '';
  }

  async stop(): Promise<void> {
    for (const c of this.#clients.values()) c.close();
    this.#clients.clear();
    for (const h of this.#helpers) h.kill('SIGKILL');
    await Promise.allSettled([...this.procs.values()].map((p) => p.stop()));
    for (const b of this.bridges.values()) await b.close().catch(() => {});
    await this.cluster.destroy();
    this.#unregister();
  }
}

/** The machine the figures come from. */
export function machine(): string {
  const nproc = spawnSync('nproc', { encoding: 'utf8' }).stdout.trim();
  const kernel = spawnSync('uname', ['-r'], { encoding: 'utf8' }).stdout.trim();
  const ipt = spawnSync('iptables', ['--version'], { encoding: 'utf8' }).stdout.trim();
  const load = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const mem = /MemTotal:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1];
  return `${nproc} cores, kernel ${kernel}, ${ipt}, ${Math.round(Number(mem) / 1024 / 1024)} GB RAM, load average ${load}`;
}

export function loadAverage(): number {
  return Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
}

export const REPO_DIR = fileURLToPath(new URL('../../', import.meta.url));
export const cacheDir = (...parts: string[]): string => join(REPO_DIR, '.cache/peers', ...parts);

/** Starts a long-running helper inside a namespace (`track` sees it at once, so that it can be
 *  killed with its owner); resolves once it printed its first line (`ready`). */
export async function startHelper(netns: string, argv: readonly string[], track: (child: ChildProcess) => void = () => {}): Promise<ChildProcess> {
  const child = spawn('ip', ['netns', 'exec', netns, ...argv], { stdio: ['ignore', 'pipe', 'pipe'] });
  track(child);
  let err = '';
  child.stderr!.on('data', (c) => (err += c));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`${argv.join(' ')} in ${netns} exited ${code}: ${err}`)));
  });
  return child;
}
