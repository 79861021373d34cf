// Starts Weir's commands from a small shell instead of from the agent. Node starts a process
// with fork() on the thread that asks: the kernel copies the page tables of the whole agent,
// longer as the heap grows, while the event loop waits, and every write, read and hook check
// pays it (docs/design/dataplane.md, "Figures behind the choices"). A small shell forks far
// faster and leaves the agent's loop free. The shell reads one line per command; the
// command's stdin, stdout and stderr are files of a private directory, so payloads of any
// size pass without framing, and commands run side by side.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface ForkServerResult {
  readonly stdout: string;
  readonly stderr: string;
  /** The exit code; undefined when the command did not exit by itself (see `failure`). */
  readonly exitCode: number | undefined;
  /** 'missing' (no such command), 'timeout' (killed at the deadline) or 'killed' (by a signal). */
  readonly failure?: { readonly kind: 'missing' | 'timeout' | 'killed'; readonly message: string };
}

/** The server could not be started or given the command (no shell, no writable directory), so
 *  the command did not run: it may be started another way. */
export class ForkServerUnavailable extends Error {}

export interface ForkServerOptions {
  /** Where the private directory of command files is made; default the OS temp directory. */
  readonly dir?: string;
  /** The shell; default `sh`. */
  readonly shell?: string;
}

// Each line is `<id> <quoted command and arguments>`. A job starts the command in the
// background with `exec` (so `$!` is the command's own pid, which a timeout kills), reports it,
// waits, and reports the exit status (128+N for signal N). Lines are shorter than PIPE_BUF, so
// the jobs' reports never interleave inside a line. When the agent goes, stdin closes: the
// shell lets running commands finish and removes the directory.
const SCRIPT = `
while IFS=' ' read -r id argv; do
  {
    eval "exec $argv" <"$WEIR_JOBS/$id.in" >"$WEIR_JOBS/$id.out" 2>"$WEIR_JOBS/$id.err" &
    echo "$id started $!"
    wait $!
    echo "$id exited $?"
  } &
done
wait
rm -rf "$WEIR_JOBS"
`;

interface Job {
  pid?: number;
  settle: (r: ForkServerResult | Error) => void;
}

interface Server {
  readonly child: ChildProcess;
  readonly dir: string;
  readonly jobs: Map<string, Job>;
  /** Commands that timed out before the server said their pid. */
  readonly killOnStart: Set<string>;
  /** Why the server ended, once it did. */
  ended?: Error;
}

/** One shell, started at the first command and again after it died. */
export class ForkServer {
  readonly #options: ForkServerOptions;
  #server: Promise<Server> | undefined;
  /** The server #server resolved to, once it did. */
  #current: Server | undefined;
  #nextId = 0;

  constructor(options: ForkServerOptions = {}) {
    this.#options = options;
  }

