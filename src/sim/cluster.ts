// A simulated Flannel (host-gw) cluster made of network namespaces, for conformance tests
// and `weir demo`. Layout, all under one unique prefix:
//   <prefix>underlay  bridge br0: the "physical" network between nodes (172.31.0.0/24, fd00:172:31::/64)
//   <prefix>nodeN     eth0 on the underlay (.N / ::N), cni0 bridge holding the pod gateways,
//                     forwarding on, br_netfilter on (so bridged pod frames traverse FORWARD),
//                     a route to every other node's pod CIDRs via that node (host-gw).
//                     Weir's agent runs here: `ip netns exec <node.netns> ...`.
//   <prefix>podK      eth0 (veth, peer vpK on the node's cni0), default routes via cni0.
//   <prefix>ext       an external host on the underlay (.200 / ::200), pod CIDRs routed via nodes.
// Every pod and the external host run podserver.ts, which answers on the spec's ports and runs
// probes for prober.ts.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, rmSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { CommandError, ConfigError, PreconditionError } from '../errors.ts';
import type { Family } from '../model/types.ts';
import { type Cidr, cidrContains, formatCidr, formatIp, parseCidr as parseAnyCidr, parseIp as parseAnyIp } from '../model/cidr.ts';
import { registerExitCleanup } from './cleanup.ts';
import { createNs, deleteAllNs, deleteNs, inNs, sh, uniquePrefix } from './netns.ts';

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
const UNDERLAY: Readonly<Record<Family, { net: string; len: number }>> = {
  4: { net: '172.31.0.', len: 24 },
  6: { net: 'fd00:172:31::', len: 64 },
};
const EXTERNAL_HOST = 200;
const READY_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 2_000;
// Built output runs podserver.js next to cluster.js; the sources run podserver.ts.
const SERVER_SCRIPT = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? './podserver.ts' : './podserver.js', import.meta.url));

export function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

