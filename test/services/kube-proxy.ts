// A real kube-proxy (built by scripts/control-plane.sh from the same release as the API
// server) inside a simulated node's network namespace, as a DaemonSet pod on the host network
// would run it. What it would touch outside that namespace is turned off: it never raises
// the conntrack table size (nf_conntrack's hash size is machine-wide) and never changes its
// OOM score. Its iptables backend is chosen by the `iptables` it finds first on PATH, as in
// kube-proxy's own image: a directory of links to the legacy or nft binaries decides.

import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync, readFileSync, statSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { execa } from 'execa';
import { registerExitCleanup } from '../../src/sim/cleanup.ts';

export type ProxyMode = 'iptables' | 'nftables';
export type IptablesBackend = 'nft' | 'legacy';

export interface KubeProxyOptions {
  readonly bin: string;
  readonly node: string;
  readonly netns: string;
  readonly kubeconfig: string;
  readonly mode: ProxyMode;
  readonly backend: IptablesBackend;
  /** Directory for the log and the PATH links. */
  readonly dir: string;
  readonly clusterCIDRs: readonly string[];
  readonly extraArgs?: readonly string[];
}

const TOOLS = ['iptables', 'iptables-save', 'iptables-restore', 'ip6tables', 'ip6tables-save', 'ip6tables-restore'];

/** A directory whose `iptables*` are the given backend's binaries under their plain names
 *  (xtables-*-multi dispatch on the name they are called by). */
export function backendPath(dir: string, backend: IptablesBackend): string {
  const path = join(dir, `xtables-${backend}`);
  mkdirSync(path, { recursive: true });
  for (const t of TOOLS) {
    try {
      symlinkSync(`/usr/sbin/${t.replace(/^(ip6?tables)/, `$1-${backend}`)}`, join(path, t));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  return path;
}

export class KubeProxy {
  readonly node: string;
  readonly logPath: string;
  #child: ChildProcess | undefined;
  #exited: Promise<void> = Promise.resolve();
  #unregister: () => void = () => {};
  readonly #o: KubeProxyOptions;
  /** Where the log stood when it was last started: each start appends to the same log. */
  #logOffset = 0;

  constructor(o: KubeProxyOptions) {
    this.#o = o;
    this.node = o.node;
    this.logPath = join(o.dir, `kube-proxy-${o.node}.log`);
  }

  get running(): boolean {
    const c = this.#child;
    return c !== undefined && c.exitCode === null && c.signalCode === null;
  }

  start(): void {
    if (this.running) throw new Error(`kube-proxy on ${this.node} already runs`);
    const o = this.#o;
    const args = [
      `--kubeconfig=${o.kubeconfig}`,
      `--hostname-override=${o.node}`,
      `--proxy-mode=${o.mode}`,
      `--cluster-cidr=${o.clusterCIDRs.join(',')}`,
      '--detect-local-mode=ClusterCIDR',
      // Leave the conntrack table and the node's timeouts as they are: the first two would
      // write nf_conntrack's machine-wide hash size.
      '--conntrack-max-per-core=0',
      '--conntrack-min=0',
      '--conntrack-tcp-timeout-established=0',
      '--conntrack-tcp-timeout-close-wait=0',
      '--oom-score-adj=0',
      '--metrics-bind-address=127.0.0.1:10249',
      '--healthz-bind-address=127.0.0.1:10256',
      '--v=2',
      ...(o.extraArgs ?? []),
    ];
    const log = openSync(this.logPath, 'a');
    this.#logOffset = statSync(this.logPath).size;
    const env = { ...process.env, PATH: `${backendPath(o.dir, o.backend)}:${process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin'}` };
    // `ip netns exec` execs in place: the child's PID is kube-proxy's own.
    const child = spawn('ip', ['netns', 'exec', o.netns, o.bin, ...args], { stdio: ['ignore', log, log], env });
    closeSync(log);
    child.on('error', () => {});
    this.#child = child;
    this.#exited = new Promise((resolve) => child.once('close', () => resolve()));
    // A test process that dies first must not leave it running in a deleted namespace.
    this.#unregister = registerExitCleanup(() => child.kill('SIGKILL'));
  }

  /** `kube-proxy --cleanup` in the node (stopped first): removes every rule, chain and table
   *  kube-proxy made there, its jumps from the builtin chains too, as an operator switching
   *  modes would. */
  async cleanup(): Promise<void> {
    if (this.running) throw new Error(`stop kube-proxy on ${this.node} before --cleanup`);
    const o = this.#o;
    const env = { ...process.env, PATH: `${backendPath(o.dir, o.backend)}:${process.env.PATH ?? ''}` };
    const r = await execa('ip', ['netns', 'exec', o.netns, o.bin, '--cleanup', `--proxy-mode=${o.mode}`, '--v=2'], { env, reject: false, all: true });
    if (r.exitCode !== 0) throw new Error(`kube-proxy --cleanup on ${this.node} exited ${r.exitCode}:\n${r.all}`);
  }

  /** SIGTERM (as a rolling update does), SIGKILL after 5 s; its rules stay in the kernel. */
  async stop(): Promise<void> {
    const c = this.#child;
    if (!c || !this.running) return;
    c.kill('SIGTERM');
    const done = await Promise.race([this.#exited.then(() => true), sleep(5_000, false)]);
    if (!done) {
      c.kill('SIGKILL');
      await this.#exited;
    }
    this.#unregister();
  }

  /** The log's last lines, for failure messages. */
  tail(lines = 20): string {
    try {
      return readFileSync(this.logPath, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }

  /** Lines of the log that match, written since the last start. */
  grep(re: RegExp): string[] {
    try {
      return readFileSync(this.logPath)
        .subarray(this.#logOffset)
        .toString('utf8')
        .split('\n')
        .filter((l) => re.test(l));
    } catch {
      return [];
    }
  }
}
