// Two network namespaces joined by a veth pair, the receiving one ("b") logging every new
// connection to an NFLOG group, for the audit reader's kernel test and for recording the
// parser's fixtures. Never the root namespace: the veth is created inside "a".

import { createNs, deleteNs, inNs } from '../../src/sim/netns.ts';

export interface NflogPair {
  readonly a: string;
  readonly b: string;
  readonly a4: string;
  readonly b4: string;
  readonly a6: string;
  readonly b6: string;
  readonly group: number;
  readonly prefix: string;
  delete(): Promise<void>;
}

/** The NFLOG rule of the audit issue: one event per new connection, headers only, no batching. */
export function nflogRule(group: number, prefix: string): string[] {
  return ['-A', 'INPUT', '-m', 'conntrack', '--ctstate', 'NEW', '-j', 'NFLOG', '--nflog-group', String(group), '--nflog-prefix', prefix, '--nflog-size', '128', '--nflog-threshold', '1'];
}

export async function createNflogPair(nsPrefix: string, group: number, prefix = 'weir:AI:test'): Promise<NflogPair> {
  const a = `${nsPrefix}a`;
  const b = `${nsPrefix}b`;
  const pair = { a, b, a4: '10.99.0.1', b4: '10.99.0.2', a6: 'fd99::1', b6: 'fd99::2', group, prefix, delete: async () => Promise.all([deleteNs(a), deleteNs(b)]).then(() => undefined) };
  try {
    await createNs(a);
    await createNs(b);
    await inNs(a, 'ip', ['link', 'add', 'va', 'type', 'veth', 'peer', 'name', 'vb']);
    await inNs(a, 'ip', ['link', 'set', 'vb', 'netns', b]);
    await inNs(a, 'ip', ['addr', 'add', `${pair.a4}/24`, 'dev', 'va']);
    await inNs(b, 'ip', ['addr', 'add', `${pair.b4}/24`, 'dev', 'vb']);
    await inNs(a, 'ip', ['addr', 'add', `${pair.a6}/64`, 'dev', 'va', 'nodad']);
    await inNs(b, 'ip', ['addr', 'add', `${pair.b6}/64`, 'dev', 'vb', 'nodad']);
    await inNs(a, 'ip', ['link', 'set', 'va', 'up']);
    await inNs(b, 'ip', ['link', 'set', 'vb', 'up']);
    await inNs(b, 'iptables', nflogRule(group, prefix));
    await inNs(b, 'ip6tables', nflogRule(group, prefix));
  } catch (err) {
    await pair.delete();
    throw err;
  }
  return pair;
}
