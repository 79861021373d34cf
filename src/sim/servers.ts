// The pod servers of a simulated cluster (podserver.ts, one per pod and one on the external
// host): started in a namespace and waited for, stopped politely, or killed on exit.

import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { CommandError } from '../errors.ts';

const READY_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 2_000;
// Built output runs podserver.js next to the module that starts it; the sources run podserver.ts.
const SERVER_SCRIPT = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? './podserver.ts' : './podserver.js', import.meta.url));

export interface PodServer {
  readonly child: ChildProcess;
  /** The server's own PID (`ip netns exec` execs in place). */
  readonly pid: number;
  readonly exited: Promise<void>;
}

/** Every server a cluster has running, so that it can stop them all. */
export class PodServers {
  readonly #ports: readonly number[];
  readonly #running = new Set<PodServer>();

  constructor(ports: readonly number[]) {
    this.#ports = ports;
  }

  /** Starts a server answering as `key` inside `netns`; resolves once its control socket
   *  accepts (it opens that last), its output going to the socket's path with .log. */
  async start(key: string, netns: string, socketPath: string): Promise<PodServer> {
    const logPath = socketPath.replace(/\.sock$/, '.log');
    const log = openSync(logPath, 'a');
    const args = ['netns', 'exec', netns, process.execPath, SERVER_SCRIPT, '--name', key, '--ports', this.#ports.join(','), '--control', socketPath];
    const child = spawn('ip', args, { stdio: ['ignore', log, log] });
    closeSync(log);
    let spawnError: Error | undefined;
    child.on('error', (e) => (spawnError = e));
    // Unref'd: a forgotten destroy() must not keep the process alive; the exit cleanup kills it.
    child.unref();
    const exited = new Promise<void>((resolve) => child.once('close', () => resolve()));
    const starting: PodServer = { child, pid: child.pid ?? -1, exited };
    this.#running.add(starting);
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (!(await canConnect(socketPath))) {
      const gone = spawnError !== undefined || child.exitCode !== null || child.signalCode !== null;
      if (gone || Date.now() > deadline) {
        await this.stop(starting);
        const output = await readFile(logPath, 'utf8').catch(() => '');
        const why = spawnError ? `${spawnError.message}\n${output}` : gone ? output : `not ready after ${READY_TIMEOUT_MS} ms\n${output}`;
        throw new CommandError(spawnError ? 'WEIR_COMMAND_MISSING' : 'WEIR_COMMAND_FAILED', 'ip', args, child.exitCode ?? undefined, why);
      }
      await sleep(10);
    }
    return starting;
  }

  /** SIGTERM, SIGKILL if it has not gone after STOP_TIMEOUT_MS; resolves once it has. */
  async stop(server: PodServer): Promise<void> {
    this.#running.delete(server);
    const { child } = server;
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    child.ref(); // waiting for it must keep the process alive
    child.kill('SIGTERM');
    const stopped = await Promise.race([server.exited.then(() => true), sleep(STOP_TIMEOUT_MS, false, { ref: false })]);
    if (!stopped) {
      child.kill('SIGKILL');
      await server.exited;
    }
  }

  stopAll(): Promise<void> {
    return Promise.all([...this.#running].map((s) => this.stop(s))).then(() => undefined);
  }

  /** The exit/signal path: no awaiting possible. */
  killAll(): void {
    for (const s of this.#running) s.child.kill('SIGKILL');
  }
}

function canConnect(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
