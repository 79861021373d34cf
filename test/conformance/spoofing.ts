// Tools of the spoofing scenarios: UDP sent from inside a pod with a chosen source address (and
// port), and a count of what reached a target, taken by a rule in the target's own namespace.

import { inNs } from '../../src/sim/netns.ts';
import type { Conformance } from './harness.ts';

/** Counts UDP datagrams that reach a namespace's own INPUT from `source` to `port`, through a
 *  counting rule `watchArrivals` put there: the observer sees packets whatever their replies do. */
export async function countArrivals(netns: string, source: string, port: number): Promise<number> {
  const out = await inNs(netns, 'iptables', ['-w', '-L', 'INPUT', '-v', '-x', '-n']);
  let total = 0;
  for (const line of out.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length >= 8 && f[2] === 'ACCEPT' && (f[3] === 'udp' || f[3] === '17') && f[7] === source && line.includes(`dpt:${port}`)) total += Number(f[0]);
  }
  return total;
}

const watchRule = (source: string, port: number) => ['INPUT', '-s', source, '-p', 'udp', '--dport', String(port), '-j', 'ACCEPT'];
export const watchArrivals = (netns: string, source: string, port: number) => inNs(netns, 'iptables', ['-w', '-I', ...watchRule(source, port)]);
export const unwatchArrivals = (netns: string, source: string, port: number) =>
  inNs(netns, 'iptables', ['-w', '-D', ...watchRule(source, port)]).then(
    () => undefined,
    () => undefined,
  );

/**
 * Sends `n` UDP datagrams from inside `netns`, with source address `from` (and source port
 * `fromPort`, or any). With `awaitReply`, it waits for one datagram back (at most 2 s) and fails
 * without one: the flow is then ESTABLISHED in every conntrack on its path.
 */
export async function sendUdp(netns: string, from: string, to: string, port: number, n: number, opts: { fromPort?: number; awaitReply?: boolean } = {}): Promise<void> {
  const bind = JSON.stringify({ address: from, port: opts.fromPort ?? 0 });
  const done = opts.awaitReply
    ? `s.on('message',()=>{s.close();process.exit(0)});setTimeout(()=>{console.error('no reply from ${to}:${port}');process.exit(1)},2000);`
    : 'setTimeout(()=>s.close(),50);';
  const script = `const s=require('node:dgram').createSocket('udp4');s.bind(${bind},()=>{let i=0;const t=setInterval(()=>{s.send('spoof',${port},${JSON.stringify(to)});if(++i>=${n}){clearInterval(t);${done}}},20);});`;
  await inNs(netns, process.execPath, ['-e', script]);
}

/**
 * `victim` (a local pod) opens a UDP flow to each target's pod server and gets its reply; then
 * `spoofer`, a pod on the same node holding the victim's address beside its own (a pod with
 * NET_ADMIN could), sends into that flow: same addresses, same ports, so conntrack calls its
 * packets ESTABLISHED. Resolves with, per target, the datagrams that arrived from the victim's
 * address after the first: the spoofed ones that got through.
 */
export async function spoofIntoEstablishedFlow(c: Conformance, victim: string, spoofer: string, targets: readonly string[]): Promise<Map<string, number>> {
  const PORT = 80;
  const SOURCE_PORT = 40123;
  const v = c.cluster.endpoint(victim)!;
  const s = c.cluster.endpoint(spoofer)!;
  const vip = v.ips.find((ip) => !ip.includes(':'))!;
  const ends = targets.map((k) => c.cluster.endpoint(k)!);
  const through = new Map<string, number>();
  for (const t of ends) await watchArrivals(t.netns, vip, PORT);
  await inNs(s.netns, 'ip', ['addr', 'add', `${vip}/32`, 'dev', 'eth0']);
  try {
    for (const t of ends) {
      const to = t.ips.find((ip) => !ip.includes(':'))!;
      await sendUdp(v.netns, vip, to, PORT, 1, { fromPort: SOURCE_PORT, awaitReply: true });
      await sendUdp(s.netns, vip, to, PORT, 5, { fromPort: SOURCE_PORT });
      await new Promise((r) => setTimeout(r, 200));
      through.set(t.key, (await countArrivals(t.netns, vip, PORT)) - 1);
    }
  } finally {
    await inNs(s.netns, 'ip', ['addr', 'del', `${vip}/32`, 'dev', 'eth0']).catch(() => undefined);
    for (const t of ends) await unwatchArrivals(t.netns, vip, PORT);
  }
  return through;
}
