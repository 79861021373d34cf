// The image smoke test: the unpacked image's own files run `weir` the way a container
// runtime would (its entrypoint, environment and working directory, chrooted into its root
// filesystem, read-only, with the node's mounts the chart gives it: see chroot-run.sh) inside a
// fresh network namespace that plays the node. Nothing from the host but those mounts is used
// inside the chroot, so a binary or library the image lacks makes a step fail.

import { spawn, type ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { createNs, deleteNs, sh, uniquePrefix } from '../../src/sim/netns.ts';
import type { ImageConfig } from './oci.ts';

const HELPER = fileURLToPath(new URL('./chroot-run.sh', import.meta.url));

/** Every program the agent runs (src/dataplane, src/agent/preflight.ts,
 *  src/sources/pod-interfaces.ts), and modprobe, which iptables-legacy runs to load ip_tables. */
export const AGENT_PROGRAMS: readonly (readonly string[])[] = [
  ...['iptables', 'ip6tables'].flatMap((t) => ['nft', 'legacy'].flatMap((b) => ['save', 'restore'].map((op) => [`${t}-${b}-${op}`, '--version']))),
  ['iptables-restore', '--version'],
  ['ipset', 'version'],
  ['conntrack', '--version'],
  ['ip', '-V'],
  ['nsenter', '--version'],
  ['modprobe', '--version'],
  // setpriv gives the audit reader (tcpdump, as its own user) and the link monitor a parent-death signal.
  ['setpriv', '--version'],
  ['tcpdump', '--version'],
];

export class SmokeFailure extends Error {
  readonly step: string;
  constructor(step: string, message: string) {
    super(`${step}: ${message}`);
    this.name = 'SmokeFailure';
    this.step = step;
  }
}

export interface SmokeReport {
  /** Milliseconds from the agent's start to its chains read back, per backend. */
  readonly chainsWrittenMs: Record<string, number>;
}

interface Result {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

const BACKENDS = ['nft', 'legacy'] as const;
/** The agent keeps running this long (from its start) before it is stopped. */
const AGENT_RUN_MS = 3000;
const CHAINS_TIMEOUT_MS = 20_000;
const STOP_TIMEOUT_MS = 10_000;

/** Runs the whole smoke test on an unpacked image; throws a SmokeFailure naming the step. */
export async function smokeTest(rootfs: string, config: ImageConfig): Promise<SmokeReport> {
  const image = new ImageRunner(rootfs, config);
  const entry = config.config.Entrypoint ?? [];
  if (entry.length === 0) throw new SmokeFailure('config', 'the image has no entrypoint');

  const pod = await examplePod(rootfs, 'node-a');
  const prefix = uniquePrefix('wimg');
  const node = `${prefix}node`;
  const podNs = `${prefix}pod`;
  const port = `${prefix}p`;
  const chainsWrittenMs: Record<string, number> = {};
  try {
    await plugPod(node, podNs, port, pod.ips);
    image.ns = node;

    const help = await image.run([...entry, '--help']);
    expectOk('weir --help', help, /^Usage: weir <command>/m);

    const render = await image.run([...entry, 'render', '--node-name', 'node-a', '--manifests', '/app/examples']);
    expectOk('weir render', render, /^:cali-FORWARD /m);

    const missing: string[] = [];
    for (const argv of AGENT_PROGRAMS) {
      const r = await image.run(argv);
      if (r.code !== 0) missing.push(`${argv[0]} (exit ${r.code}): ${lastLine(r.stderr || r.stdout)}`);
    }
    if (missing.length > 0) throw new SmokeFailure('programs', `not runnable in the image:\n  ${missing.join('\n  ')}`);

    for (const backend of BACKENDS) chainsWrittenMs[backend] = await agentRun(image, entry, backend, port);
  } finally {
    await deleteNs(podNs);
    await deleteNs(node);
  }
  return { chainsWrittenMs };
}

/** A node with a pod bridge and one pod of the examples plugged into it, its namespace
 *  pinned under /run/netns as a container runtime pins it: source binding must find it. */
async function plugPod(node: string, podNs: string, port: string, ips: readonly string[]): Promise<void> {
  await createNs(node);
  await createNs(podNs);
  await sh('ip', ['-n', node, 'link', 'add', 'cni0', 'type', 'bridge']);
  await sh('ip', ['-n', node, 'link', 'set', 'cni0', 'up']);
  await sh('ip', ['-n', podNs, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', port, 'netns', node]);
  for (const ip of ips) {
    await sh('ip', ['-n', podNs, 'addr', 'add', ip.includes(':') ? `${ip}/64` : `${ip}/24`, 'dev', 'eth0', ...(ip.includes(':') ? ['nodad'] : [])]);
  }
  await sh('ip', ['-n', podNs, 'link', 'set', 'eth0', 'up']);
  await sh('ip', ['-n', node, 'link', 'set', port, 'master', 'cni0', 'up']);
}

/**
 * One backend: the agent enforces /app/examples, its chains (with the pod's address bound to
 * its bridge port) and sets are read back with the image's own iptables-save and ipset, it
 * runs for a few seconds, and stops cleanly on SIGTERM leaving its rules in place; then
 * `weir cleanup` removes them all.
 */
async function agentRun(image: ImageRunner, entry: readonly string[], backend: string, port: string): Promise<number> {
  const step = `weir agent --backend ${backend}`;
  const agent = image.start([...entry, 'agent', '--node-name', 'node-a', '--manifests', '/app/examples', '--backend', backend]);
  const t0 = performance.now();
  let writtenMs = -1;
  try {
    for (;;) {
      agent.check(step);
      const missing = await image.missingRules(backend, port);
      if (missing.length === 0) break;
      if (performance.now() - t0 > CHAINS_TIMEOUT_MS) {
        throw new SmokeFailure(step, `after ${CHAINS_TIMEOUT_MS} ms the kernel lacks ${missing.join('; ')}\n${agent.tail()}`);
      }
      await sleep(200);
    }
    writtenMs = Math.round(performance.now() - t0);
    const sets = await image.run(['ipset', 'list', '-n']);
    for (const family of ['cali40s:', 'cali60s:']) {
      if (!sets.stdout.includes(family)) throw new SmokeFailure(step, `no ${family}* ipset after the write: ${JSON.stringify(sets.stdout)}`);
    }
    while (performance.now() - t0 < AGENT_RUN_MS) {
      agent.check(step);
      await sleep(200);
    }
    agent.check(step);
    const exit = await agent.stop();
    if (exit.code !== 0) throw new SmokeFailure(step, `exited ${exit.code ?? exit.signal} on SIGTERM, not 0\n${agent.tail()}`);
    const kept = await image.missingRules(backend, port);
    if (kept.length > 0) throw new SmokeFailure(step, `after its stop the kernel lacks ${kept.join('; ')}: a stop must leave the rules in place`);
  } finally {
    await agent.kill();
  }

  const cleanup = await image.run([...entry, 'cleanup', '--backend', backend]);
  expectOk(`weir cleanup --backend ${backend}`, cleanup, /removed everything Weir owned/);
  const after = [...(await image.save(backend, 4)), ...(await image.save(backend, 6))].filter((l) => /cali-|weir:/.test(l));
  const setsAfter = (await image.run(['ipset', 'list', '-n'])).stdout.trim();
  if (after.length > 0 || setsAfter !== '') {
    throw new SmokeFailure(`weir cleanup --backend ${backend}`, `left ${[...after, setsAfter].filter(Boolean).join('\n')}`);
  }
  return writtenMs;
}

/** Runs programs of the unpacked image, chrooted, in network namespace `ns`. */
class ImageRunner {
  ns = '';
  readonly rootfs: string;
  readonly config: ImageConfig;
  readonly #env: NodeJS.ProcessEnv;

  constructor(rootfs: string, config: ImageConfig) {
    this.rootfs = rootfs;
    this.config = config;
    // Only the image's environment: the host's PATH or NODE_OPTIONS must not leak in.
    this.#env = Object.fromEntries((config.config.Env ?? []).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
  }

  spawn(argv: readonly string[]): ChildProcess {
    const wrap = ['unshare', '--mount', '--propagation', 'private', HELPER, this.rootfs, this.config.config.WorkingDir || '/', ...argv];
    // Never in the host's own network namespace.
    if (this.ns === '') throw new Error('no network namespace to run the image in');
    return spawn('ip', ['netns', 'exec', this.ns, ...wrap], { env: this.#env, stdio: ['ignore', 'pipe', 'pipe'] });
  }

  run(argv: readonly string[], timeoutMs = 60_000): Promise<Result> {
    return new Promise((resolve, reject) => {
      const child = this.spawn(argv);
      let stdout = '';
      let stderr = '';
      child.stdout!.on('data', (c: Buffer) => (stdout += c));
      child.stderr!.on('data', (c: Buffer) => (stderr += c));
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      child.on('error', reject);
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal, stdout, stderr });
      });
    });
  }

  start(argv: readonly string[]): Agent {
    return new Agent(this.spawn(argv));
  }

  async save(backend: string, family: 4 | 6): Promise<string[]> {
    const tool = `${family === 4 ? 'iptables' : 'ip6tables'}-${backend}-save`;
    // Weir's chains and hooks are in mangle; filter holds its accept hook.
    const lines: string[] = [];
    for (const table of ['mangle', 'filter']) {
      const r = await this.run([tool, '-t', table]);
      if (r.code !== 0) throw new SmokeFailure(`${tool} -t ${table}`, `exit ${r.code}: ${lastLine(r.stderr)}`);
      lines.push(...r.stdout.split('\n'));
    }
    return lines;
  }

  /** What of the agent's write is not in the kernel yet, per family: the hook, a chain, and
   *  the bound pod's rule on its bridge port. */
  async missingRules(backend: string, port: string): Promise<string[]> {
    const missing: string[] = [];
    for (const family of [4, 6] as const) {
      const lines = await this.save(backend, family);
      if (!lines.some((l) => l.startsWith('-A FORWARD ') && l.includes('-j cali-FORWARD'))) missing.push(`IPv${family}: the FORWARD hook`);
      if (!lines.some((l) => l.startsWith(':cali-from-wl-dispatch '))) missing.push(`IPv${family}: chain cali-from-wl-dispatch`);
      if (!lines.some((l) => l.includes(`--physdev-in ${port} `))) missing.push(`IPv${family}: a rule binding the pod to bridge port ${port}`);
    }
    return missing;
  }
}

/** A running agent, its log lines collected. */
class Agent {
  readonly #log: string[] = [];
  #exit: Promise<Result>;
  #exited: Result | undefined;
  readonly child: ChildProcess;

  constructor(child: ChildProcess) {
    this.child = child;
    let stdout = '';
    let stderr = '';
    const collect = (c: Buffer, into: 'out' | 'err') => {
      const text = c.toString();
      if (into === 'out') stdout += text;
      else stderr += text;
      this.#log.push(...text.split('\n').filter(Boolean));
    };
    child.stdout!.on('data', (c: Buffer) => collect(c, 'out'));
    child.stderr!.on('data', (c: Buffer) => collect(c, 'err'));
    this.#exit = new Promise((resolve) =>
      child.on('close', (code, signal) => {
        this.#exited = { code, signal, stdout, stderr };
        resolve(this.#exited);
      }),
    );
  }

  /** Fails if the agent has exited, logged an error (level 50 and up), or could not start its
   *  commands through the fork server (the image's own sh, in the chart's /tmp). */
  check(step: string): void {
    if (this.#exited) throw new SmokeFailure(step, `exited ${this.#exited.code ?? this.#exited.signal} while it should run\n${this.tail()}`);
    const error = this.#log.find((l) => /"level":(5|6)\d/.test(l) || !l.startsWith('{') || /commands are started from the agent itself/.test(l));
    if (error !== undefined) throw new SmokeFailure(step, `logged ${error}\n${this.tail()}`);
  }

  tail(): string {
    return `last log lines:\n  ${this.#log.slice(-10).join('\n  ')}`;
  }

  async stop(): Promise<Result> {
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), STOP_TIMEOUT_MS);
    const r = await this.#exit;
    clearTimeout(timer);
    return r;
  }

  async kill(): Promise<void> {
    if (this.#exited) return;
    this.child.kill('SIGKILL');
    await this.#exit;
  }
}

function expectOk(step: string, r: Result, shows: RegExp): void {
  if (r.code !== 0) throw new SmokeFailure(step, `exit ${r.code ?? r.signal}: ${(r.stderr || r.stdout).trim().split('\n').slice(-5).join('\n')}`);
  if (!shows.test(r.stdout)) throw new SmokeFailure(step, `output lacks ${shows}:\n${r.stdout.slice(0, 2000)}`);
}

/** The addresses of the first running pod of `nodeName` in the image's own examples. */
async function examplePod(rootfs: string, nodeName: string): Promise<{ name: string; ips: string[] }> {
  type PodDoc = { kind?: string; metadata?: { name?: string }; spec?: { nodeName?: string }; status?: { phase?: string; podIPs?: { ip: string }[] } };
  const docs = loadAll(await readFile(join(rootfs, 'app/examples/10-pods.yaml'), 'utf8')) as (PodDoc | null)[];
  const pod = docs.find((d) => d?.kind === 'Pod' && d.spec?.nodeName === nodeName && d.status?.phase === 'Running' && (d.status.podIPs?.length ?? 0) > 0);
  if (!pod) throw new SmokeFailure('examples', `no running pod of ${nodeName} with an address in /app/examples/10-pods.yaml`);
  return { name: pod.metadata?.name ?? '?', ips: pod.status!.podIPs!.map((p) => p.ip) };
}

function lastLine(s: string): string {
  return s.trim().split('\n').pop() ?? '';
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
