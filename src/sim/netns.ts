// Network namespaces for the simulated cluster, the demo and kernel tests. Every namespace
// carries a caller-chosen unique prefix so cleanup removes exactly what we made.

import { execa } from 'execa';
import { randomBytes } from 'node:crypto';
import { CommandError } from '../errors.ts';

/** A unique prefix such as "wt3f9a-": short, because interface names max out at 15 chars. */
export function uniquePrefix(tag: string): string {
  return `${tag}${randomBytes(2).toString('hex')}-`;
}

export async function sh(cmd: string, args: readonly string[], input?: string): Promise<string> {
  const r = await execa(cmd, args, { input, reject: false });
  if (r.exitCode !== 0) throw new CommandError('WEIR_COMMAND_FAILED', cmd, args, r.exitCode, String(r.stderr));
  return String(r.stdout);
}

/** Runs a command inside a namespace. */
export function inNs(ns: string, cmd: string, args: readonly string[], input?: string): Promise<string> {
  return sh('ip', ['netns', 'exec', ns, cmd, ...args], input);
}

export async function createNs(name: string): Promise<void> {
  await sh('ip', ['netns', 'add', name]);
  await inNs(name, 'ip', ['link', 'set', 'lo', 'up']);
}

export async function deleteNs(name: string): Promise<void> {
  await execa('ip', ['netns', 'delete', name], { reject: false });
}

export async function listNs(prefix: string): Promise<string[]> {
  const out = await sh('ip', ['netns', 'list']);
  return out
    .split('\n')
    .map((l) => l.split(' ')[0])
    .filter((n) => n?.startsWith(prefix));
}

/** Deletes every namespace whose name starts with prefix (used on exit and on failure). */
export async function deleteAllNs(prefix: string): Promise<void> {
  for (const n of await listNs(prefix)) await deleteNs(n);
}
