// Processes a test file starts, found again after the file has ended. Importing this module marks
// the importing process: every child it starts from then on (and their children, re-parented or
// not, through setpriv, ip netns exec, a shell) inherits two environment variables naming the
// suite run and the test file. The suite's last file (test/zz-leftover-processes.test.ts) looks
// for marked processes of its own run whose test file has exited: each one outlived the test
// that started it. A run is the test runner (each file's parent) by PID and start time, so
// processes of another run, another person's included, are never named.

import { readdirSync, readFileSync } from 'node:fs';
import { relative } from 'node:path';

const RUN = 'WEIR_TEST_RUN';
const OWNER = 'WEIR_TEST_OWNER';

export interface ProcStat {
  /** R, S, D, Z (exited, not yet reaped), X, ... */
  readonly state: string;
  readonly ppid: number;
  /** Clock ticks after boot: with the PID, names one process even after its PID is reused. */
  readonly start: number;
}

/** /proc/<pid>/stat's state, parent and start time; undefined when no such process exists. */
export function procStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // The command name, in parentheses, may hold spaces and parentheses: fields follow the last ')'.
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { state: f[0], ppid: Number(f[1]), start: Number(f[19]) };
}

/** Whether the process still runs: an exited one waiting to be reaped (a zombie) does not. */
export function running(pid: number, start?: number): boolean {
  const s = procStat(pid);
  return s !== undefined && s.state !== 'Z' && s.state !== 'X' && (start === undefined || s.start === start);
}

/** A process by PID and start time, as the marks write it. */
const ident = (pid: number) => `${pid}.${procStat(pid)?.start ?? 0}`;

/** This process's suite run: its parent, the test runner. */
export function currentRun(): string {
  return ident(process.ppid);
}

/** Marks every process this one starts from now on with `run` (default: the current run) and
 *  this process as the test file that started it. */
export function markChildren(run = currentRun()): void {
  const file = process.argv[1] === undefined ? '[eval]' : relative(process.cwd(), process.argv[1]);
  process.env[RUN] = run;
  process.env[OWNER] = `${ident(process.pid)} ${file}`;
}

markChildren();

export interface Leftover {
  readonly pid: number;
  readonly command: string;
  /** The test file that started it (or started the process that did). */
  readonly file: string;
}

/** The marked processes of `run` that still run although the test file that started them has
 *  exited. Processes of files still running are not counted: they may yet end them. */
export function leftovers(run: string): Leftover[] {
  const found: Leftover[] = [];
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    let env: string;
    try {
      env = readFileSync(`/proc/${pid}/environ`, 'latin1');
    } catch {
      continue; // gone meanwhile, or not ours to read
    }
    const vars = env.split('\0');
    if (!vars.includes(`${RUN}=${run}`)) continue;
    const owner = vars.find((v) => v.startsWith(`${OWNER}=`))?.slice(OWNER.length + 1) ?? '';
    const [id = '', file = '?'] = owner.split(/ (.*)/s);
    const [ownerPid, ownerStart] = id.split('.').map(Number);
    if (ownerPid === undefined || running(ownerPid, ownerStart) || !running(pid)) continue;
    let command = '?';
    try {
      command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
    } catch {
      continue;
    }
    found.push({ pid, command, file });
  }
  return found.sort((a, b) => a.pid - b.pid);
}