/** Builds the whole cluster; on any failure it removes what it made and rethrows. */
export async function createCluster(spec: ClusterSpec): Promise<Cluster> {
  const nodes = validateNodes(spec);
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

interface NodeState extends SimNode {
  readonly index: number;
  readonly cidrs: readonly Cidr[];
}

interface Server {
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
}

interface PodState {
  /** Creation order, so pods() lists pods in the order they were asked for. */
  readonly seq: number;
  readonly pod: SimPod;
  readonly server: Server;
  readonly nodeVeth: string;
}

function validateNodes(spec: ClusterSpec): Omit<NodeState, 'netns'>[] {
  const problems: string[] = [];
  const names = new Set<string>();
  const nodes = spec.nodes.map((n, i): Omit<NodeState, 'netns'> => {
    const index = i + 1;
    if (names.has(n.name)) problems.push(`node ${n.name}: duplicate name`);
    names.add(n.name);
    const cidrs: Cidr[] = [];
    for (const c of n.podCIDRs) {
      const cidr = parseCidr(c);
      if (!cidr) problems.push(`node ${n.name}: pod CIDR "${c}" is not a network address/prefix`);
      else if (cidrs.some((o) => o.family === cidr.family)) problems.push(`node ${n.name}: two IPv${cidr.family} pod CIDRs`);
      else cidrs.push(cidr);
    }
    return {
      name: n.name,
      index,
      podCIDRs: n.podCIDRs,
      cidrs,
      gateways: cidrs.map(firstHost),
      underlayIPs: [underlayIp(4, index), underlayIp(6, index)],
    };
  });
  if (nodes.length === 0) problems.push('a cluster needs at least one node');
  if (nodes.length >= EXTERNAL_HOST) problems.push(`at most ${EXTERNAL_HOST - 1} nodes`);
  for (const p of spec.ports ?? []) {
    if (!Number.isInteger(p) || p < 1 || p > 65535) problems.push(`port ${p} is not a TCP/UDP port`);
  }
  if (problems.length) throw new ConfigError(problems);
  return nodes;
}

/** A network address/prefix (host bits zero), or null. */
function parseCidr(text: string): Cidr | null {
  const c = parseAnyCidr(text);
  return 'error' in c || parseIp(text.split('/')[0])?.value !== c.base ? null : c;
}

function parseIp(text: string): { family: Family; value: bigint } | null {
  const a = parseAnyIp(text);
  return 'error' in a ? null : a;
}

/** The first host address of a CIDR: Flannel puts it on cni0 and pods route through it. */
function firstHost(cidr: Cidr): string {
  return formatIp(cidr.family, cidr.base + 1n);
}

function underlayIp(family: Family, host: number): string {
  return UNDERLAY[family].net + String(host);
}

/** `nodad`: IPv6 addresses are usable at once, no duplicate-address-detection wait. */
function addrLine(ip: string, len: number, dev: string): string {
  return `addr add ${ip}/${len} dev ${dev}${ip.includes(':') ? ' nodad' : ''}`;
}

/** A MAC derived from the pod's address (as the CNI bridge plugin once did): a pod re-created
 *  with the same IP keeps its MAC, so neighbour entries cached by its peers stay valid. */
function podMac(ips: readonly string[]): string {
  const ip = ips.map(parseIp).sort((a, b) => a!.family - b!.family)[0]!;
  const low = Number(ip.value & 0xffffffffn);
  const bytes = [24, 16, 8, 0].map((s) => ((low >>> s) & 255).toString(16).padStart(2, '0'));
  return `0a:58:${bytes.join(':')}`;
}

// Set before any interface exists in a namespace, so that every interface inherits it.
const NO_DAD = ['net.ipv6.conf.all.accept_dad=0', 'net.ipv6.conf.default.accept_dad=0'];
const FORWARDING = ['net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1', 'net.ipv6.conf.default.forwarding=1'];

async function sysctl(ns: string, settings: readonly string[]): Promise<void> {
  await inNs(ns, 'sysctl', ['-q', '-w', ...settings]);
}

/** br_netfilter's switches are per network namespace (Linux >= 5.3). They only exist inside
 *  a namespace when the module is loaded and per-netns, so a missing key is a precondition. */
async function setBridgeNetfilter(ns: string, on: boolean): Promise<void> {
  const v = on ? 1 : 0;
  try {
    await sysctl(ns, [`net.bridge.bridge-nf-call-iptables=${v}`, `net.bridge.bridge-nf-call-ip6tables=${v}`]);
  } catch (err) {
    throw new PreconditionError('net.bridge.bridge-nf-call-iptables is not available inside a network namespace: load br_netfilter (modprobe br_netfilter) on a kernel >= 5.3', { cause: err });
  }
}

function ipBatch(ns: string, lines: readonly string[]): Promise<string> {
  return sh('ip', ['-n', ns, '-batch', '-'], lines.join('\n') + '\n');
}

class SimCluster implements Cluster {
  readonly prefix: string;
  readonly ports: readonly number[];
  readonly nodes: readonly NodeState[];
  external: Endpoint | undefined;
  readonly #pods = new Map<string, PodState>();
  readonly #reserved = new Set<string>(); // pod keys being added, so two adds cannot race
  readonly #namespaces = new Set<string>();
  readonly #servers = new Set<Server>();
  readonly #unregister: () => void;
  #dir = '';
  #seq = 0;
  #destroying: Promise<void> | undefined;
  #destroyed = false;

  constructor(prefix: string, ports: readonly number[], nodes: readonly Omit<NodeState, 'netns'>[]) {
    this.prefix = prefix;
    this.ports = [...ports];
    this.nodes = nodes.map((n) => ({ ...n, netns: this.#ns(`node${n.index}`) }));
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
    await ipBatch(underlay, [
      'link add br0 type bridge forward_delay 0',
      'link set br0 up',
      ...hosts.flatMap((h) => [`link add ${h.port} type veth peer name eth0 netns ${h.ns}`, `link set ${h.port} master br0 up`]),
    ]);
    await Promise.all(this.nodes.map((n) => ipBatch(n.netns, this.#nodeLines(n))));
    if (withExternal) {
      await ipBatch(ext, [
        addrLine(underlayIp(4, EXTERNAL_HOST), UNDERLAY[4].len, 'eth0'),
        addrLine(underlayIp(6, EXTERNAL_HOST), UNDERLAY[6].len, 'eth0'),
        'link set eth0 up',
        ...this.nodes.flatMap((n) => n.cidrs.map((c) => `route add ${formatCidr(c)} via ${underlayIp(c.family, n.index)}`)),
      ]);
      const ips = [underlayIp(4, EXTERNAL_HOST), underlayIp(6, EXTERNAL_HOST)];
      const socketPath = join(this.#dir, 'ext.sock');
      const server = await this.#startServer(EXTERNAL_KEY, ext, socketPath);
      this.external = { key: EXTERNAL_KEY, kind: 'external', netns: ext, ips, socketPath, pid: server.child.pid! };
    }
  }

  #nodeLines(n: NodeState): string[] {
    // A fixed MAC: a bridge otherwise takes its lowest port MAC, which changes as pods come
    // and go and leaves stale neighbour entries in the pods.
    const mac = `02:5e:00:00:${n.index.toString(16).padStart(2, '0')}:01`;
    return [
      'link add cni0 type bridge forward_delay 0',
      `link set cni0 address ${mac}`,
      ...n.cidrs.map((c) => addrLine(firstHost(c), c.prefix, 'cni0')),
      'link set cni0 up',
      addrLine(underlayIp(4, n.index), UNDERLAY[4].len, 'eth0'),
      addrLine(underlayIp(6, n.index), UNDERLAY[6].len, 'eth0'),
      'link set eth0 up',
      // host-gw: every other node's pod CIDRs are reached through that node's underlay address.
      ...this.nodes.filter((o) => o !== n).flatMap((o) => o.cidrs.map((c) => `route add ${formatCidr(c)} via ${underlayIp(c.family, o.index)}`)),
    ];
  }

  async addPod(spec: PodSpec): Promise<SimPod> {
    if (this.#destroying || this.#destroyed) throw new PreconditionError(`cluster ${this.prefix} is destroyed`);
    const key = podKey(spec.namespace, spec.name);
    const node = this.#validatePod(spec, key);
    this.#reserved.add(key);
    const seq = ++this.#seq;
    const netns = this.#ns(`pod${seq}`);
    const nodeVeth = `vp${seq}`;
    let server: Server | undefined;
    try {
      await createNs(netns);
      await sysctl(netns, NO_DAD);
      await ipBatch(netns, [
        `link add eth0 address ${podMac(spec.ips)} type veth peer name ${nodeVeth} netns ${node.netns}`,
        ...spec.ips.map((ip) => addrLine(ip, this.#cidrFor(node, ip).prefix, 'eth0')),
        'link set eth0 up',
        ...spec.ips.map((ip) => `route add default via ${firstHost(this.#cidrFor(node, ip))}`),
      ]);
      await sh('ip', ['-n', node.netns, 'link', 'set', nodeVeth, 'master', 'cni0', 'up']);
      const socketPath = join(this.#dir, `pod${seq}.sock`);
      server = await this.#startServer(key, netns, socketPath);
      const pod: SimPod = {
        key,
        kind: 'pod',
        namespace: spec.namespace,
        name: spec.name,
        node: node.name,
        netns,
        ips: [...spec.ips],
        socketPath,
        pid: server.child.pid!,
      };
      this.#pods.set(key, { seq, pod, server, nodeVeth });
      return pod;
    } catch (err) {
      if (server) await this.#stopServer(server);
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
    await this.#stopServer(state.server);
    await this.#unplug(this.nodes.find((n) => n.name === state.pod.node)!.netns, state.nodeVeth, state.pod.netns);
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
    if (spec.ips.length === 0) problems.push(`pod ${key}: no IPs`);
    const used = new Set(this.pods().flatMap((p) => p.ips));
    const families = new Set<Family>();
    for (const ip of spec.ips) {
      const parsed = parseIp(ip);
      if (!parsed) {
        problems.push(`pod ${key}: "${ip}" is not an IP address`);
        continue;
      }
      if (families.has(parsed.family)) problems.push(`pod ${key}: two IPv${parsed.family} addresses`);
      families.add(parsed.family);
      if (used.has(ip)) problems.push(`pod ${key}: ${ip} belongs to another pod`);
      const cidr = node?.cidrs.find((c) => c.family === parsed.family);
      if (node && (!cidr || !cidrContains(cidr, ip) || firstHost(cidr) === ip)) {
        problems.push(`pod ${key}: ${ip} is not a pod address of node ${node.name} (${node.podCIDRs.join(', ')})`);
      }
    }
    if (problems.length) throw new ConfigError(problems);
    return node!;
  }

  #cidrFor(node: NodeState, ip: string): Cidr {
    return node.cidrs.find((c) => cidrContains(c, ip))!;
  }

  #ns(suffix: string): string {
    const name = this.prefix + suffix;
    this.#namespaces.add(name);
    return name;
  }

  async #startServer(key: string, netns: string, socketPath: string): Promise<Server> {
    const logPath = socketPath.replace(/\.sock$/, '.log');
    const log = openSync(logPath, 'a');
    const args = ['netns', 'exec', netns, process.execPath, SERVER_SCRIPT, '--name', key, '--ports', this.ports.join(','), '--control', socketPath];
    // `ip netns exec` execs in place, so child.pid is the server's own PID.
    const child = spawn('ip', args, { stdio: ['ignore', log, log] });
    closeSync(log);
    let spawnError: Error | undefined;
    child.on('error', (e) => (spawnError = e));
    // Unref'd: a forgotten destroy() must not keep the process alive; the exit cleanup kills it.
    child.unref();
    const server: Server = { child, exited: new Promise((resolve) => child.once('close', () => resolve())) };
    this.#servers.add(server);
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (!(await canConnect(socketPath))) {
      const gone = spawnError !== undefined || child.exitCode !== null || child.signalCode !== null;
      if (gone || Date.now() > deadline) {
        await this.#stopServer(server);
        const output = await readFile(logPath, 'utf8').catch(() => '');
        const why = spawnError ? `${spawnError.message}\n${output}` : gone ? output : `not ready after ${READY_TIMEOUT_MS} ms\n${output}`;
        throw new CommandError(spawnError ? 'WEIR_COMMAND_MISSING' : 'WEIR_COMMAND_FAILED', 'ip', args, child.exitCode ?? undefined, why);
      }
      await sleep(10);
    }
    return server;
  }

  async #stopServer(server: Server): Promise<void> {
    this.#servers.delete(server);
    const { child } = server;
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    child.ref(); // waiting for it must keep the process alive
    child.kill('SIGTERM');
    const stopped = await Promise.race([server.exited.then(() => true), sleep(STOP_TIMEOUT_MS, false, { ref: false })]);
    if (!stopped) {
      child.kill('SIGKILL');
      await server.exited;
    }
  }

  destroy(): Promise<void> {
    if (this.#destroyed) return Promise.resolve();
    this.#destroying ??= (async () => {
      await Promise.all([...this.#servers].map((s) => this.#stopServer(s)));
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
    for (const s of this.#servers) s.child.kill('SIGKILL');
    for (const ns of this.#namespaces) spawnSync('ip', ['netns', 'delete', ns], { stdio: 'ignore' });
    if (this.#dir) rmSync(this.#dir, { recursive: true, force: true });
  }
}

function canConnect(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
