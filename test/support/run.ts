// Running a command to completion from a test, its output kept for the assertions.

import { spawn } from 'node:child_process';
// Marks every process started from here, so the suite's last file finds any that outlive their test.
import './leftovers.ts';

export interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a command to completion; never rejects on a non-zero exit (tests assert on it). */
export function run(command: string, args: readonly string[], opts: { input?: string; env?: NodeJS.ProcessEnv; passStderr?: boolean } = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    // No input: no stdin pipe, so a command that exits at once cannot make the end of it fail.
    const child = spawn(command, args, { stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'], env: opts.env ?? process.env });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (b: Buffer) => out.push(b));
    child.stderr!.on('data', (b: Buffer) => {
      err.push(b);
      if (opts.passStderr) process.stderr.write(b);
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() }));
    if (child.stdin) {
      // A command may exit without reading all its input (EPIPE); its exit status says how it went.
      child.stdin.on('error', (e: NodeJS.ErrnoException) => {
        if (e.code !== 'EPIPE') reject(e);
      });
      child.stdin.end(opts.input);
    }
  });
}

/** The command's stdout; throws with its output if it failed. */
export function ok(what: string, r: Run): string {
  if (r.code !== 0) throw new Error(`${what} exited ${r.code}:\n${r.stderr}${r.stdout}`);
  return r.stdout;
}
