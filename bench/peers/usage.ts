// CPU and memory of a process and of every process it started, read from /proc.
//
// A process's own stat counts a child's CPU only once it has waited for that child. Weir runs
// its commands under a fork server, a shell that the agent waits for only when it exits, so
// the agent's stat alone leaves out every iptables-restore, ipset and conntrack it ran.
// kube-router waits for its commands itself. Reading the whole tree counts both the same way.

import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

export interface Usage {
  /** CPU seconds of the process and its descendants, each with the children it has waited
   *  for (iptables-restore, ipset...). */
  readonly cpuS: number;
  /** Resident memory of the process and its live descendants (Weir's command shell). */
  readonly rssMB: number;
  /** Peak RSS of the process itself (VmHWM). */
  readonly hwmMB: number;
}

const TICK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

interface Stat {
  readonly ppid: number;
  /** utime + stime + cutime + cstime, in ticks. */
  readonly ticks: number;
}

function readStat(pid: number): Stat | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // After "(comm) ": state, ppid, ...; utime, stime, cutime, cstime are fields 14-17 of stat.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]) };
  } catch {
    return null; // gone meanwhile
  }
}

function statusKb(pid: number, key: string): number {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return Number(new RegExp(`^${key}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** CPU and memory of live processes, each with its descendants, from one reading of /proc; a
 *  process that is gone has no entry. A command that ends while /proc is read may be counted
 *  twice or not at all in one reading; the next one counts it once, in its parent, so figures
 *  taken as differences stay right over time. */
export function usagesOf(pids: readonly number[]): Map<number, Usage> {
  const stats = new Map<number, Stat>();
  const children = new Map<number, number[]>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const s = readStat(Number(d));
    if (s === null) continue;
    stats.set(Number(d), s);
    const list = children.get(s.ppid);
    if (list === undefined) children.set(s.ppid, [Number(d)]);
    else list.push(Number(d));
  }
  const out = new Map<number, Usage>();
  for (const pid of pids) {
    if (!stats.has(pid)) continue;
    let ticks = 0;
    let rssKb = 0;
    for (const queue = [pid]; queue.length > 0; ) {
      const p = queue.pop()!;
      ticks += stats.get(p)!.ticks;
      rssKb += statusKb(p, 'VmRSS');
      queue.push(...(children.get(p) ?? []));
    }
    out.set(pid, { cpuS: ticks / TICK, rssMB: rssKb / 1024, hwmMB: statusKb(pid, 'VmHWM') / 1024 });
  }
  return out;
}

/** usagesOf for one process; null once it is gone. */
export function usageOf(pid: number): Usage | null {
  return usagesOf([pid]).get(pid) ?? null;
}