  /** Runs one command; rejects with ForkServerUnavailable when the command could not be handed
   *  to a server, and with an Error when the server died while the command ran (or before it
   *  said it had ended: the command may have run, so it must not be run again blindly). */
  async run(cmd: string, args: readonly string[], input: string | undefined, timeoutMs: number): Promise<ForkServerResult> {
    const argv = [cmd, ...args];
    const bad = argv.find((a) => /[\n\0]/.test(a));
    if (bad !== undefined) throw new Error(`an argument holds a newline or NUL, which the command line cannot carry: ${JSON.stringify(bad)}`);
    const server = await this.#start();
    const id = String(++this.#nextId);
    const file = (ext: string) => join(server.dir, `${id}.${ext}`);
    try {
      try {
        await writeFile(file('in'), input ?? '');
      } catch (err) {
        // Nothing ran yet, so the command may still be started another way.
        throw new ForkServerUnavailable(`cannot write the command's input in ${server.dir}: ${(err as Error).message}`);
      }
      if (server.ended !== undefined) throw server.ended;
      const done = await new Promise<ForkServerResult | Error>((resolve) => {
        const timer = setTimeout(() => {
          // Killed now, or as soon as the server says it started.
          if (job.pid !== undefined) kill(job.pid);
          else server.killOnStart.add(id);
          finish(server, id, { stdout: '', stderr: '', exitCode: undefined, failure: { kind: 'timeout', message: `timed out after ${timeoutMs} ms` } });
        }, timeoutMs);
        const job: Job = {
          settle: (r) => {
            clearTimeout(timer);
            resolve(r);
          },
        };
        server.jobs.set(id, job);
        hold(server.child);
        server.child.stdin!.write(`${id} ${argv.map(shellQuote).join(' ')}\n`);
      });
      if (done instanceof Error) throw done;
      if (done.failure !== undefined) return done;
      const [stdout, stderr] = await Promise.all([readFile(file('out'), 'utf8'), readFile(file('err'), 'utf8')]);
      const code = done.exitCode ?? 0;
      // The shell says 127 when exec finds no such command; above 128, a signal ended it.
      if (code === 127 && /not found/.test(stderr)) return { stdout, stderr, exitCode: undefined, failure: { kind: 'missing', message: stderr.trim() } };
      if (code > 128) return { stdout, stderr, exitCode: undefined, failure: { kind: 'killed', message: `killed by signal ${code - 128}` } };
      return { stdout, stderr, exitCode: code };
    } finally {
      await Promise.all(['in', 'out', 'err'].map((ext) => rm(file(ext), { force: true })));
    }
  }

  #start(): Promise<Server> {
    this.#server ??= this.#spawn().catch((err: Error) => {
      this.#server = undefined;
      throw new ForkServerUnavailable(`cannot start the command server: ${err.message}`);
    });
    return this.#server;
  }

  async #spawn(): Promise<Server> {
    const dir = await mkdtemp(join(this.#options.dir ?? tmpdir(), 'weir-commands-'));
    const child = spawn(this.#options.shell ?? 'sh', ['-c', SCRIPT], { env: { ...process.env, LC_ALL: 'C', WEIR_JOBS: dir }, stdio: ['pipe', 'pipe', 'pipe'] });
    try {
      await new Promise<void>((resolve, reject) => {
        child.once('spawn', resolve);
        child.once('error', reject);
      });
    } catch (err) {
      await rm(dir, { recursive: true, force: true });
      throw err;
    }
    const server: Server = { child, dir, jobs: new Map(), killOnStart: new Set() };
    let stderr = '';
    let pending = '';
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr = (stderr + d).slice(-2000)));
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      pending += d;
      for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n')) {
        const [id, what, value] = pending.slice(0, nl).split(' ');
        pending = pending.slice(nl + 1);
        const job = server.jobs.get(id);
        if (what === 'started' && server.killOnStart.delete(id)) kill(Number(value));
        else if (what === 'started' && job !== undefined) job.pid = Number(value);
        else if (what === 'exited') finish(server, id, { stdout: '', stderr: '', exitCode: Number(value) });
      }
    });
    child.stdin!.on('error', () => {}); // a dead server is reported by 'exit'
    child.once('exit', (code, signal) => {
      // The next command starts a new server; this one's commands fail with why it ended.
      if (this.#current === server) {
        this.#current = undefined;
        this.#server = undefined;
      }
      server.ended = new Error(`the command server exited (${signal ?? code})${stderr ? `: ${stderr.trim()}` : ''}`);
      for (const id of [...server.jobs.keys()]) finish(server, id, server.ended);
      void rm(dir, { recursive: true, force: true });
    });
    release(child);
    this.#current = server;
    return server;
  }
}

/** SIGKILL to a command the server started for us; it may have ended meanwhile. */
function kill(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone already
  }
}

function finish(server: Server, id: string, r: ForkServerResult | Error): void {
  const job = server.jobs.get(id);
  if (job === undefined) return;
  server.jobs.delete(id);
  job.settle(r);
  if (server.jobs.size === 0) release(server.child);
}

// Referenced only while a command runs, so the server never keeps the agent alive by itself,
// and a process waiting for a command does not exit under it.
function hold(child: ChildProcess): void {
  child.ref();
  (child.stdout as { ref?: () => void } | null)?.ref?.();
}

function release(child: ChildProcess): void {
  child.unref();
  for (const s of [child.stdin, child.stdout, child.stderr]) (s as { unref?: () => void } | null)?.unref?.();
}

/** One word for the shell: single-quoted, with each quote closed, escaped and reopened. */
export const shellQuote = (word: string): string => `'${word.replaceAll("'", `'\\''`)}'`;
