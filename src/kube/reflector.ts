// List+watch of one collection, kept alive whatever happens: every failure (HTTP error, network
// error, 410 Gone, a watch that ends or goes silent) restarts it after a jittered exponential
// backoff; 410 and a periodic timer relist and diff against the cache, which repairs any event
// the watch missed. The cache holds decoded values only (a codec turns raw JSON into them), and
// a change is reported only when a value's canonical form changes, so every report is an exact
// diff (what a collection and its codec are: ./collection.ts). An optional collection the
// server does not serve (a CRD not installed) is an empty one, listed again now and then. Used
// by the kube source (Pods, Namespaces, Nodes, NetworkPolicies, ClusterNetworkPolicies), the
// controller's policy status cache (NodePolicyStatus, NetworkPolicyStatus) and the side watches
// (./side-watch.ts).

import { setTimeout as sleep } from 'node:timers/promises';
import { type Backoff, backoffMs } from '../backoff.ts';
import { WeirError } from '../errors.ts';
import { isRecord } from '../records.ts';
import type { Logger } from '../log.ts';
import { describe, KubeApiError, statusOf } from './client.ts';
import type { KubeClient, RawWatchEvent } from './client.ts';
import { type Codec, type Collection, type Decoded, resourceVersionOf } from './collection.ts';

/** The vocabulary of a watch loop, for logs and metrics:
 *  - listed: a full list completed (the first one, or a relist);
 *  - watch-started: the server accepted a watch;
 *  - event: an ADDED, MODIFIED or DELETED event arrived;
 *  - bookmark: a BOOKMARK moved the resourceVersion on;
 *  - error: a list or watch failed (detail: why);
 *  - restart: the loop is about to wait and start again (detail: why and the delay);
 *  - watchdog: a silent watch was abandoned;
 *  - relist: a relist begins after the first list (detail: periodic or 410). */
export type WatchTransition = 'listed' | 'watch-started' | 'event' | 'bookmark' | 'error' | 'restart' | 'watchdog' | 'relist';

export interface WatchEvent<K extends string = string> {
  readonly kind: K;
  readonly type: WatchTransition;
  readonly detail?: string;
}

export interface ListWatchTimings {
  /** timeoutSeconds asked of the server per watch, picked from [min, max]. */
  readonly watchTimeoutSeconds: readonly [number, number];
  /** A watch that receives nothing, not even a bookmark, for this long is restarted. The API
   *  server bookmarks idle watches about once a minute, so three minutes means it is stuck. */
  readonly watchdogMs: number;
  /** Interval of the full relist that repairs missed events, picked from [min, max]. */
  readonly relistMs: readonly [number, number];
  /** A watch that ran this long counts as healthy: the next failure starts the backoff afresh. */
  readonly healthyWatchMs: number;
  /** Limit on one list page request (a list call hanging forever has no watchdog otherwise). */
  readonly listTimeoutMs: number;
  /** Objects per list page (limit/continue). */
  readonly pageSize: number;
}

/** Every list+watch loop's schedule unless its owner says otherwise (relists every 5-10 min). */
export const DEFAULT_LIST_WATCH_TIMINGS: ListWatchTimings = {
  watchTimeoutSeconds: [300, 600],
  watchdogMs: 180_000,
  relistMs: [300_000, 600_000],
  healthyWatchMs: 30_000,
  listTimeoutMs: 60_000,
  pageSize: 500,
};

/** A value in [min, max]; `random` returns [0, 1) like Math.random. Watch timeouts and relist
 *  intervals are picked so that the watchers of a cluster do not reconnect or relist in step. */
export function pickBetween(range: readonly [number, number], random: () => number): number {
  const [min, max] = range;
  return min + (max - min) * random();
}

export interface ReflectorDeps<K extends string = string> {
  readonly client: KubeClient;
  readonly log: Logger;
  readonly timings: ListWatchTimings;
  /** The retry schedule: retry n waits backoffMs(n, backoff, random), with equal jitter so that
   *  a crowd of watchers failing together does not retry in step. */
  readonly backoff: Backoff;
  readonly delay: (ms: number, signal: AbortSignal) => Promise<void>;
  /** [0, 1), for the backoff's jitter and the randomised watch timeouts and relist intervals. */
  readonly random: () => number;
  /** Monotonic milliseconds, for the watchdog. */
  readonly now: () => number;
  readonly onWatchEvent: (e: WatchEvent<K>) => void;
  /** Called as each list starts; what it returns is called after each object the list takes
   *  in (the agent bounds its heap with it). */
  readonly startList?: () => () => void;
}

