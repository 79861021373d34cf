// The one seam for side effects: every command Weir runs goes through a CommandRunner (the
// iptables/ipset writes and reads, and long-running monitors), so tests can record calls, run
// them in a network namespace, or fake them.

import { Readable } from 'node:stream';

import { execa } from 'execa';
import { CommandError } from '../errors.ts';
import { ForkServer, ForkServerUnavailable, type ForkServerOptions } from './fork-server.ts';

export interface RunOptions {
  /** Written to the command's stdin (restore payloads). An iterable is written a piece at a
   *  time as the command reads it, so a large payload is never one string; it may be iterated
   *  more than once (a recording runner reads it before passing it on). */
  readonly input?: string | Iterable<string>;
}

export interface RunResult {
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number;
}

/**
 * Runs one command, its arguments passed verbatim (no shell interprets them). Resolves with
 * the exit code, whatever it is, so callers can tell a lock timeout from a rejected payload;
 * rejects with a CommandError only when the command could not run to completion (missing
 * binary, hung past the timeout, killed).
 */
export interface CommandRunner {
  run(cmd: string, args: readonly string[], opts?: RunOptions): Promise<RunResult>;
  /** Starts a long-running command whose output is read as it arrives (a monitor); it dies
   *  with this process. */
  spawn(cmd: string, args: readonly string[], opts?: SpawnOptions): RunningCommand;
}

export interface SpawnOptions {
  /** After kill()'s SIGTERM, SIGKILL follows this much later. Default 2 s. */
  readonly killAfterMs?: number;
}

export interface RunningCommand {
  /** Undefined when the command could not be started. */
  readonly pid: number | undefined;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  /** SIGTERM, then SIGKILL if it is still there after killAfterMs. */
  kill(): void;
  /** Resolves once the process has ended, with how ("exited with 1", "killed by SIGTERM"). */
  readonly ended: Promise<string>;
}

/** Long enough for a restore of a few hundred thousand rules, short enough to notice a hang. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;

export interface ProcessRunnerOptions {
  readonly timeoutMs?: number;
  /** Where `run` starts commands: through a fork server (default; see fork-server.ts), or,
   *  with false, from this process. */
  readonly forkServer?: ForkServerOptions | false;
  /** The fork server could not take a command (no shell, no writable directory): that command
   *  and every later one are started from this process. */
  readonly onFallback?: (err: Error) => void;
}

/** Streamed input the fork server takes at most: it writes the input to a file before the
 *  command starts, so more (a first write's members) goes straight to a command started here,
 *  which reads it as it is made. */
export const FORK_SERVER_INPUT_LIMIT = 1 << 20;

/** Runs real commands: `run` through the fork server, so the agent's loop never waits for a
 *  fork of itself; `spawn` (monitors, started once), large streamed input and the fallback with
 *  execa. */
export function processRunner(options: ProcessRunnerOptions = {}): CommandRunner {
  const timeout = options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  let server = options.forkServer === false ? undefined : new ForkServer(options.forkServer);
  return {
    async run(cmd, args, opts) {
      let input = opts?.input;
      const small = server === undefined ? undefined : upTo(input, FORK_SERVER_INPUT_LIMIT);
      if (server !== undefined && small?.whole === true) {
        try {
          const r = await server.run(cmd, args, small.text, timeout);
          if (r.failure === undefined && r.exitCode !== undefined) return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode };
          const code = r.failure?.kind === 'missing' ? 'WEIR_COMMAND_MISSING' : r.failure?.kind === 'timeout' ? 'WEIR_COMMAND_TIMEOUT' : 'WEIR_COMMAND_FAILED';
          throw new CommandError(code, cmd, args, undefined, `${r.stderr}\n${r.failure?.message ?? 'did not run'}`);
        } catch (err) {
          if (err instanceof CommandError) throw err;
          if (!(err instanceof ForkServerUnavailable)) throw new CommandError('WEIR_COMMAND_FAILED', cmd, args, undefined, (err as Error).message);
          server = undefined;
          options.onFallback?.(err);
        }
      }
      if (small !== undefined) input = small.whole ? small.text : small.rest;
      const r = await execa(cmd, args, {
        // Pieces go through a stream: it writes the next only when the pipe takes it.
        input: input === undefined || typeof input === 'string' ? input : Readable.from(input),
        reject: false,
        shell: false,
        timeout,
        stripFinalNewline: false,
        // iptables prints localised messages otherwise, and error parsing needs English.
        env: { LC_ALL: 'C' },
      });
      const stderr = String(r.stderr ?? '');
      if (r.code === 'ENOENT') {
        throw new CommandError('WEIR_COMMAND_MISSING', cmd, args, undefined, stderr);
      }
      if (r.timedOut) {
        // A hung command (a lock nobody releases, a stuck kernel call) must not stall the loop.
        throw new CommandError('WEIR_COMMAND_TIMEOUT', cmd, args, undefined, `${stderr}\ntimed out after ${timeout} ms`);
      }
      if (typeof r.exitCode !== 'number') {
        const why = r.signal ? `killed by ${r.signal}` : (r.originalMessage ?? r.message ?? 'did not run');
        throw new CommandError('WEIR_COMMAND_FAILED', cmd, args, undefined, `${stderr}\n${why}`);
      }
      return { stdout: String(r.stdout ?? ''), stderr, exitCode: r.exitCode };
    },
    spawn(cmd, args, opts) {
      // setpriv execs the command with a parent-death signal: a monitor dies with the agent
      // however the agent ends, instead of being re-parented to init and running on.
      const child = execa('setpriv', ['--pdeathsig', 'KILL', cmd, ...args], { buffer: false, reject: false, stdin: 'ignore', env: { LC_ALL: 'C' }, forceKillAfterDelay: opts?.killAfterMs ?? 2_000 });
      return {
        pid: child.pid,
        stdout: child.stdout,
        stderr: child.stderr,
        kill: () => void child.kill('SIGTERM'),
        ended: child.then((r) => (r.exitCode !== undefined ? `exited with ${r.exitCode}` : r.signal ? `killed by ${r.signal}` : (r.originalMessage ?? r.message ?? 'did not run'))),
      };
    },
  };
}

