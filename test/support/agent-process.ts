// A real `weir agent` process inside a node's network namespace, with its JSON log lines
// parsed as they arrive: tests wait on what the agent says it did.

import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.ts';

/** The log lines of the agent's writes, each carrying the dataplane's status. */
const WRITES = new Set(['applied changes', 'resynced dataplane', 'tidied dataplane']);

const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

export interface LogRecord {
  readonly level?: number;
  readonly msg?: string;
  readonly revision?: string;
  readonly [k: string]: unknown;
}

export class AgentProcess {
  readonly node: string;
  readonly child: ChildProcess;
  /** The revision of the last successful write. */
  revision = '';
  /** What layered writes left for the tidy, as of the last write (0: the rules are final). */
  tidyPending = 0;
  /** Every line seen, and the last 300 kept. */
  lines = 0;
  readonly log: string[] = [];
  readonly errors: string[] = [];
  /** Every line's message, counted from the start (the log keeps only the last 300 lines). */
  readonly #counts = new Map<string, number>();
  readonly #waiters = new Set<{ test: (r: LogRecord, line: string) => boolean; resolve: (r: LogRecord) => void }>();

  /** `weir agent --node-name NODE ARGS`, or with `command` another command of the CLI
   *  (`controller`), run in that node's namespace as on its host network. */
  constructor(node: string, netns: string, args: readonly string[], command: readonly string[] = ['agent', '--node-name', node]) {
    this.node = node;
    // With the image's Node flags, so memory figures are the product's.
    this.child = spawn('ip', ['netns', 'exec', netns, process.execPath, ...NODE_FLAGS, MAIN, ...command, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    createInterface({ input: this.child.stdout! }).on('line', (l) => this.#onLine(l));
    createInterface({ input: this.child.stderr! }).on('line', (l) => this.#onLine(l));
  }

  /** How many lines with this message the agent has written. */
  count(msg: string): number {
    return this.#counts.get(msg) ?? 0;
  }

  get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  /** Resolves with the first record from now on that passes `test`. */
  waitFor(test: (r: LogRecord, line: string) => boolean, timeoutMs: number, what: string): Promise<LogRecord> {
    return new Promise((resolve, reject) => {
      const w = {
        test,
        resolve: (r: LogRecord) => {
          clearTimeout(timer);
          resolve(r);
        },
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(w);
        reject(new Error(`agent on ${this.node}: no log line for "${what}" within ${timeoutMs} ms; last lines:\n${this.log.slice(-8).join('\n')}`));
      }, timeoutMs);
      this.#waiters.add(w);
    });
  }

  /** Resolves once nothing is left for the tidy: Weir's rules hold only the desired state
   *  (on nf_tables a change is first written above the old rules, tidied a second later). */
  async settled(timeoutMs: number): Promise<void> {
    if (this.tidyPending === 0) return;
    await this.waitFor((r) => WRITES.has(r.msg ?? '') && r.tidyPending === 0, timeoutMs, 'nothing left for the tidy');
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const done = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGTERM');
    const force = setTimeout(() => this.child.kill('SIGKILL'), 3000);
    await done;
    clearTimeout(force);
  }

  #onLine(line: string): void {
    this.lines++;
    this.log.push(line);
    if (this.log.length > 300) this.log.shift();
    let rec: LogRecord;
    try {
      rec = JSON.parse(line) as LogRecord;
    } catch {
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
