// Reads an NFLOG group through a supervised tcpdump child (Node has no netlink sockets):
// `tcpdump -i nflog:G -U -B 16384 -w -`, its pcap stream parsed as it arrives. When tcpdump
// dies it is restarted with backoff; what is lost is counted: the kernel's drops on tcpdump's
// netlink socket (its receive queue overflowed), read from /proc/<pid>/net/netlink, and every
// restart (while no tcpdump listens the kernel logs nothing for the group). tcpdump is started
// through setpriv with a parent-death signal, so it dies with the agent however the agent ends.

import { type ChildProcess, spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { type Backoff, backoffMs } from '../backoff.ts';
import { AuditReaderError, AuditStreamError, WeirError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../clock.ts';
import { type NflogEvent, NflogPcapParser } from './pcap.ts';

/** starting: a tcpdump was spawned; running: it listens on the group; backoff: it died and
 *  the next one waits; stopped: stop() was called. */
export type ReaderState = 'starting' | 'running' | 'backoff' | 'stopped';

export interface ReaderOptions {
  readonly group: number;
  /** The argv that runs tcpdump, before tcpdump's own arguments, its last element tcpdump
   *  itself: ['tcpdump'], or with a prefix that execs it elsewhere (['ip', 'netns', 'exec', NS,
   *  'tcpdump']). setpriv is put right before that last element (guardArgs). Only a prefix that
   *  execs keeps the child's PID tcpdump's and its parent the agent, which the drop count,
   *  stop() and the parent-death signal rely on. */
  readonly command: readonly string[];
  /** The user tcpdump runs as from its start, holding CAP_NET_ADMIN only; null: the agent's.
   *  Default 'tcpdump' (the user of Debian's package) when the agent is root, else null. */
  readonly user?: string | null;
  /** tcpdump -B: the netlink socket's receive buffer in KiB (the kernel caps it at
   *  net.core.rmem_max). Default 16384. */
  readonly bufferKiB?: number;
  /** Default 100 ms doubling to 30 s. */
  readonly restart?: Backoff;
  /** A tcpdump that ran this long before it died starts the backoff over. Default 10 s. */
  readonly stableMs?: number;
  /** How often the kernel's drop count is read while tcpdump runs. Default 1 s. */
  readonly dropPollMs?: number;
  /** How long stop() waits after SIGTERM before SIGKILL. Default 2 s. */
  readonly killAfterMs?: number;
  readonly log: Logger;
  readonly clock?: Clock;
}

export interface ReaderHandlers {
  /** The events of one chunk of the stream, in order. Called synchronously from the child's
   *  stdout: keep it short (the pipeline only enriches and buffers). */
  events(batch: readonly NflogEvent[]): void;
  /** Every state change; a change to backoff carries the error that ended the child. */
  state?(state: ReaderState, error?: WeirError): void;
  /** Events the kernel dropped because tcpdump's socket queue was full. */
  lost?(count: number): void;
  /** Records the parser could not read. */
  malformed?(count: number): void;
}

export interface ReaderStats {
  /** tcpdump children started after the first. */
  readonly restarts: number;
  /** Events the kernel dropped on tcpdump's socket (queue overflow). */
  readonly queueDrops: number;
  readonly events: number;
  readonly malformed: number;
}

export interface AuditReader {
  start(): void;
  /** Ends the child (SIGTERM to its PID, SIGKILL after killAfterMs) and waits for it. */
  stop(): Promise<void>;
  readonly state: ReaderState;
  /** The running child's PID (tcpdump's, behind an exec'ing prefix); undefined between children. */
  readonly pid: number | undefined;
  stats(): ReaderStats;
}

/** tcpdump's arguments: -U writes each record at once; never -s, which truncated records. */
export function tcpdumpArgs(group: number, bufferKiB: number): string[] {
  return ['-i', `nflog:${group}`, '-U', '-B', String(bufferKiB), '-w', '-'];
}

/** What setpriv does before it execs tcpdump. --pdeathsig KILL: the kernel kills tcpdump when
 *  the agent dies without stopping it (SIGKILL, a crash); otherwise tcpdump is re-parented to
 *  init and, blocked on a group no event reaches, never exits. The signal is bound to the thread
 *  that spawned the child, Node's main thread here. The kernel clears it on any change of
 *  credentials, and tcpdump started as root drops to its own user once it listens: so with
 *  `user`, setpriv makes that change itself, before the signal is set, keeping CAP_NET_ADMIN
 *  (ambient) for tcpdump to listen with, and tcpdump, started unprivileged, changes nothing. */
export function guardArgs(user: string | null): string[] {
  const as = user === null ? [] : ['--reuid', user, '--regid', user, '--init-groups', '--inh-caps', '-all,+net_admin', '--ambient-caps', '-all,+net_admin'];
  return ['setpriv', ...as, '--pdeathsig', 'KILL'];
}

/** The whole argv of the child: the command's prefix, setpriv, tcpdump and its arguments. */
export function readerArgv(command: readonly string[], user: string | null, group: number, bufferKiB: number): string[] {
  if (command.length === 0) throw new TypeError('audit reader: the tcpdump command is empty');
  return [...command.slice(0, -1), ...guardArgs(user), command[command.length - 1], ...tcpdumpArgs(group, bufferKiB)];
}

const NETLINK_NETFILTER = '12';

/** The Drops column of /proc/<pid>/net/netlink for the NETLINK_NETFILTER socket whose port id
 *  is `pid` (a process's first netlink socket takes its PID as port id). */
export function netlinkDrops(table: string, pid: number): number | undefined {
  for (const line of table.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length >= 10 && f[1] === NETLINK_NETFILTER && f[2] === String(pid)) return Number(f[8]);
  }
  return undefined;
}

const STDERR_KEEP = 4096;

export function createTcpdumpReader(opts: ReaderOptions, handlers: ReaderHandlers): AuditReader {
  const clock = opts.clock ?? systemClock;
  const restart = opts.restart ?? { initialMs: 100, maxMs: 30_000 };
  const stableMs = opts.stableMs ?? 10_000;
  const user = opts.user === undefined ? (process.getuid?.() === 0 ? 'tcpdump' : null) : opts.user;
  const argv = readerArgv(opts.command, user, opts.group, opts.bufferKiB ?? 16384);
  const log = opts.log;

  let state: ReaderState = 'stopped';
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  let timer: unknown;
  let dropTimer: NodeJS.Timeout | undefined;
  let attempt = 0;
  let stopping = false;
  let started = 0;
  const stats = { restarts: 0, queueDrops: 0, events: 0, malformed: 0 };

  const setState = (s: ReaderState, err?: WeirError) => {
    state = s;
    handlers.state?.(s, err);
  };

  function spawnChild(): void {
    if (started > 0) stats.restarts++;
    started = clock.now();
    setState('starting');
    const parser = new NflogPcapParser();
    let stderr = '';
    let failure: WeirError | undefined;
    let lastDrops = 0;
    const proc = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    child = proc;

    const readDrops = async () => {
      if (proc.pid === undefined || proc.exitCode !== null) return;
      const table = await readFile(`/proc/${proc.pid}/net/netlink`, 'utf8').catch(() => '');
      const drops = netlinkDrops(table, proc.pid);
      if (drops === undefined || drops <= lastDrops || child !== proc) return;
      const n = drops - lastDrops;
      lastDrops = drops;
      stats.queueDrops += n;
      handlers.lost?.(n);
    };

    proc.stdout!.on('data', (chunk: Buffer) => {
      if (failure !== undefined) return;
      let batch: NflogEvent[];
      const malformedBefore = parser.stats.malformed;
      try {
        batch = parser.push(chunk);
      } catch (err) {
        failure = err instanceof WeirError ? err : new AuditStreamError(0, String(err));
        proc.kill('SIGTERM');
        return;
      }
      const malformed = parser.stats.malformed - malformedBefore;
      if (malformed > 0) {
        stats.malformed += malformed;
        handlers.malformed?.(malformed);
      }
      if (batch.length > 0) {
        stats.events += batch.length;
        handlers.events(batch);
      }
    });
    proc.stderr!.on('data', (chunk: Buffer) => {
      const before = stderr;
      stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP);
      if (state === 'starting' && child === proc && !before.includes('listening on') && stderr.includes('listening on')) {
        setState('running');
        dropTimer = setInterval(() => void readDrops(), opts.dropPollMs ?? 1000);
        dropTimer.unref();
        log.info({ group: opts.group, pid: proc.pid }, 'audit reader listening on the NFLOG group');
      }
    });

    exited = new Promise<void>((resolve) => {
      let done = false;
      const finish = (code: number | null, signal: NodeJS.Signals | null, spawnError?: Error) => {
        if (done) return;
        done = true;
        clearInterval(dropTimer);
        dropTimer = undefined;
        if (child === proc) child = undefined;
        // tcpdump's own report on exit ("N packets dropped by kernel" counts ENOBUFS, not events).
        const report = /(\d+) packets? captured[\s\S]*?(\d+) packets? dropped by kernel/.exec(stderr);
        if (report) log.info({ group: opts.group, captured: Number(report[1]), enobufs: Number(report[2]) }, 'audit reader: tcpdump reported on exit');
        if (stopping) {
          setState('stopped');
          resolve();
          return;
        }
        const err =
          failure ?? new AuditReaderError(argv, spawnError ? undefined : (code ?? undefined), spawnError ? undefined : (signal ?? undefined), stderr, spawnError ? { cause: spawnError } : undefined);
        attempt = clock.now() - started >= stableMs ? 1 : attempt + 1;
        const delay = backoffMs(attempt, restart);
        log.warn({ err, code: err.code, group: opts.group, retryInMs: delay }, 'audit reader stopped; restarting');
        setState('backoff', err);
        timer = clock.setTimeout(() => {
          timer = undefined;
          if (!stopping) spawnChild();
        }, delay);
        resolve();
      };
      proc.on('error', (e) => finish(null, null, e));
      proc.on('close', (code, signal) => finish(code, signal));
    });
  }

  return {
    start() {
      if (state !== 'stopped' || stopping) return;
      started = 0;
      spawnChild();
    },
    async stop() {
      stopping = true;
      if (timer !== undefined) {
        clock.clearTimeout(timer);
        timer = undefined;
      }
      const proc = child;
      if (proc !== undefined && proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const kill = setTimeout(() => proc.kill('SIGKILL'), opts.killAfterMs ?? 2000);
        await exited;
        clearTimeout(kill);
      } else {
        await exited;
      }
      if (state !== 'stopped') setState('stopped');
      stopping = false;
    },
    get state() {
      return state;
    },
    get pid() {
      return child?.pid;
    },
    stats: () => ({ ...stats }),
  };
}
