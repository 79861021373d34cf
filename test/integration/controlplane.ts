// A real Kubernetes control plane (etcd + kube-apiserver built from source, see
// scripts/control-plane.sh) for integration tests. It has no controller manager, scheduler or
// kubelet: objects are stored and served, and nothing else acts on them.
//
// Only the processes started here are ever killed, by the PIDs the script recorded, and only
// while their start time is still the one recorded with them (a reused PID has another).

import { spawn } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CommandError } from '../../src/errors.ts';

const SCRIPT = fileURLToPath(new URL('../../scripts/control-plane.sh', import.meta.url));

export interface ControlPlane {
  /** Holds the kubeconfig, certificates, etcd data and both processes' logs. */
  readonly dir: string;
  /** Admin kubeconfig (group system:masters), written by the script. */
  readonly kubeconfig: string;
  /** https://127.0.0.1:PORT */
  readonly server: string;
  /** The admin's bearer token. */
  readonly token: string;
  /** Milliseconds `start` took (the build excluded). */
  readonly startMs: number;
  /** Runs the built kubectl against this control plane; resolves to its stdout. */
  kubectl(args: readonly string[], input?: string): Promise<string>;
  /** Stops kube-apiserver alone and starts it again on the same port and etcd. */
  restartApiServer(): Promise<void>;
  /** Compacts etcd's history up to now (through its HTTP gateway): watches resuming from an
   *  older resourceVersion then get 410 Gone. Returns the revision compacted to. */
  compactEtcd(): Promise<number>;
  /** Kills etcd and kube-apiserver and removes the directory. */
  stop(): Promise<void>;
}

/** Runs a command to completion and resolves to its stdout; rejects with a CommandError naming it. */
function run(command: string, args: readonly string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    child.on('error', (e) => reject(new CommandError('WEIR_COMMAND_MISSING', command, args, undefined, '', { cause: e })));
    child.on('close', (code) => {
      const stdout = Buffer.concat(out).toString();
      const stderr = Buffer.concat(err).toString();
      if (code === 0) resolve(stdout);
      else reject(new CommandError('WEIR_COMMAND_FAILED', command, args, code ?? undefined, stderr));
    });
    // A command may exit without reading its input (EPIPE); its exit status says how it went.
    child.stdin.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code !== 'EPIPE') reject(e);
    });
    child.stdin.end(input ?? '');
  });
}

/** What of the script's stderr a failure keeps: its last lines name the daemon's own. */
const STDERR_KEPT = 64 * 1024;

/** Runs the script; its progress lines (a build can take minutes) go straight to our stderr,
 *  and a failure rejects with them too (the last ones are the failed daemon's own log lines),
 *  so they reach the test report even where a runner drops a child's stderr. */
function script(args: readonly string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(SCRIPT, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let err = '';
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => {
      process.stderr.write(b);
      err = (err + b.toString()).slice(-STDERR_KEPT);
    });
    child.on('error', (e) => reject(new CommandError('WEIR_COMMAND_MISSING', SCRIPT, args, undefined, '', { cause: e })));
    child.on('close', (code) => {
      if (code === 0) resolve(Buffer.concat(out).toString().trim());
      else reject(new CommandError('WEIR_COMMAND_FAILED', SCRIPT, args, code ?? undefined, err));
    });
  });
}

/** Reads DIR/pids ("name pid starttime" lines). */
function readPids(dir: string): { pid: number; start: string }[] {
  let text: string;
  try {
    text = readFileSync(join(dir, 'pids'), 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .map((line) => line.trim().split(/\s+/))
    .map(([, pid, start]) => ({ pid: Number(pid), start: start ?? '' }))
    .filter((p) => Number.isInteger(p.pid) && p.pid > 0 && p.start !== '');
}

/** Start time (field 22 of /proc/PID/stat) of a live process; null for none or a zombie. */
function startTime(pid: number): string | null {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  // Fields after "(comm) ": state is the first, starttime the twentieth.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return fields[0] === 'Z' || fields[0] === 'X' ? null : (fields[19] ?? null);
}

/** The last resort when the test process exits without stop(): same ownership check as the script. */
function abandonSync(dir: string): void {
  killOwnedSync(dir);
  if (!process.env.WEIR_KEEP_CONTROLPLANE) rmSync(dir, { recursive: true, force: true });
}

function killOwnedSync(dir: string): void {
  for (const { pid, start } of readPids(dir)) {
    if (startTime(pid) !== start) continue;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
}

/** Builds kubectl and kube-apiserver unless already cached; resolves to their directory. */
export function buildControlPlane(): Promise<string> {
  return script(['build']);
}

export async function startControlPlane(): Promise<ControlPlane> {
  const bin = await buildControlPlane();
  const kubectlBin = join(bin, 'kubectl');
  const dir = await mkdtemp(join(tmpdir(), 'weir-controlplane-'));
  // stop() is the normal path; these cover a test process that exits or is killed first.
  const onExit = (): void => abandonSync(dir);
  const onSignal = (signal: NodeJS.Signals): void => {
    abandonSync(dir);
    process.off(signal, onSignal);
    process.kill(process.pid, signal);
  };
  process.on('exit', onExit);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  let stopped = false;

  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    try {
      await script(['stop', dir]);
    } finally {
      process.off('exit', onExit);
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      // WEIR_KEEP_CONTROLPLANE=1 keeps the logs and etcd data for a post-mortem.
      if (process.env.WEIR_KEEP_CONTROLPLANE) process.stderr.write(`control plane kept in ${dir}\n`);
      else await rm(dir, { recursive: true, force: true });
    }
  };

  try {
    const began = performance.now();
    await script(['start', dir]);
    const startMs = performance.now() - began;
    const kubeconfig = join(dir, 'kubeconfig');
    const token = (await readFile(join(dir, 'token'), 'utf8')).trim();
    const ports = await readFile(join(dir, 'ports.env'), 'utf8');
    const port = /^apiserver_port=(\d+)$/m.exec(ports)?.[1];
    if (port === undefined) throw new Error(`no apiserver_port in ${join(dir, 'ports.env')}`);
    return {
      dir,
      kubeconfig,
      server: `https://127.0.0.1:${port}`,
      token,
      startMs,
      kubectl: (args, input) => run(kubectlBin, ['--kubeconfig', kubeconfig, ...args], input),
      restartApiServer: async () => {
        await script(['restart-apiserver', dir]);
      },
      compactEtcd: async () => {
        const etcdPort = /^etcd_client_port=(\d+)$/m.exec(ports)?.[1];
        const post = async (path: string, body: unknown) => {
          const r = await fetch(`http://127.0.0.1:${etcdPort}${path}`, { method: 'POST', body: JSON.stringify(body) });
          if (!r.ok) throw new Error(`etcd ${path}: ${r.status} ${await r.text()}`);
          return (await r.json()) as { header: { revision: string } };
        };
        const revision = Number((await post('/v3/kv/range', { key: Buffer.from('/').toString('base64') })).header.revision);
        await post('/v3/kv/compaction', { revision, physical: true });
        return revision;
      },
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}
