// Binds each local pod's addresses to its bridge port (the scan: pod-interfaces-scan.ts). Calc
// binds each pod's source address to its port, so a pod cannot send with another pod's
// address, and a pod whose port is not known yet cannot send at all.
//
// Scans follow link events: one long-lived `ip -o monitor link` (pod-interfaces-monitor.ts) in
// the scans' namespace tells of every port coming, going, joining the bridge or changing
// carrier, and a scan follows within a debounce. An idle node spawns nothing but a slow safety
// rescan; while the monitor is down (it cannot start, or died) scans poll as before, and it is
// restarted with backoff.

import { type Backoff, backoffMs } from '../backoff.ts';
import type { Logger } from '../log.ts';
import type { CalcEvent, ModelEvent, PodInterfaceEvent } from '../model/types.ts';
import type { LinkMonitor, LinkMonitorStream } from './pod-interfaces-monitor.ts';
import type { PortBindings, PodInterfaceScanner } from './pod-interfaces-scan.ts';
import type { Source, SourceBatch } from './types.ts';

export { createLinkMonitor, type LinkMonitor, type LinkMonitorHandlers, type LinkMonitorStream } from './pod-interfaces-monitor.ts';
export { ADDRESSES_SETTLE_MS, createPodInterfaceScanner, type PodInterfaceScanner, type PortBindings } from './pod-interfaces-scan.ts';

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