/** The input as one string when it is at most `limit` characters (`whole`); otherwise what was
 *  taken of it and the rest, as one iterable again. */
function upTo(input: string | Iterable<string> | undefined, limit: number): { whole: true; text: string | undefined } | { whole: false; rest: Iterable<string> } {
  if (input === undefined || typeof input === 'string') return { whole: true, text: input };
  const taken: string[] = [];
  let size = 0;
  const it = input[Symbol.iterator]();
  for (let next = it.next(); !next.done; next = it.next()) {
    taken.push(next.value);
    size += next.value.length;
    if (size > limit) {
      return {
        whole: false,
        rest: (function* () {
          yield* taken.splice(0);
          for (let more = it.next(); !more.done; more = it.next()) yield more.value;
        })(),
      };
    }
  }
  return { whole: true, text: taken.join('') };
}

/** The whole input as one string (undefined for none). */
function inputText(input: string | Iterable<string> | undefined): string | undefined {
  return input === undefined || typeof input === 'string' ? input : [...input].join('');
}

/** Runs every command inside network namespace `ns` via `ip netns exec`. */
export function netnsRunner(ns: string, base: CommandRunner): CommandRunner {
  return {
    async run(cmd, args, opts) {
      const r = await base.run('ip', ['netns', 'exec', ns, cmd, ...args], opts);
      // `ip netns exec` reports a missing binary as its own failure; map it back.
      if (r.exitCode !== 0 && /^exec of "[^"]*" failed: No such file or directory/m.test(r.stderr)) {
        throw new CommandError('WEIR_COMMAND_MISSING', cmd, args, undefined, r.stderr);
      }
      return r;
    },
    // `ip netns exec` execs the command: the pid, its output and kill() are the command's own.
    spawn(cmd, args, opts) {
      return base.spawn('ip', ['netns', 'exec', ns, cmd, ...args], opts);
    },
  };
}

export interface RecordedCall {
  readonly cmd: string;
  readonly args: readonly string[];
  readonly input: string | undefined;
}

export type Responder = (call: RecordedCall) => RunResult | Promise<RunResult>;

export interface RecordingRunner extends CommandRunner {
  /** Every call in order, including ones that failed. */
  readonly calls: RecordedCall[];
}

export const OK: RunResult = { stdout: '', stderr: '', exitCode: 0 };

/**
 * Records every call, then forwards it to a real runner (kernel tests) or answers it with a
 * responder function (unit tests). With no argument every command succeeds with no output.
 */
export function recordingRunner(inner: CommandRunner | Responder = () => OK): RecordingRunner {
  const calls: RecordedCall[] = [];
  return {
    calls,
    async run(cmd, args, opts) {
      const call: RecordedCall = { cmd, args: [...args], input: inputText(opts?.input) };
      calls.push(call);
      return typeof inner === 'function' ? inner(call) : inner.run(cmd, args, opts);
    },
    spawn(cmd, args, opts) {
      calls.push({ cmd, args: [...args], input: undefined });
      return typeof inner === 'function' ? notStarted : inner.spawn(cmd, args, opts);
    },
  };
}

/** What a responder-only recording runner starts: nothing, ended at once. */
const notStarted: RunningCommand = { pid: undefined, stdout: null, stderr: null, kill: () => {}, ended: Promise.resolve('did not run: a recording runner without a real one behind it') };

/** Runs a command and throws a CommandError (with the stderr tail) unless it exits 0. */
export async function runOk(runner: CommandRunner, cmd: string, args: readonly string[], opts?: RunOptions & { readonly code?: 'WEIR_COMMAND_FAILED' | 'WEIR_KERNEL_READ_FAILED' }): Promise<string> {
  const r = await runner.run(cmd, args, opts);
  if (r.exitCode !== 0) {
    throw new CommandError(opts?.code ?? 'WEIR_COMMAND_FAILED', cmd, args, r.exitCode, r.stderr);
  }
  return r.stdout;
}
