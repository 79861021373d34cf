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

/** n UDP datagrams from one socket of a to distinct ports of host: as fast as the socket takes
 *  them, or `perSecond` a second (a batch every 50 ms). */
export const BURST = `
import dgram from 'node:dgram';
const [host, n, first, perSecond] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3]), Number(process.argv[4] ?? 0)];
const batch = perSecond > 0 ? Math.max(1, Math.round(perSecond / 20)) : 500;
const s = dgram.createSocket('udp4');
s.bind(39999, async () => {
  const t = process.hrtime.bigint();
  let failed = 0;
  for (let i = 0; i < n; i += batch) {
    const due = Number(t / 1000000n) + (i / batch) * 50;
    if (perSecond > 0) await new Promise((ok) => setTimeout(ok, Math.max(0, due - Number(process.hrtime.bigint() / 1000000n))));
    await Promise.all(Array.from({ length: Math.min(batch, n - i) }, (_, j) => new Promise((ok) => s.send('x', first + i + j, host, (err) => { if (err) failed++; ok(); }))));
  }
  console.log(JSON.stringify({ seconds: Number(process.hrtime.bigint() - t) / 1e9, failed }));
  s.close();
});
`;

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
