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
//
// Scans follow link events: one long-lived `ip -o monitor link` in the scans' namespace tells
// of every port coming, going, joining the bridge or changing carrier, and a scan follows
// within a debounce. An idle node spawns nothing but a slow safety rescan; while the monitor
// is down (it cannot start, or died) scans poll as before, and it is restarted with backoff.

import { type Backoff, backoffMs } from '../backoff.ts';
import type { CommandRunner } from '../exec/runner.ts';
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
/** How long after a port's addresses were first found they are read again at every scan: the
 *  runtime gives a dual-stack pod its addresses one family at a time, and a scan between the
 *  two would otherwise bind the first one for the pod's life. */
export const ADDRESSES_SETTLE_MS = 5_000;

export function createPodInterfaceScanner(runner: CommandRunner, bridge: string, log: Logger, now: () => number = () => performance.now()): PodInterfaceScanner {
  // A pod keeps its addresses for its life: cache them per (namespace, peer, port), once found
  // and settled.
  let cache = new Map<string, { readonly ips: readonly string[]; readonly since: number }>();
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

/** What a link monitor tells withPodInterfaces. */
export interface LinkMonitorHandlers {
  /** The monitor listens: every link change from now on is told. */
  ready(): void;
  /** One or more links changed (or changes may have been lost): scan again. */
  change(): void;
  /** The monitor ended or could not start. Called at most once, never after close(). */
  exit(reason: string): void;
}

export interface LinkMonitorStream {
  /** Ends the monitor and waits until its process is gone. */
  close(): Promise<void>;
}

/** Starts one watcher of the links in the scans' network namespace per open(); restarts are
 *  the caller's (withPodInterfaces). */
export interface LinkMonitor {
  open(handlers: LinkMonitorHandlers): LinkMonitorStream;
}

const STDERR_KEEP = 2048;

/**
 * `ip -o monitor link`, started through `runner` so it watches the namespace the scans read
 * (`netnsRunner` wraps it in `ip netns exec`, which execs, so close() ends ip itself). A line on
 * stderr (`netlink receive error`: the socket overran) means events were lost: it counts as a
 * change.
 */
export function createLinkMonitor(runner: CommandRunner, opts: { readonly killAfterMs?: number } = {}): LinkMonitor {
  const args = ['-o', 'monitor', 'link'];
  return {
    open(h) {
      let closed = false;
      const child = runner.spawn('ip', args, { killAfterMs: opts.killAfterMs });
      let stderr = '';
      // A pid means the process runs; ip subscribes to link events right after it starts, and
      // the scan that ready() asks for comes a debounce later.
      if (child.pid !== undefined) queueMicrotask(() => !closed && h.ready());
      child.stdout?.on('data', () => {
        if (!closed) h.change();
      });
      child.stderr?.on('data', (chunk: Buffer) => {
        stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP);
        if (!closed) h.change();
      });
      const ended = child.ended.then((why) => {
        if (!closed) h.exit(`ip ${args.join(' ')} ${why}${stderr.trim() === '' ? '' : `: ${stderr.trim().split('\n').at(-1)}`}`);
        closed = true;
      });
      return {
        async close() {
          closed = true;
          child.kill();
          await ended;
        },
      };
    },
  };
}

export interface PodInterfaceOptions {
  readonly nodeName: string;
  readonly scanner: PodInterfaceScanner;
  readonly log: Logger;
  /** Rescan period while every local pod is bound and no link monitor runs (ports of
   *  re-created sandboxes): polling. */
  readonly rescanMs: number;
  /** First rescan delay while some local pod address has no port yet; it doubles up to
   *  rescanMs while the address stays unbound (a namespace that cannot be read, say), so a
   *  lasting problem costs no more than the ordinary rescans. The link monitor does not end
   *  these: an address given inside a pod's namespace is no link event of the node's. */
  readonly unboundRescanMs: number;
  /** Link events: a scan follows each burst. Without it scans poll every rescanMs. */
  readonly monitor?: LinkMonitor;
  /** Rescan period while the monitor runs, in case it missed something. Default 30 s. */
  readonly safetyRescanMs?: number;
  /** How long a scan waits after a link event, so a burst (port added, joins the bridge,
   *  carrier up) is one scan. Default 30 ms. */
  readonly debounceMs?: number;
  /** Restarts of a monitor that died or could not start. Default 1 s doubling to 30 s. */
  readonly monitorRestart?: Backoff;
  /** A monitor that ran this long before it died starts the backoff over, and its death is
   *  warned about again. Default 60 s. */
  readonly monitorStableMs?: number;
}

