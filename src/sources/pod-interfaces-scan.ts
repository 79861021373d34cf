// Where each local pod's address really lives, learned from the node's kernel: the bridge
// port (host end of the pod's veth) whose peer interface carries that address inside the
// pod's network namespace.
//
// The container runtime pins every pod sandbox's network namespace under /var/run/netns
// (containerd and CRI-O both do), so the namespace behind a bridge port is found by its
// netns id, and its addresses are read from inside it (`nsenter --net`, which needs
// CAP_SYS_ADMIN but, unlike `ip -n`, no mount of its own).
// Only the pod's own interface counts: addresses the runtime configured, not ones a packet
// claims, so ARP or neighbour-table poisoning cannot move a binding.

import type { CommandRunner } from '../exec/runner.ts';
import type { Logger } from '../log.ts';
import { canonicalIp } from '../model/cidr.ts';

/** Where the runtime pins pod network namespaces (iproute2's NETNS_RUN_DIR). */
const NETNS_DIR = '/var/run/netns';

/** Address -> bridge port name. */
export type PortBindings = ReadonlyMap<string, string>;

export interface PodInterfaceScanner {
  scan(): Promise<PortBindings>;
}

interface BridgePort {
  readonly ifname: string;
  readonly ifindex: number;
  /** The peer interface's index inside its namespace. */
  readonly peerIndex: number;
  readonly nsid: number;
}

/** How long after a port's addresses were first found they are read again at every scan: the
 *  runtime gives a dual-stack pod its addresses one family at a time, and a scan between the
 *  two would otherwise bind the first one for the pod's life. */
export const ADDRESSES_SETTLE_MS = 5_000;

/** Reads the pod bridge's ports, their peers' namespaces and the peers' global addresses. */
export function createPodInterfaceScanner(runner: CommandRunner, bridge: string, log: Logger, now: () => number = () => performance.now()): PodInterfaceScanner {
  // A pod keeps its addresses for its life: cache them per (namespace, peer, port), once found
  // and settled.
  let cache = new Map<string, { readonly ips: readonly string[]; readonly since: number }>();
  let warnedNoBridge = false;
  // Scans repeat soon while a pod is unbound: each problem is said once while it lasts.
  let said = new Set<string>();
  let saying = new Set<string>();
  const warnOnce = (key: string, fields: object, msg: string) => {
    saying.add(key);
    if (!said.has(key)) log.warn(fields, msg);
  };

  const json = async (cmd: string, args: string[]): Promise<unknown> => {
    const r = await runner.run(cmd, args);
    if (r.exitCode !== 0) throw new Error(`${cmd} ${args.join(' ')} exited with ${r.exitCode}: ${r.stderr.trim()}`);
    return r.stdout.trim() === '' ? [] : JSON.parse(r.stdout);
  };

  return {
    async scan() {
      const out = new Map<string, string>();
      saying = new Set();
      const links = await runner.run('ip', ['-j', '-d', 'link', 'show', 'master', bridge]);
      if (links.exitCode !== 0) {
        // No bridge yet (no pod ever started on this node): nothing is bound.
        if (!warnedNoBridge) log.warn({ bridge, stderr: links.stderr.trim() }, `pod bridge ${bridge} not found: no local pod can send until it exists`);
        warnedNoBridge = true;
        return out;
      }
      warnedNoBridge = false;
      const ports = (JSON.parse(links.stdout || '[]') as Record<string, unknown>[]).flatMap((l): BridgePort[] =>
        typeof l.ifname === 'string' && typeof l.ifindex === 'number' && typeof l.link_index === 'number' && typeof l.link_netnsid === 'number'
          ? [{ ifname: l.ifname, ifindex: l.ifindex, peerIndex: l.link_index, nsid: l.link_netnsid }]
          : [],
      );
      if (ports.length === 0) return out;
      const names = new Map<number, string>();
      for (const e of (await json('ip', ['-j', 'netns', 'list-id'])) as { nsid?: number; name?: string }[]) {
        if (typeof e.nsid === 'number' && typeof e.name === 'string') names.set(e.nsid, e.name);
      }
      const next = new Map<string, { readonly ips: readonly string[]; readonly since: number }>();
      const claims = new Map<string, string[]>();
      await Promise.all(
        ports.map(async (p) => {
          const ns = names.get(p.nsid);
          if (ns === undefined) {
            warnOnce(
              `unpinned ${p.ifname}`,
              { port: p.ifname, dir: NETNS_DIR },
              `the namespace behind pod bridge port ${p.ifname} is not pinned under ${NETNS_DIR} (is it mounted?): its pod cannot send`,
            );
            return;
          }
          const key = `${ns}/${p.peerIndex}/${p.ifindex}/${p.ifname}`;
          const cached = cache.get(key);
          let ips = cached?.ips;
          if (cached === undefined || now() - cached.since < ADDRESSES_SETTLE_MS) {
            try {
              ips = addressesOf((await json('nsenter', [`--net=${NETNS_DIR}/${ns}`, 'ip', '-j', 'addr', 'show'])) as AddrLink[], p.peerIndex);
            } catch (err) {
              warnOnce(`read ${key}`, { port: p.ifname, netns: ns, err: (err as Error).message }, 'cannot read the addresses of a pod interface: its pod cannot send');
              return;
            }
          }
          if (ips === undefined) return;
          // A port read before its pod's addresses were given (the runtime attaches the port,
          // then configures the pod: a link event's scan can fall in between) is read again,
          // and so is one found in its first seconds (see ADDRESSES_SETTLE_MS).
          if (ips.length > 0) next.set(key, { ips, since: cached?.since ?? now() });
          for (const ip of ips) {
            const c = claims.get(ip);
            if (c) c.push(p.ifname);
            else claims.set(ip, [p.ifname]);
          }
        }),
      );
      cache = next;
      for (const [ip, claimants] of claims) {
        // Two interfaces holding one address: bind it to neither (its pod cannot send) rather
        // than let one of them speak for the other.
        if (claimants.length === 1) out.set(ip, claimants[0]);
        else warnOnce(`claim ${ip} ${claimants.sort().join()}`, { ip, ports: claimants }, 'one address on several pod interfaces: bound to none');
      }
      said = saying;
      return out;
    },
  };
}

interface AddrLink {
  ifindex?: number;
  addr_info?: { family?: string; local?: string; scope?: string }[];
}

function addressesOf(links: readonly AddrLink[], ifindex: number): string[] {
  const link = links.find((l) => l.ifindex === ifindex);
  const out: string[] = [];
  for (const a of link?.addr_info ?? []) {
    if (a.scope !== 'global' || typeof a.local !== 'string') continue;
    const ip = canonicalIp(a.local);
    if (ip !== null) out.push(ip);
  }
  return out;
}
