// Runs commands from a worker thread. Starting a process blocks the thread that starts it until
// the child has exec'd: 2-10 ms each at the agent's size (fork copies its page tables), so the
// five reads of one hook check stalled the event loop for up to 57 ms, and a change that arrived
// meanwhile waited (bench:agent's slowest samples). From a worker, only the worker waits.

import { Worker } from 'node:worker_threads';

/** What the worker answers: the streams and exit code, or why the command did not complete. */
export interface ThreadRunResult {
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number | null;
  /** 'missing' (no such binary), 'timeout' (killed at the deadline) or another failure. */
  readonly failure?: { readonly kind: 'missing' | 'timeout' | 'other'; readonly message: string };
}

interface Request {
  readonly id: number;
  readonly cmd: string;
  readonly args: readonly string[];
  readonly input: string | undefined;
  readonly timeoutMs: number;
}

// CommonJS source with no dependency, so it runs as it is from the bundle (eval: true).
const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { spawn } = require('node:child_process');
parentPort.on('message', ({ id, cmd, args, input, timeoutMs }) => {
  let stdout = '';
  let stderr = '';
  let done = false;
  let timer;
  const finish = (answer) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    parentPort.postMessage({ id, stdout, stderr, exitCode: null, ...answer });
  };
  let child;
  try {
    child = spawn(cmd, args, { env: { ...process.env, LC_ALL: 'C' }, stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (err) {
    finish({ failure: { kind: err.code === 'ENOENT' ? 'missing' : 'other', message: String(err.message) } });
    return;
  }
  timer = setTimeout(() => {
    child.kill('SIGKILL');
    finish({ failure: { kind: 'timeout', message: 'timed out after ' + timeoutMs + ' ms' } });
  }, timeoutMs);
  child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d));
  child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
  child.stdin.on('error', () => {});
  child.stdin.end(input ?? '');
  child.on('error', (err) => finish({ failure: { kind: err.code === 'ENOENT' ? 'missing' : 'other', message: String(err.message) } }));
  child.on('close', (code, signal) => finish(signal ? { failure: { kind: 'other', message: 'killed by ' + signal } } : { exitCode: code }));
});
`;

/** One worker, started at the first command, that never keeps the process alive by itself. */
export class ThreadSpawner {
  #worker: Worker | undefined;
  #nextId = 0;
  readonly #waiting = new Map<number, { resolve: (r: ThreadRunResult) => void; reject: (e: Error) => void }>();

  run(cmd: string, args: readonly string[], input: string | undefined, timeoutMs: number): Promise<ThreadRunResult> {
    const worker = this.#start();
    const id = ++this.#nextId;
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { resolve, reject });
      // Referenced while a command runs, so a process waiting for one stays alive for it.
      worker.ref();
      const request: Request = { id, cmd, args, input, timeoutMs };
      worker.postMessage(request);
    });
  }

  #start(): Worker {
    if (this.#worker !== undefined) return this.#worker;
    const worker = new Worker(WORKER_SOURCE, { eval: true });
    worker.unref();
    worker.on('message', (answer: ThreadRunResult & { id: number }) => {
      const w = this.#waiting.get(answer.id);
      this.#waiting.delete(answer.id);
      if (this.#waiting.size === 0) worker.unref();
      w?.resolve(answer);
    });
    // A worker that died takes its commands with it; the next command starts a new one.
    const fail = (err: Error) => {
      if (this.#worker === worker) this.#worker = undefined;
      for (const w of this.#waiting.values()) w.reject(err);
      this.#waiting.clear();
    };
    worker.on('error', fail);
    worker.on('exit', (code) => fail(new Error(`the command thread exited (${code})`)));
    this.#worker = worker;
    return worker;
  }
}
