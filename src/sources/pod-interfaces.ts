// Where each local pod's address really lives, learned from the node's kernel: the bridge
// port (host end of the pod's veth) whose peer interface carries that address inside the
// pod's network namespace. Calc binds each pod's source address to its port, so a pod cannot
// send with another pod's address, and a pod whose port is not known yet cannot send at all.
//
// The container runtime pins every pod sandbox's network namespace under /var/run/netns
// (containerd and CRI-O both do), so the namespace behind a bridge port is found by its
// netns id, and its addresses are read from inside it (`nsenter --net`, which needs
// CAP_SYS_ADMIN but, unlike `ip -n`, no mount of its own).
// Only the pod's own interface counts: addresses the runtime configured, not ones a packet
// claims, so ARP or neighbour-table poisoning cannot move a binding.

import { backoffMs } from '../backoff.ts';
import type { CommandRunner } from '../dataplane/runner.ts';
import type { Logger } from '../log.ts';
import { canonicalIp } from '../model/cidr.ts';
import type { CalcEvent, ModelEvent, PodInterfaceEvent } from '../model/types.ts';
import type { Source, SourceBatch } from './types.ts';

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

/** Reads the pod bridge's ports, their peers' namespaces and the peers' global addresses. */
export function createPodInterfaceScanner(runner: CommandRunner, bridge: string, log: Logger): PodInterfaceScanner {
  // A pod keeps its addresses for its life: cache them per (namespace, peer, port).
  let cache = new Map<string, readonly string[]>();
  let warnedNoBridge = false;
  // Scans repeat every 100 ms while a pod is unbound: each problem is said once while it lasts.
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
      const next = new Map<string, readonly string[]>();
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
          let ips = cache.get(key);
          if (ips === undefined) {
            try {
              ips = addressesOf((await json('nsenter', [`--net=${NETNS_DIR}/${ns}`, 'ip', '-j', 'addr', 'show'])) as AddrLink[], p.peerIndex);
            } catch (err) {
              warnOnce(`read ${key}`, { port: p.ifname, netns: ns, err: (err as Error).message }, 'cannot read the addresses of a pod interface: its pod cannot send');
              return;
            }
          }
          next.set(key, ips);
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

export interface PodInterfaceOptions {
  readonly nodeName: string;
  readonly scanner: PodInterfaceScanner;
  readonly log: Logger;
  /** Rescan period while every local pod is bound (ports of re-created sandboxes). */
  readonly rescanMs: number;
  /** First rescan delay while some local pod address has no port yet; it doubles up to
   *  rescanMs while the address stays unbound (a namespace that cannot be read, say), so a
   *  lasting problem costs no more than the ordinary rescans. */
  readonly unboundRescanMs: number;
}

/**
 * Wraps a cluster source: every batch that brings a local pod address not bound yet waits for
 * a scan and carries the binding changes with it, so a new pod is enforced and can send in the
 * same write. Periodic rescans deliver binding changes on their own.
 */
export function withPodInterfaces(inner: Source, o: PodInterfaceOptions): Source<CalcEvent> {
  const localIps = new Map<string, readonly string[]>(); // pod uid -> addresses
  let bound = new Map<string, string>();
  let chain: Promise<void> = Promise.resolve();
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  /** The last batch handed on: a rescan's own batch repeats its state. */
  let delivered: { synced: boolean; revision: string } | undefined;
  let syncedSeen = false;
  let deliver: (b: SourceBatch<CalcEvent>) => void = () => {};
  /** Rescans in a row that left some address unbound. */
  let unboundScans = 0;

  const unbound = () => {
    for (const ips of localIps.values()) for (const ip of ips) if (!bound.has(ip)) return true;
    return false;
  };

  const rescan = async (): Promise<PodInterfaceEvent[]> => {
    let found: PortBindings;
    try {
      found = await o.scanner.scan();
    } catch (err) {
      o.log.warn({ err: (err as Error).message }, 'pod interface scan failed; pods keep their last bindings');
      return [];
    }
    const events: PodInterfaceEvent[] = [];
    for (const [ip, port] of found) if (bound.get(ip) !== port) events.push({ kind: 'PodInterface', op: 'upsert', object: { ip, port } });
    for (const ip of bound.keys()) if (!found.has(ip)) events.push({ kind: 'PodInterface', op: 'delete', ip });
    bound = new Map(found);
    return events;
  };

  const nextDelay = (): number => {
    if (!unbound()) {
      unboundScans = 0;
      return o.rescanMs;
    }
    return backoffMs(++unboundScans, { initialMs: o.unboundRescanMs, maxMs: o.rescanMs });
  };

  const arm = () => {
    if (stopped) return;
    clearTimeout(timer);
    timer = setTimeout(() => {
      chain = chain.then(async () => {
        const events = await rescan();
        if (events.length > 0 && delivered && !stopped) deliver({ events, ...delivered });
        arm();
      });
    }, nextDelay());
    timer.unref?.();
  };

  const track = (events: readonly ModelEvent[]): boolean => {
    let fresh = false;
    for (const e of events) {
      if (e.kind !== 'Pod') continue;
      if (e.op === 'delete') {
        localIps.delete(e.uid);
        continue;
      }
      if (e.object.nodeName !== o.nodeName || e.object.hostNetwork) {
        localIps.delete(e.object.uid);
        continue;
      }
      // An address new to this pod needs a scan even if it is bound: a re-created pod may
      // reuse an address whose old port the periodic rescan has not seen go yet.
      const before = localIps.get(e.object.uid) ?? [];
      localIps.set(e.object.uid, e.object.ips);
      if (e.object.ips.some((ip) => !bound.has(ip) || !before.includes(ip))) fresh = true;
    }
    return fresh;
  };

  return {
    start(onBatch) {
      deliver = onBatch;
      return inner.start((batch) => {
        const firstSync = batch.synced && !syncedSeen;
        syncedSeen ||= batch.synced;
        const fresh = track(batch.events);
        if (fresh) unboundScans = 0; // a new address: look again soon
        chain = chain.then(async () => {
          if (stopped) return;
          const extra = fresh || firstSync ? await rescan() : [];
          delivered = { synced: batch.synced, revision: batch.revision };
          deliver(extra.length > 0 ? { ...batch, events: [...batch.events, ...extra] } : batch);
          arm();
        });
      });
    },
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await inner.stop();
      await chain;
    },
  };
}