export interface ReflectorSink<T> {
  /** A value changed, or disappeared (undefined); `before` is what was held for the key. */
  change(key: string, value: T | undefined, before: T | undefined): void;
  /** A full list was applied to the cache. */
  listed(): void;
}

export interface Reflector {
  /** Lists and watches until `signal` aborts; never rejects. */
  run(signal: AbortSignal): Promise<void>;
  /** The current resourceVersion ('' before the first list). */
  resourceVersion(): string;
}

// Why a watch was cut short by us rather than by the server.
const WATCHDOG = 'watchdog';
const RELIST = 'relist';

export function createReflector<K extends string, T>(res: Collection<K>, codec: Codec<T>, deps: ReflectorDeps<K>, sink: ReflectorSink<T>): Reflector {
  const { client, log, timings, random, now, startList } = deps;
  const kind = res.kind;
  const pick = (range: readonly [number, number]): number => pickBetween(range, random);
  /** By name (RawRef.key): at most one object holds a name at a time, whatever its uid, and
   *  the API's DELETED events and relists speak of names. Reports use each value's own key. */
  const entries = new Map<string, T>();
  const keyOf = (name: string, held: T): string => codec.keyOf?.(held) ?? name;
  /** Objects that failed conversion, with the message last logged, so a relist does not repeat it. */
  let bad = new Map<string, string>();
  let rv = '';
  let needList = true;
  let listedOnce = false;
  let relistWhy = '';
  let relistTimer: NodeJS.Timeout | undefined;
  let current: AbortController | undefined;
  /** Set when the running watch made progress: the next failure starts the backoff afresh. */
  let healthy = false;
  /** An optional collection the server answered 404 for, until a list succeeds. */
  let notServed = false;

  function hook(type: WatchTransition, detail?: string): void {
    try {
      deps.onWatchEvent(detail === undefined ? { kind, type } : { kind, type, detail });
    } catch (err) {
      log.error({ err, kind }, 'the watch event hook failed');
    }
  }

  /** Stores a decoded object; returns whether its value changed. A name reused by another
   *  object (a pod recreated with a new uid) reports the old one gone. */
  function put(c: Decoded<T>): boolean {
    const held = entries.get(c.name);
    const heldKey = held === undefined ? undefined : keyOf(c.name, held);
    if (held !== undefined && heldKey === c.key && codec.same(held, c.held ?? c.value)) return false;
    entries.set(c.name, c.held ?? c.value);
    if (heldKey !== undefined && heldKey !== c.key) sink.change(heldKey, undefined, held);
    for (const w of c.warnings) log.warn({ kind, object: c.name }, w);
    sink.change(c.key, c.value, heldKey === c.key ? held : undefined);
    return true;
  }

  function remove(name: string): boolean {
    const held = entries.get(name);
    if (held === undefined) return false;
    entries.delete(name);
    sink.change(keyOf(name, held), undefined, held);
    return true;
  }

  /** Decodes, or logs why not (once per object and message) and returns null. */
  function convert(raw: unknown, badNow: Map<string, string>): Decoded<T> | null {
    const ref = codec.ref(raw);
    try {
      const c = codec.decode(raw);
      badNow.delete(ref.key);
      return c;
    } catch (err) {
      if (!(err instanceof WeirError)) throw err;
      if (bad.get(ref.key) !== err.message) {
        log.warn({ err, kind, namespace: ref.namespace || undefined, name: ref.name }, `${err.message}; skipped`);
      }
      badNow.set(ref.key, err.message);
      return null;
    }
  }

  /** An optional collection the server does not serve: an empty list (what was held went with
   *  its CRD). Said once, then again only once it is served. */
  function markNotServed(why: string): void {
    for (const name of [...entries.keys()]) remove(name);
    bad = new Map();
    rv = '';
    needList = true;
    // Its first list when served again is a first list: from the watch cache, and no "repair".
    listedOnce = false;
    hook('listed', `0 objects: not served (${why})`);
    if (!notServed) {
      const [min, max] = timings.relistMs.map((ms) => Math.round(ms / 1000));
      log.info({ kind, path: res.path }, `${kind} is not served by the API server (${why}); there are none until it is, listed again every ${min}-${max} s`);
    }
    notServed = true;
    sink.listed();
  }

  async function list(signal: AbortSignal): Promise<number> {
    // The first list fills an empty cache: nothing can be gone at its end, so each object goes
    // in as it arrives instead of being held in a wrapper until the list ends (one per object,
    // all garbage a moment later). Nothing is reported before listed() anyway.
    const direct = !listedOnce && entries.size === 0;
    let changes = 0;
    const fresh: Decoded<T>[] = [];
    const badNow = new Map<string, string>();
    let cont = '';
    let listRv = '';
    const afterItem = startList?.();
    do {
      const query: Record<string, string> = { limit: String(timings.pageSize) };
      if (cont !== '') query.continue = cont;
      // The first list may come from the API server's watch cache (as client-go's reflector
      // does): the watch from its resourceVersion delivers whatever is newer. It spares etcd a
      // read of the whole collection; the cache answers in one piece, which the client
      // streams. Relists repair missed events, so they read the latest state.
      else if (!listedOnce) query.resourceVersion = '0';
      if (res.fieldSelector !== undefined) query.fieldSelector = res.fieldSelector;
      const body = await client.list({ method: 'GET', path: res.path, query, signal, timeoutMs: timings.listTimeoutMs, protobuf: res.protobuf }, (item) => {
        const c = convert(item, badNow);
        if (c !== null) {
          if (!direct) fresh.push(c);
          else if (put(c)) changes++;
        }
        afterItem?.();
      });
      const md = isRecord(body) && isRecord(body.metadata) ? body.metadata : {};
      if (!isRecord(body) || !Array.isArray(body.items)) throw new KubeApiError('GET', res.path, 200, '', 'the list response has no items');
      cont = typeof md.continue === 'string' ? md.continue : '';
      listRv = typeof md.resourceVersion === 'string' ? md.resourceVersion : '';
    } while (cont !== '');
    bad = badNow;

    if (!direct) {
      const keep = new Set(fresh.map((c) => c.name));
      for (const name of [...entries.keys()]) if (!keep.has(name) && remove(name)) changes++;
      for (const c of fresh) if (put(c)) changes++;
    }
    rv = listRv;
    return changes;
  }

  function apply(ev: RawWatchEvent): void {
    switch (ev.type) {
      case 'ADDED':
      case 'MODIFIED': {
        const c = convert(ev.object, bad);
        if (c !== null) put(c);
        else {
          // An object we cannot read is treated as absent, as a relist would.
          remove(codec.ref(ev.object).key);
        }
        hook('event', ev.type);
        break;
      }
      case 'DELETED': {
        const ref = codec.ref(ev.object);
        bad.delete(ref.key);
        const held = entries.get(ref.key);
        if (held !== undefined && (codec.deletes === undefined || codec.deletes(held, ref))) remove(ref.key);
        hook('event', ev.type);
        break;
      }
      case 'BOOKMARK':
        hook('bookmark', resourceVersionOf(ev.object));
        break;
      case 'ERROR': {
        const s = statusOf(ev.object);
        throw new KubeApiError('GET', res.path, s?.code ?? 0, s?.reason ?? '', s?.message || 'the watch sent an ERROR event');
      }
      default:
        log.debug({ kind, type: ev.type }, `ignoring a watch event of type ${ev.type}`);
        return;
    }
    const next = resourceVersionOf(ev.object);
    if (next !== '') rv = next;
    healthy = true;
  }

  /** One watch from `rv`. Returns how it ended when it ended without an error. */
  async function watch(signal: AbortSignal): Promise<'ended' | typeof WATCHDOG | typeof RELIST> {
    const ctl = new AbortController();
    const cut = AbortSignal.any([signal, ctl.signal]);
    current = ctl;
    const started = now();
    let last = started;
    // Re-armed lazily from the time of the last chunk, instead of being reset on every chunk.
    let dog: NodeJS.Timeout | undefined;
    const check = () => {
      const silent = now() - last;
      if (silent >= timings.watchdogMs) ctl.abort(WATCHDOG);
      else dog = setTimeout(check, timings.watchdogMs - silent);
    };
    dog = setTimeout(check, timings.watchdogMs);
    const query: Record<string, string> = {
      watch: 'true',
      allowWatchBookmarks: 'true',
      timeoutSeconds: String(Math.round(pick(timings.watchTimeoutSeconds))),
    };
    if (rv !== '') query.resourceVersion = rv;
    if (res.fieldSelector !== undefined) query.fieldSelector = res.fieldSelector;
    try {
      const stream = await client.watch(res.path, query, cut, () => {
        last = now();
      });
      hook('watch-started', `from resourceVersion ${rv || '(latest)'}`);
      for await (const ev of stream) apply(ev);
      return 'ended';
    } catch (err) {
      if (!signal.aborted && ctl.signal.aborted) return ctl.signal.reason === WATCHDOG ? WATCHDOG : RELIST;
      throw err;
    } finally {
      clearTimeout(dog);
      current = undefined;
      if (now() - started >= timings.healthyWatchMs) healthy = true;
    }
  }

  function armRelist(): void {
    clearTimeout(relistTimer);
    relistTimer = setTimeout(() => {
      needList = true;
      relistWhy = 'periodic';
      current?.abort(RELIST);
    }, pick(timings.relistMs));
  }

  async function run(signal: AbortSignal): Promise<void> {
    let failures = 0;
    let relistedFor410 = false;
    while (!signal.aborted) {
      let why: string;
      let phase = 'list';
      healthy = false;
      try {
        if (needList) {
          if (listedOnce) hook('relist', relistWhy);
          const changes = await list(signal);
          needList = false;
          failures = 0;
          if (notServed) log.info({ kind, path: res.path }, `${kind} is served now; watching it`);
          notServed = false;
          hook('listed', `${entries.size} objects at resourceVersion ${rv || '(none)'}`);
          if (listedOnce && changes > 0) {
            log.info({ kind, changes, why: relistWhy }, `${kind} relist repaired ${changes} object(s) the watch had not delivered`);
          }
          listedOnce = true;
          sink.listed();
          armRelist();
        }
        phase = 'watch';
        const ended = await watch(signal);
        if (ended === RELIST) continue; // planned: relist at once
        if (ended === WATCHDOG) {
          why = `the watch was silent for ${timings.watchdogMs} ms`;
          client.reset();
          hook('watchdog', why);
          log.warn({ kind, resourceVersion: rv }, `${kind} ${why}; restarting it`);
        } else {
          why = 'the server ended the watch';
        }
      } catch (err) {
        if (signal.aborted) break;
        why = describe(err);
        if (res.optional === true && err instanceof KubeApiError && err.status === 404) {
          if (phase === 'list') {
            markNotServed(`${err.status} ${err.reason || 'NotFound'}`);
            // Not a failure to back off from: the usual relist interval, real time.
            await sleep(pick(timings.relistMs), undefined, { signal }).catch(() => {});
            continue;
          }
          // Gone under a watch (its CRD deleted): the next list tells.
          needList = true;
          relistWhy = why;
        }
        hook('error', why);
        if (err instanceof KubeApiError && err.status === 410 && phase === 'watch' && (healthy || !relistedFor410)) {
          // 410 is routine after a long disconnect, and the server's way of saying "relist":
          // do it at once. Backing off here (up to the backoff's cap after an outage) kept a
          // change the watch had missed unrepaired all that time. A failing list backs off as usual.
          needList = true;
          relistWhy = `410 Gone: ${err.message}`;
          relistedFor410 = true; // a second 410 before any progress backs off: no tight loop
          log.info({ err, kind, resourceVersion: rv }, `${kind} ${phase} failed: ${why}; relisting`);
          continue;
        }
        if (err instanceof KubeApiError && err.status === 410) {
          needList = true;
          relistWhy = `410 Gone: ${err.message}`;
        }
        log.warn({ err, kind, resourceVersion: rv }, `${kind} ${phase} failed: ${why}`);
      }
      if (healthy) {
        failures = 0;
        relistedFor410 = false;
      }
      failures++;
      const ms = Math.round(backoffMs(failures, deps.backoff, random));
      hook('restart', `${why}; retrying in ${ms} ms`);
      log.debug({ kind, failures, delayMs: ms }, `${kind}: ${why}; retrying in ${ms} ms`);
      await deps.delay(ms, signal);
    }
    clearTimeout(relistTimer);
  }

  return { run, resourceVersion: () => rv };
}
