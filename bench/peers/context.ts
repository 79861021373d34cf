// What every section of the bench shares: the environment, the enforcers to compare, the flags,
// and the rows measured so far (printed as they come and once more, together, at the end).

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { EnforcerName, EnforcerSpec } from './enforcers.ts';
import { usagesOf } from './usage.ts';
import { type BenchEnv, loadAverage, type Turn } from './env.ts';
import { renderTable, type Row } from './table.ts';

export interface Flags {
  readonly only: ReadonlySet<string>;
  readonly enforcers: readonly EnforcerName[];
  readonly policies: readonly number[];
  /** connect-cnp: Admin ClusterNetworkPolicies selecting the policed pod, per scene (0: none). */
  readonly cnps: readonly number[];
  readonly pods: readonly number[];
  readonly connects: number;
  readonly rateMs: number;
  readonly inflight: number;
  readonly rounds: number;
  /** connect: rounds of the rules replayed without agents (replay.ts); 0: none. */
  readonly replayRounds: number;
  readonly replayPolicies: readonly number[];
  readonly changes: number;
  readonly churnSeconds: number;
  readonly churnRate: number;
  readonly conformanceFiles: readonly string[];
  readonly weirDist?: string;
  readonly json?: string;
}

export class Ctx {
  readonly env: BenchEnv;
  readonly specs: Record<EnforcerName, EnforcerSpec>;
  readonly flags: Flags;
  readonly rows: Row[] = [];
  /** The 1-minute load average sampled before every measurement. */
  readonly loads: number[] = [];
  readonly notes: string[] = [];

  constructor(env: BenchEnv, specs: Record<EnforcerName, EnforcerSpec>, flags: Flags) {
    this.env = env;
    this.specs = specs;
    this.flags = flags;
  }

  log(s: string): void {
    process.stdout.write(`${s}\n`);
  }

  enforcers(withNone = true): EnforcerSpec[] {
    return this.flags.enforcers.filter((e) => withNone || e !== 'none').map((e) => this.specs[e]);
  }

  add(...rows: Row[]): void {
    this.rows.push(...rows);
    this.log(renderTable(rows));
  }

  sampleLoad(): number {
    const l = loadAverage();
    this.loads.push(l);
    return l;
  }
}

/** Waits until no enforcer of the turn has ended a sync for `quietMs` (kube-router resyncs a
 *  few times while its informers fill; a measurement must not race a write). */
export async function quiet(t: Turn, quietMs = 2000, timeoutMs = 120_000): Promise<void> {
  const t0 = performance.now();
  for (;;) {
    const last = Math.max(0, ...[...t.procs.values()].map((p) => p.lastSyncAt));
    const dead = [...t.procs.values()].find((p) => p.exited);
    if (dead) throw new Error(`${dead.spec.name} on ${dead.node} exited: ${dead.log.slice(-10).join('\n')}`);
    if (performance.now() - Math.max(last, t0) >= quietMs) return;
    if (performance.now() - t0 > timeoutMs) throw new Error(`${t.spec.name} did not go quiet within ${timeoutMs} ms`);
    await sleep(100);
  }
}

/** The bench's kube-apiserver process (its PID as the control-plane script recorded it). */
export function apiServerPid(env: BenchEnv): number {
  const line = readFileSync(join(env.cp.dir, 'pids'), 'utf8')
    .split('\n')
    .find((l) => l.startsWith('kube-apiserver '));
  return Number(line?.split(' ')[1] ?? -1);
}

/** Waits until the enforcers of the turn (every node) and the API server together use under 5%
 *  of a core for 2 s running: the work an enforcer does after its first sync (Weir writes a
 *  status object per policy) must not fall on a steady-state measurement. Resolves with the
 *  CPU seconds they spent until then and how long it took. */
export async function idle(t: Turn, timeoutMs = 180_000): Promise<{ cpuS: number; ms: number }> {
  const api = apiServerPid(t.env);
  // One reading of /proc for every process a second.
  const pids = [...[...t.procs.values()].filter((p) => !p.exited).map((p) => p.pid), api];
  const cpu = () => [...usagesOf(pids).values()].reduce((s, u) => s + u.cpuS, 0);
  const t0 = performance.now();
  const c0 = cpu();
  let quietSeconds = 0;
  let last = c0;
  while (quietSeconds < 2 && performance.now() - t0 < timeoutMs) {
    await sleep(1000);
    const now = cpu();
    quietSeconds = now - last < 0.05 ? quietSeconds + 1 : 0;
    last = now;
  }
  return { cpuS: last - c0, ms: performance.now() - t0 };
}

/** iptables rules (IPv4, every table: Weir polices from mangle, kube-router from filter) and
 *  ipsets on a node: the size of what an enforcer wrote. */
export function kernelState(t: Turn, node: string): { rules: number; sets: number; members: number } {
  const rules = t
    .inNode(node, 'iptables-save', [])
    .split('\n')
    .filter((l) => l.startsWith('-A ') || l.startsWith('-I ')).length;
  const ipsets = t.inNode(node, 'ipset', ['list', '-t']);
  const sets = (ipsets.match(/^Name: /gm) ?? []).length;
  const members = [...ipsets.matchAll(/^Number of entries: (\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0);
  return { rules, sets, members };
}
