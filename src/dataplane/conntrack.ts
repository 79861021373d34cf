// The kernel keeps tracking a connection after the pod at one end is gone, and answers by
// the addresses alone: a pod that gets the address next would inherit the flow as
// ESTABLISHED, which every enforcer accepts before policy. So when a local pod gives up an
// address, its entries go, once the write that stops dispatching the address has committed.
// The opt-in cut (agent/connection-cut.ts) lists the entries and deletes single ones.

import { CommandError } from '../errors.ts';
import { type Family, familyOf } from '../model/types.ts';
import { type CommandRunner, runOk } from '../exec/runner.ts';

/** What conntrack -D says on success; it exits 1 when the count is 0. */
const DELETED = /\b(\d+) flow entries have been deleted/;

/**
 * Deletes every entry with `address` as its original source (the pod's own flows) or its reply
 * source (flows to it, also through a Service's DNAT, whose original destination is the
 * Service's address). Resolves with how many entries went; throws a CommandError with
 * conntrack's stderr when it fails.
 */
export async function forgetFlows(runner: CommandRunner, address: string): Promise<number> {
  let deleted = 0;
  for (const match of ['--orig-src', '--reply-src']) {
    const args = ['-D', '-f', familyOf(address) === 6 ? 'ipv6' : 'ipv4', match, address];
    const r = await runner.run('conntrack', args);
    const count = DELETED.exec(r.stderr)?.[1];
    if (count === undefined || r.exitCode !== (count === '0' ? 1 : 0)) throw new CommandError('WEIR_COMMAND_FAILED', 'conntrack', args, r.exitCode, r.stderr);
    deleted += Number(count);
  }
  return deleted;
}

/** One tracked connection of a port protocol: its original tuple (as the first packet had it)
 *  and its reply tuple (the answer's; after a Service's DNAT its source is the real endpoint). */
export interface TrackedFlow {
  readonly family: Family;
  readonly protocol: 'TCP' | 'UDP' | 'SCTP';
  readonly orig: FlowTuple;
  readonly reply: FlowTuple;
}

export interface FlowTuple {
  readonly src: string;
  readonly dst: string;
  readonly sport: number;
  readonly dport: number;
}

const PROTOCOLS: Readonly<Record<string, TrackedFlow['protocol']>> = { tcp: 'TCP', udp: 'UDP', sctp: 'SCTP' };

/** The port-protocol entries of `conntrack -L` output ("tcp 6 431999 ESTABLISHED src=… dst=…
 *  sport=… dport=… src=… … [ASSURED] mark=0 use=1"); other protocols and lines are skipped. */
export function parseFlows(text: string, family: Family): TrackedFlow[] {
  const out: TrackedFlow[] = [];
  for (const line of text.split('\n')) {
    const fields = line.trim().split(/\s+/);
    const protocol = PROTOCOLS[fields[0]];
    if (protocol === undefined) continue;
    const tuples: Record<string, string>[] = [{}, {}];
    for (const f of fields) {
      const eq = f.indexOf('=');
      if (eq <= 0) continue;
      const key = f.slice(0, eq);
      if (key !== 'src' && key !== 'dst' && key !== 'sport' && key !== 'dport') continue;
      const t = tuples[0][key] === undefined ? tuples[0] : tuples[1];
      t[key] ??= f.slice(eq + 1);
    }
    const tuple = (t: Record<string, string>): FlowTuple | undefined => {
      const sport = Number(t.sport);
      const dport = Number(t.dport);
      if (t.src === undefined || t.dst === undefined || !Number.isInteger(sport) || !Number.isInteger(dport)) return undefined;
      return { src: t.src, dst: t.dst, sport, dport };
    };
    const orig = tuple(tuples[0]);
    const reply = tuple(tuples[1]);
    if (orig && reply && familyOf(orig.src) === family) out.push({ family, protocol, orig, reply });
  }
  return out;
}

/** Every tracked connection of a port protocol in one family. */
export async function listFlows(runner: CommandRunner, family: Family): Promise<TrackedFlow[]> {
  const args = ['-L', '-f', family === 6 ? 'ipv6' : 'ipv4'];
  const r = await runner.run('conntrack', args);
  if (r.exitCode !== 0) throw new CommandError('WEIR_COMMAND_FAILED', 'conntrack', args, r.exitCode, r.stderr);
  return parseFlows(r.stdout, family);
}

/** What the policy chains judge a connection by: its original source, and its reply's source
 *  and port (the real endpoint behind a Service's DNAT). Connections with one key are judged
 *  alike. */
export interface ConnectionKey {
  readonly family: Family;
  readonly protocol: TrackedFlow['protocol'];
  readonly src: string;
  readonly dst: string;
  readonly dport: number;
}

export function connectionKey(f: TrackedFlow): ConnectionKey {
  return { family: f.family, protocol: f.protocol, src: f.orig.src, dst: f.reply.src, dport: f.reply.sport };
}

/** Which connections one deletion takes: those of a protocol and family, from `src` if given,
 *  to `dst` if given, and to its port `dport` if given (with `dst`). A key is the narrowest. */
export interface ConnectionFilter {
  readonly family: Family;
  readonly protocol: TrackedFlow['protocol'];
  readonly src?: string;
  readonly dst?: string;
  readonly dport?: number;
}

/** conntrack -D's arguments for a filter: the source as the original's, the destination and
 *  port as the reply's source (so a Service's connections go by their real endpoint). */
export function deletionArgs(f: ConnectionFilter): string[] {
  const args = ['-D', '-f', f.family === 6 ? 'ipv6' : 'ipv4', '-p', f.protocol.toLowerCase()];
  if (f.src !== undefined) args.push('--orig-src', f.src);
  if (f.dst !== undefined) args.push('--reply-src', f.dst);
  if (f.dport !== undefined) args.push('--reply-port-src', String(f.dport));
  return args;
}

/** Deletes the entries of every connection the filter takes (one walk of the table); resolves
 *  with how many went (they may have ended meanwhile). */
export async function deleteConnections(runner: CommandRunner, f: ConnectionFilter): Promise<number> {
  const args = deletionArgs(f);
  const r = await runner.run('conntrack', args);
  const count = DELETED.exec(r.stderr)?.[1];
  if (count === undefined || r.exitCode !== (count === '0' ? 1 : 0)) throw new CommandError('WEIR_COMMAND_FAILED', 'conntrack', args, r.exitCode, r.stderr);
  return Number(count);
}

/** The addresses of the namespace's own interfaces: connections from or to them cross INPUT or
 *  OUTPUT, which Weir does not police, so they are never cut. */
export async function localAddresses(runner: CommandRunner): Promise<Set<string>> {
  const args = ['-o', 'addr', 'show'];
  const out = new Set<string>();
  for (const m of (await runOk(runner, 'ip', args)).matchAll(/\binet6? ([0-9a-f.:]+)\//g)) out.add(m[1]);
  return out;
}
