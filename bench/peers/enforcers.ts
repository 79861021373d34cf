// The enforcers the bench compares, each run for real inside a simulated node's network
// namespace against the bench's kube-apiserver (reached through the node's bridge, bridge.ts):
//   none         no process at all: the baseline every figure is compared with
//   kube-router  its network-policy controller alone, built by scripts/peers.sh
//   weir         the built agent (`dist/`, or a private build of src/), in kube mode
// A running one is an EnforcerProcess: its log lines, what it says when a sync ends, its CPU
// and memory read from /proc, and a kill by its own PID.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.ts';
import { type Usage, usageOf } from './usage.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
export type EnforcerName = 'none' | 'kube-router' | 'weir';
export const ENFORCERS: readonly EnforcerName[] = ['none', 'kube-router', 'weir'];

export interface EnforcerSpec {
  readonly name: EnforcerName;
  /** The argv run inside the node's namespace; undefined for none. */
  argv(node: string, kubeconfig: string): string[] | undefined;
  /** True of the log line an enforcer writes when a sync (a write of its rules) has ended. */
  synced(line: string): boolean;
}

/** Builds what each enforcer needs, once per bench run; returns their specs. */
export async function prepareEnforcers(opts: { weirDist?: string; log: (s: string) => void }): Promise<Record<EnforcerName, EnforcerSpec>> {
  const built = spawnSync(join(REPO, 'scripts/peers.sh'), ['build'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  if (built.status !== 0) throw new Error('scripts/peers.sh build failed');
  const kubeRouter = join(built.stdout.trim(), 'kube-router');
  const weirMain = join(opts.weirDist ?? (await buildWeir(opts.log)), 'cli/main.js');
  if (!existsSync(weirMain)) throw new Error(`no Weir build at ${weirMain}`);
  return {
    none: { name: 'none', argv: () => undefined, synced: () => false },
    'kube-router': {
      name: 'kube-router',
      // The firewall alone, as the peers README says; -v=1 logs the start and end of every sync.
      // IPv6 on as well: the simulated pods are dual-stack, and Weir polices both families.
      argv: (node, kubeconfig) => [
        kubeRouter,
        '--run-firewall=true',
        '--run-router=false',
        '--run-service-proxy=false',
        '--enable-ipv4=true',
        '--enable-ipv6=true',
        `--kubeconfig=${kubeconfig}`,
        `--hostname-override=${node}`,
        '--health-port=0',
        '--metrics-port=0',
        '-v=1',
      ],
      synced: (line) => line.includes('sync iptables took'),
    },
    weir: {
      name: 'weir',
      // Weir's defaults, as the chart runs it (info logs: one line per write).
      argv: (node, kubeconfig) => [process.execPath, ...NODE_FLAGS, weirMain, 'agent', '--node-name', node, '--kubeconfig', kubeconfig, '--log-level', 'info'],
      synced: (line) => line.includes('"msg":"applied changes"') || line.includes('"msg":"resynced dataplane"'),
    },
  };
}

/** Builds src/ into a directory of the bench's own (never dist/, which others may be using), as
 *  `npm run build` does: the figures are those of the source as it is now. */
async function buildWeir(log: (s: string) => void): Promise<string> {
  const out = join(REPO, '.cache/peers/weir-dist');
  log(`building Weir from src/ into ${out}`);
  const r = spawnSync(process.execPath, [join(REPO, 'scripts/build.ts'), out], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`scripts/build.ts failed:\n${(r.stdout + r.stderr).split('\n').slice(0, 10).join('\n')}`);
  return out;
}

/**
 * A process started in a network namespace with `ip netns exec`, which execs in place: child.pid
 * is the process's own. Its stdout and stderr lines go to onLine(), which subclasses define.
 */
export abstract class NetnsProcess {
  readonly child: ChildProcess;

  constructor(netns: string, argv: readonly string[]) {
    this.child = spawn('ip', ['netns', 'exec', netns, ...argv], { stdio: ['ignore', 'pipe', 'pipe'] });
    for (const s of [this.child.stdout!, this.child.stderr!]) createInterface({ input: s }).on('line', (l) => this.onLine(l));
  }

  protected abstract onLine(line: string): void;

  get pid(): number {
    return this.child.pid ?? -1;
  }

  get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  usage(): Usage | null {
    return this.exited ? null : usageOf(this.pid);
  }

  /** SIGKILL, and waits until it is gone: the fault benches' agent crash. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.child.kill('SIGKILL');
    await gone;
  }

  /** SIGTERM, then SIGKILL after 5 s. */
  async stop(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.child.kill('SIGTERM');
    const force = setTimeout(() => this.child.kill('SIGKILL'), 5000);
    await gone;
    clearTimeout(force);
  }
}

export class EnforcerProcess extends NetnsProcess {
  readonly spec: EnforcerSpec;
  readonly node: string;
  readonly log: string[] = [];
  syncs = 0;
  lastSyncAt = 0;
  readonly #waiters = new Set<{ test: (line: string) => boolean; resolve: () => void }>();

  constructor(spec: EnforcerSpec, node: string, netns: string, argv: string[]) {
    super(netns, argv);
    this.spec = spec;
    this.node = node;
  }

  /** Resolves at the first line from now on that passes `test`. */
  waitFor(test: (line: string) => boolean, timeoutMs: number, what: string): Promise<void> {
    return new Promise((resolve, reject) => {
      const w = {
        test,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(w);
        reject(
          new Error(
            `${this.spec.name} on ${this.node}: no "${what}" within ${timeoutMs} ms${this.exited ? ` (exited ${this.child.exitCode ?? this.child.signalCode})` : ''}; last lines:\n${this.log.slice(-10).join('\n')}`,
          ),
        );
      }, timeoutMs);
      this.#waiters.add(w);
    });
  }

  /** Resolves when a sync that ends from now on has ended. */
  nextSync(timeoutMs: number): Promise<void> {
    return this.waitFor((l) => this.spec.synced(l), timeoutMs, 'end of a sync');
  }

  protected onLine(line: string): void {
    this.log.push(line);
    if (this.log.length > 400) this.log.shift();
    if (this.spec.synced(line)) {
      this.syncs++;
      this.lastSyncAt = performance.now();
    }
    for (const w of [...this.#waiters]) {
      if (w.test(line)) {
        this.#waiters.delete(w);
        w.resolve();
      }
    }
  }
}
