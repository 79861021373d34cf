// A Weir process a test runs (an agent, a controller, a chart's container), with its JSON log
// lines parsed as they arrive: tests wait on what it says it did, and a wait fails at once,
// with its last lines, when the process exits first.

import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface, type Interface } from 'node:readline';
// Marks every process started from here, so the suite's last file finds any that outlive their test.
import './leftovers.ts';

/** The log lines of the agent's writes, each carrying the dataplane's status. */
const WRITES = new Set(['applied changes', 'resynced dataplane', 'tidied dataplane']);
/** Lines kept for error messages and for tests that read the log. */
const KEEP_LINES = 500;
/** After the process exits, how long its last lines may take to arrive before waits fail. */
const DRAIN_MS = 1_000;

export interface LogRecord {
  readonly level?: number;
  readonly msg?: string;
  readonly revision?: string;
  readonly [k: string]: unknown;
}

export interface ProcessSpec {
  /** Who it is in error messages, e.g. "agent on node-a". */
  readonly label: string;
  readonly command: string;
  readonly args: readonly string[];
  /** In a process group of its own, killed whole when the process exits, as a kubelet ends
   *  every process of a container (the agent's tcpdump, say). */
  readonly ownGroup?: boolean;
  /** Lines that are not JSON (a setup script's, a crash's) count as errors. */
  readonly plainLinesAreErrors?: boolean;
  /** How long stop() waits after SIGTERM before SIGKILL, unless told. */
  readonly graceMs: number;
}

export class LoggedProcess {
  readonly node: string;
  readonly child: ChildProcess;
  /** The revision of the last successful write. */
  revision = '';
  /** What layered writes left for the tidy, as of the last write (0: the rules are final). */
  tidyPending = 0;
  /** Every line seen, and the last KEEP_LINES kept. */
  lines = 0;
  readonly log: string[] = [];
  readonly errors: string[] = [];
  readonly #spec: ProcessSpec;
  /** Every line's message, counted from the start (the log keeps only the last lines). */
  readonly #counts = new Map<string, number>();
  readonly #waiters = new Set<{ test: (r: LogRecord, line: string) => boolean; resolve: (r: LogRecord) => void; fail: (why: string) => void }>();
  /** Set once the process has exited and its output has been read. */
  #ended: string | undefined;

  constructor(node: string, spec: ProcessSpec) {
    this.node = node;
    this.#spec = spec;
    this.child = spawn(spec.command, spec.args, { stdio: ['ignore', 'pipe', 'pipe'], detached: spec.ownGroup ?? false });
    const streams = [this.child.stdout, this.child.stderr].flatMap((s) => (s === null ? [] : [createInterface({ input: s })]));
    for (const rl of streams) rl.on('line', (l) => this.#onLine(l));
    this.child.once('exit', (code, signal) => {
      if (spec.ownGroup) this.#killGroup();
      void drained(streams).then(() => this.#end(`exited (${code ?? signal})`));
    });
  }

  /** How many lines with this message the process has written. */
  count(msg: string): number {
    return this.#counts.get(msg) ?? 0;
  }

  get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  /** Resolves with the first record from now on that passes `test`; rejects when the process
   *  exits first, or after `timeoutMs`. */
  waitFor(test: (r: LogRecord, line: string) => boolean, timeoutMs: number, what: string): Promise<LogRecord> {
    return new Promise((resolve, reject) => {
      const w = {
        test,
        resolve: (r: LogRecord) => {
          clearTimeout(timer);
          resolve(r);
        },
        fail: (why: string) => {
          clearTimeout(timer);
          this.#waiters.delete(w);
          reject(new Error(`${this.#spec.label}: ${why} before "${what}"; last lines:\n${this.log.slice(-12).join('\n')}`));
        },
      };
      const timer = setTimeout(() => w.fail(`no such log line within ${timeoutMs} ms`), timeoutMs);
      if (this.#ended !== undefined) w.fail(this.#ended);
      else this.#waiters.add(w);
    });
  }

  /** Resolves once nothing is left for the tidy: Weir's rules hold only the desired state
   *  (on nf_tables a change is first written above the old rules, tidied a second later). */
  async settled(timeoutMs: number): Promise<void> {
    if (this.tidyPending === 0) return;
    await this.waitFor((r) => WRITES.has(r.msg ?? '') && r.tidyPending === 0, timeoutMs, 'nothing left for the tidy');
  }

  /** Resolves with the exit code (null: killed by a signal) once the process has exited. */
  exitCode(timeoutMs: number): Promise<number | null> {
    if (this.exited) return Promise.resolve(this.child.exitCode);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${this.#spec.label} still running after ${timeoutMs} ms; last lines:\n${this.log.slice(-12).join('\n')}`)), timeoutMs);
      this.child.once('exit', (code) => {
        clearTimeout(timer);
        resolve(code);
      });
    });
  }

  /** SIGKILL, as when the node or the process dies: nothing is released. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const done = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGKILL');
    await done;
  }

  /** SIGTERM, then SIGKILL after the grace period. */
  async stop(graceMs = this.#spec.graceMs): Promise<void> {
    if (this.exited) return;
    const done = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGTERM');
    const force = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await done;
    clearTimeout(force);
  }

  #killGroup(): void {
    try {
      if (this.child.pid !== undefined) process.kill(-this.child.pid, 'SIGKILL');
    } catch {
      // ESRCH: nothing was left.
    }
  }

  #end(why: string): void {
    this.#ended = why;
    for (const w of [...this.#waiters]) w.fail(why);
  }

  #onLine(line: string): void {
    this.lines++;
    this.log.push(line);
    if (this.log.length > KEEP_LINES) this.log.shift();
    let rec: LogRecord;
    try {
      rec = JSON.parse(line) as LogRecord;
    } catch {
      if (this.#spec.plainLinesAreErrors) this.errors.push(line);
      return;
    }
    if ((rec.level ?? 0) >= 50) this.errors.push(line);
    if (typeof rec.msg === 'string') this.#counts.set(rec.msg, this.count(rec.msg) + 1);
    if ((rec.msg === 'applied changes' || rec.msg === 'resynced dataplane') && typeof rec.revision === 'string') this.revision = rec.revision;
    if (WRITES.has(rec.msg ?? '') && typeof rec.tidyPending === 'number') this.tidyPending = rec.tidyPending;
    for (const w of [...this.#waiters]) {
      if (w.test(rec, line)) {
        this.#waiters.delete(w);
        w.resolve(rec);
      }
    }
  }
}

/** Resolves once every stream has closed, or after DRAIN_MS (a child that inherited them may
 *  hold them open). */
function drained(streams: readonly Interface[]): Promise<void> {
  const closed = Promise.all(streams.map((rl) => new Promise<void>((resolve) => rl.once('close', () => resolve()))));
  return new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, DRAIN_MS);
    timer.unref();
    void closed.then(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}