/**
 * Wraps a cluster source: every batch that brings a local pod address not bound yet waits for
 * a scan and carries the binding changes with it, so a new pod is enforced and can send in the
 * same write. Rescans after link events (o.monitor), periodic ones and the unbound backoff
 * deliver binding changes on their own.
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
  const safetyRescanMs = o.safetyRescanMs ?? 30_000;
  const debounceMs = o.debounceMs ?? 30;
  const restart = o.monitorRestart ?? { initialMs: 1_000, maxMs: 30_000 };
  const stableMs = o.monitorStableMs ?? 60_000;
  /** The running monitor's stream; monitorUp once it listens. */
  let stream: LinkMonitorStream | undefined;
  let monitorUp = false;
  let restartTimer: NodeJS.Timeout | undefined;
  let restarts = 0;
  /** The monitor is down and that was warned about (once per outage). */
  let warned = false;
  /** A link event no scan has started since. */
  let changed = false;
  /** The pending timer is a link event's (a scan is due within the debounce). */
  let soon = false;

  const unbound = () => {
    for (const ips of localIps.values()) for (const ip of ips) if (!bound.has(ip)) return true;
    return false;
  };

  const rescan = async (): Promise<PodInterfaceEvent[]> => {
    let found: PortBindings;
    changed = false; // this scan reads the kernel after every event told so far
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
    const periodic = monitorUp ? safetyRescanMs : o.rescanMs;
    if (!unbound()) {
      unboundScans = 0;
      return periodic;
    }
    return Math.min(periodic, backoffMs(++unboundScans, { initialMs: o.unboundRescanMs, maxMs: o.rescanMs }));
  };

  /** Sets the one timer: a scan after `ms`; `event`: a link event's, which no later arm() pushes
   *  back. Nothing before the first batch is delivered (a scan's changes need its revision). */
  const setTimer = (ms: number, event: boolean) => {
    if (stopped || !delivered) return;
    clearTimeout(timer);
    soon = event;
    timer = setTimeout(() => {
      soon = false;
      chain = chain.then(async () => {
        if (stopped) return;
        // A link event that a scan since has covered needs none of its own.
        if (!event || changed) {
          const events = await rescan();
          if (events.length > 0 && delivered && !stopped) deliver({ events, ...delivered });
        }
        arm();
      });
    }, ms);
    timer.unref?.();
  };

  /** After a scan: the next periodic (or unbound backoff) one, unless a link event's is due. */
  const arm = () => {
    if (soon) return;
    if (changed) setTimer(debounceMs, true);
    else setTimer(nextDelay(), false);
  };

  /** A link changed: scan within the debounce (a burst of events is one scan). */
  const linkChanged = () => {
    changed = true;
    if (!soon) setTimer(debounceMs, true);
  };

  const watch = () => {
    restartTimer = undefined;
    if (stopped || !o.monitor) return;
    const opened = Date.now();
    // This monitor's handlers act only while it is the current one (not after its exit, a
    // stop() or a restart), even when they are called from inside open().
    const self = {};
    let current: object | undefined = self;
    let up = false;
    const mine = () => current === self && !stopped;
    const s = o.monitor.open({
      ready: () => {
        if (!mine()) return;
        up = true;
        monitorUp = true;
        o.log.debug('link monitor listening: pod interfaces are scanned on link events');
        // Changes while it was starting (or down) were not told: one scan covers them, and the
        // next periodic one is the safety rescan.
        linkChanged();
      },
      change: () => {
        if (mine()) linkChanged();
      },
      exit: (reason) => {
        if (!mine()) return;
        current = undefined;
        stream = undefined;
        monitorUp = false;
        if (up && Date.now() - opened >= stableMs) {
          restarts = 0;
          warned = false;
        }
        const retryInMs = backoffMs(++restarts, restart);
        const fields = { reason, retryInMs, pollMs: o.rescanMs };
        if (warned) o.log.debug(fields, 'link monitor stopped again; restarting');
        else o.log.warn(fields, `link monitor stopped: pod interfaces are scanned every ${o.rescanMs} ms until it runs again; restarting it with backoff`);
        warned = true;
        arm(); // back to polling
        restartTimer = setTimeout(watch, retryInMs);
        restartTimer.unref?.();
      },
    });
    if (current === self) stream = s;
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

  /** No more scans, no monitor (and none restarted). */
  const halt = async () => {
    stopped = true;
    clearTimeout(timer);
    clearTimeout(restartTimer);
    const s = stream;
    stream = undefined;
    await s?.close();
  };

  return {
    start(onBatch) {
      deliver = onBatch;
      // Listening before the first scan, so no change after it goes untold.
      watch();
      return inner
        .start((batch) => {
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
        })
        .catch(async (err: unknown) => {
          // The caller will not stop() a source that failed to start: leave no monitor behind.
          await halt();
          throw err;
        });
    },
    async stop() {
      await Promise.all([halt(), inner.stop()]);
      await chain;
    },
  };
}
