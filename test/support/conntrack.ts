// Probes must measure what a NEW connection gets. A UDP probe from an ephemeral port that
// happens to reuse the 5-tuple of an earlier, allowed probe (conntrack keeps it for 30 s)
// would ride that entry as ESTABLISHED: correct kernel behaviour (Weir keeps existing
// connections), but not what the probe asks. So before a wave, forget the probes' UDP flows
// in every node namespace (only theirs: other tests keep long-lived connections on other ports).

import { execa } from 'execa';
// Marks every process started from here, so the suite's last file finds any that outlive their test.
import './leftovers.ts';
import type { Cluster } from '../../src/sim/cluster.ts';

export async function forgetProbeFlows(cluster: Pick<Cluster, 'nodes' | 'ports'>): Promise<void> {
  await Promise.all(
    cluster.nodes.flatMap((n) =>
      cluster.ports.map((port) =>
        // Exit 1 means "0 flow entries deleted": nothing to forget.
        execa('ip', ['netns', 'exec', n.netns, 'conntrack', '-D', '-p', 'udp', '--orig-port-dst', String(port)], { reject: false }),
      ),
    ),
  );
}

/** How many tracked flows in a namespace have `ip` as their reply source (flows to it). */
export async function flowsTo(netns: string, ip: string): Promise<number> {
  const r = await execa('ip', ['netns', 'exec', netns, 'conntrack', '-L', '-f', ip.includes(':') ? 'ipv6' : 'ipv4', '--reply-src', ip], { reject: false });
  return r.stdout.split('\n').filter((l) => l.trim()).length;
}
