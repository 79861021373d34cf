// Writes NetworkPolicyStatus objects from one controller replica at a time (the Lease holder). While holding,
// it lists every NodePolicyStatus and NetworkPolicyStatus once and then watches them (the shared
// reflector: relist on 410 Gone, backoff on errors), so a pass costs no request to read. A pass
// runs when the input or a node's digests change: it computes each policy's status from the
// agent's latest input and the nodes' digests (./realization.ts), and applies only what differs
// from what the API server holds. Orphans (their NetworkPolicy is gone) are deleted explicitly
// rather than left to the garbage collector.

import type { KubeConfig } from '@kubernetes/client-node';
import { APPLY_PATCH, createKubeClient, isStatus } from '../kube/client.ts';
import type { KubeClient, RequestRecord } from '../kube/client.ts';
import { compareStrings } from '../model/order.ts';
import { createReflector } from '../kube/reflector.ts';
import { type Codec, rawRefOf } from '../kube/collection.ts';
import { isRecord } from '../records.ts';
import { DEFAULT_LIST_WATCH_TIMINGS, type ListWatchTimings } from '../kube/reflector.ts';
import { listHeapGuard, v8Collector } from '../agent/gc.ts';
import type { Logger } from '../log.ts';
import { AGGREGATOR_FIELD_MANAGER, applyQuery, deleteBody, nodeStatusListPath, policyObjectBody, policyStatusBody, policyStatusListPath, policyStatusPath } from './bodies.ts';
import { systemClock } from '../clock.ts';
import type { Clock } from '../clock.ts';
import { createLeaseElector } from './elector.ts';
import { createFailureLog } from './failures.ts';
import { nodeDigestOf } from './node-status.ts';
import { createPacer } from '../pacer.ts';
import type { PassResult } from '../pacer.ts';
import { DEFAULT_RETRY_MAX_MS, DEFAULT_RETRY_MIN_MS } from './pacing.ts';
import { buildPolicyStatus, parsePolicyStatus, policyStatusKey, samePolicyStatus, sameStrings } from './policy-status.ts';
import type { PolicyStatus, PolicyStatusInput } from './policy-status.ts';
import { createRealizationTracker, encodeDigest } from './realization.ts';
import type { NodeDigest, RealizationTracker } from './realization.ts';

export interface PolicyStatusAggregatorOptions {
  readonly kubeConfig: KubeConfig;
  /** This replica's identity in the Lease: its pod name. */
  readonly identity: string;
  readonly log: Logger;
  readonly clock?: Clock;
  readonly leaseNamespace?: string;
  readonly leaseName?: string;
  readonly leaseDurationSeconds?: number;
  /** Passes run at most this often. */
  readonly minIntervalMs?: number;
  /** Backoff of failed passes and failed lists/watches. */
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  readonly onWrite?: (result: PassResult) => void;
  /** Sees every request the writer sends (e.g. to count them). */
  readonly onRequest?: (r: RequestRecord) => void;
  readonly watchTimings?: Partial<ListWatchTimings>;
  /** [0, 1) like Math.random (the default): the watches' retry jitter and randomised timings. */
  readonly random?: () => number;
  /** V8's collector (agent/gc.ts; `compact` gives the freed pages back): asked for a full
   *  collection whenever a pass's writes have grown the heap by WRITE_HEAP_GROWTH, and for a
   *  compacting one after a pass that wrote COMPACT_AFTER_WRITES objects or more. Default:
   *  v8Collector(), which is there when Node runs with --expose-gc (the image's flags). */
  readonly collectGarbage?: (compact: boolean) => void;
}

export interface PolicyStatusAggregatorInput {
  /** Every NetworkPolicy in the cluster. */
  readonly policies: readonly PolicyStatusInput[];
}

export interface PolicyStatusAggregator {
  /** Starts competing for the Lease. */
  start(): void;
  /** Stores the input (the latest wins); returns at once. Nothing is written, and nothing is
   *  deleted, before the first call: call it once the agent has a synced view. */
  update(input: PolicyStatusAggregatorInput): void;
  /** True while this replica holds the Lease (e.g. to record cluster-wide events only once). */
  isHolder(): boolean;
  /** Stops writing and releases the Lease. */
  stop(): Promise<void>;
}

export const DEFAULT_LEASE_NAMESPACE = 'kube-system';
export const DEFAULT_LEASE_NAME = 'weir-policy-status';
export const DEFAULT_LEASE_DURATION_SECONDS = 15;
export const DEFAULT_AGGREGATOR_MIN_INTERVAL_MS = 2_000;

/** The watches of the holder. The relist is a rare safety net (the watch delivers every change;
 *  410 relists at once): at 1,000 nodes a relist reads every NodePolicyStatus. */
export const DEFAULT_AGGREGATOR_WATCH_TIMINGS: ListWatchTimings = { ...DEFAULT_LIST_WATCH_TIMINGS, relistMs: [1_800_000, 3_600_000] };

const GRANT = 'list, watch nodepolicystatuses.weir.dev; list, watch, create, patch, delete networkpolicystatuses.weir.dev; patch networkpolicystatuses/status';
const LEASE_GRANT = 'get, create, update on leases.coordination.k8s.io in the lease namespace';

interface Stored {
  readonly uid: string;
  readonly ownerUids: readonly string[];
  readonly status: PolicyStatus | null;
}

/** One node's NodePolicyStatus as the aggregator needs it. */
interface NodeEntry {
  readonly uid: string;
  readonly digest: NodeDigest | null;
}

/** The holder's watches and what they hold; dropped when the Lease is lost. */
interface Watching {
  readonly abort: AbortController;
  readonly loops: Promise<void>[];
  readonly nodes: Map<string, NodeEntry>;
  readonly stored: Map<string, Stored>;
  /** What our writes in flight will make each object hold (contentKey, or DELETED), until the
   *  watch brings it back: those events are our own and ask for no pass. */
  readonly expecting: Map<string, Set<string>>;
  readonly listed: Set<string>;
  readonly tracker: RealizationTracker;
}

export function createPolicyStatusAggregator(o: PolicyStatusAggregatorOptions): PolicyStatusAggregator {
  const clock = o.clock ?? systemClock;
  const log = o.log.child({ component: 'status', aggregator: o.identity });
  const client: KubeClient = createKubeClient(o.kubeConfig, o.onRequest ? { onRequest: o.onRequest } : {});
  const failures = createFailureLog(log, 'policy status', GRANT);
  const abort = new AbortController();
  const signal = abort.signal;
  const q = applyQuery(AGGREGATOR_FIELD_MANAGER);
  const retry = { retryMinMs: o.retryMinMs ?? DEFAULT_RETRY_MIN_MS, retryMaxMs: o.retryMaxMs ?? DEFAULT_RETRY_MAX_MS };
  const timings: ListWatchTimings = { ...DEFAULT_AGGREGATOR_WATCH_TIMINGS, ...o.watchTimings };
  let latest: PolicyStatusAggregatorInput | null = null;
  let watching: Watching | null = null;
  const collect = 'collectGarbage' in o ? o.collectGarbage : v8Collector();
  const heapGuard = collect && listHeapGuard(collect, { every: 200, growthBytes: WRITE_HEAP_GROWTH });

  const elector = createLeaseElector({
    client,
    clock,
    log,
    failures: createFailureLog(log, 'policy status lease', LEASE_GRANT),
    identity: o.identity,
    namespace: o.leaseNamespace ?? DEFAULT_LEASE_NAMESPACE,
    name: o.leaseName ?? DEFAULT_LEASE_NAME,
    durationSeconds: o.leaseDurationSeconds ?? DEFAULT_LEASE_DURATION_SECONDS,
    onChange: (holder) => {
      if (holder) startWatching();
      else stopWatching();
    },
  });

  /** Waits on the injected clock, so that tests drive the watch backoff too. */
  const delay = (ms: number, s: AbortSignal): Promise<void> =>
    new Promise((resolve) => {
      if (s.aborted) return resolve();
      const t = clock.setTimeout(() => {
        s.removeEventListener('abort', done);
        resolve();
      }, ms);
      const done = (): void => {
        clock.clearTimeout(t);
        resolve();
      };
      s.addEventListener('abort', done, { once: true });
    });

  function startWatching(): void {
    if (watching !== null || signal.aborted) return;
    const w: Watching = {
      abort: new AbortController(),
      loops: [],
      nodes: new Map(),
      stored: new Map(),
      expecting: new Map(),
      listed: new Set(),
      tracker: createRealizationTracker(),
    };
    watching = w;
    const deps = {
      client,
      log,
      timings,
      backoff: { initialMs: retry.retryMinMs, maxMs: retry.retryMaxMs },
      delay,
      random: o.random ?? Math.random,
      now: () => performance.now(),
      onWatchEvent: () => {},
    };
    const listed = (kind: string) => () => {
      w.listed.add(kind);
      poke();
    };
    const nodeReflector = createReflector({ kind: 'NodePolicyStatus', path: nodeStatusListPath() }, nodeCodec, deps, {
      change(node, entry) {
        const old = w.nodes.get(node);
        // Deleted or re-created: what it proved no longer stands.
        if (old !== undefined && (entry === undefined || entry.uid !== old.uid)) w.tracker.forgetNode(node);
        if (entry === undefined) w.nodes.delete(node);
        else w.nodes.set(node, entry);
        poke();
      },
      listed: listed('NodePolicyStatus'),
    });
    const policyReflector = createReflector({ kind: 'NetworkPolicyStatus', path: policyStatusListPath() }, storedCodec, deps, {
      change(key, entry) {
        const own = unexpect(w, key, entry === undefined ? DELETED : contentKey(entry));
        if (entry === undefined) w.stored.delete(key);
        else w.stored.set(key, entry);
        // Somebody else changed or deleted a status (kubectl edit, a stale holder): put it right.
        if (!own) poke();
      },
      listed: listed('NetworkPolicyStatus'),
    });
    w.loops.push(nodeReflector.run(w.abort.signal), policyReflector.run(w.abort.signal));
  }

  /** Asks for a pass once there is something to compute it from: an input, and both kinds
   *  listed since this replica became the holder. */
  function poke(): void {
    if (latest !== null && watching !== null && watching.listed.size === 2) pacer.poke();
  }

  function stopWatching(): void {
    watching?.abort.abort();
    watching = null;
  }

  async function pass(): Promise<'ok' | 'skipped'> {
    const input = latest;
    const w = watching;
    if (input === null || w === null || !elector.isHolder() || w.listed.size < 2) return 'skipped';
    const digests = new Map<string, NodeDigest>();
    for (const [node, e] of w.nodes) if (e.digest !== null) digests.set(node, e.digest);
    const realizations = w.tracker.update(input.policies, digests);
    // In namespace/name order, once per key (the first of the input wins); each key made once.
    const keyed = input.policies.map((p) => ({ p, k: key(p.namespace, p.name) })).sort((a, b) => compareStrings(a.k, b.k));
    const seen = new Set<string>();
    const todo: { readonly p: PolicyStatusInput; readonly k: string }[] = [];
    for (const e of keyed) {
      if (seen.has(e.k)) continue;
      seen.add(e.k);
      todo.push(e);
    }
    let writes = 0;
    // Every write leaves garbage that outlives V8's young generation (the client's request
    // objects, mostly), and V8 lets it pile up to several times the live heap before a full
    // collection on its own (docs/performance.md).
    const wrote = heapGuard?.();
    const written = (obj: unknown, k: string): void => {
      remember(w, k, obj);
      writes++;
      wrote?.();
    };
    try {
      // A few writes in flight: 20k statuses written one at a time take minutes on a new cluster.
      await forEachLimited(todo, WRITES_IN_FLIGHT, async ({ p, k }) => {
        // Lost the lease mid-pass: the new holder takes it from here.
        if (!elector.isHolder()) return false;
        const old = w.stored.get(k);
        const r = realizations.get(p.uid) ?? { desired: 0, realized: 0, pending: [] };
        const next = buildPolicyStatus(p, r, old?.status?.conditions, clock.now());
        if (old === undefined || !old.ownerUids.includes(p.uid)) {
          expect(w, k, contentKey({ ownerUids: [p.uid], status: old?.status ?? null }));
          written(await client.send({ method: 'PATCH', path: policyStatusPath(p.namespace, p.name), query: q, body: policyObjectBody(p), contentType: APPLY_PATCH, signal }), k);
        }
        const held = w.stored.get(k);
        if (held?.status == null || !samePolicyStatus(held.status, next)) {
          expect(w, k, contentKey({ ownerUids: held?.ownerUids ?? [p.uid], status: next }));
          const body = policyStatusBody(p, next);
          written(await client.send({ method: 'PATCH', path: policyStatusPath(p.namespace, p.name, 'status'), query: q, body, contentType: APPLY_PATCH, signal }), k);
        }
        return true;
      });
      if (!elector.isHolder()) return writes > 0 ? 'ok' : 'skipped';
      writes += await deleteOrphans(w, seen);
      return writes > 0 ? 'ok' : 'skipped';
    } finally {
      // V8 keeps the pages a burst of writes grew its heap to, collected or not, until asked.
      if (writes >= COMPACT_AFTER_WRITES) collect?.(true);
    }
  }

  /** DELETEs every status whose policy is not in the input; returns how many. */
  async function deleteOrphans(w: Watching, seen: ReadonlySet<string>): Promise<number> {
    let writes = 0;
    // The orphans alone: a copy of the whole map was 20k entries of garbage every pass.
    const orphans: [string, Stored][] = [];
    for (const [k, s] of w.stored) if (!seen.has(k)) orphans.push([k, s]);
    for (const [k, s] of orphans) {
      if (!elector.isHolder()) break;
      const [namespace, name] = k.split('/');
      expect(w, k, DELETED);
      try {
        await client.send({ method: 'DELETE', path: policyStatusPath(namespace, name), body: s.uid === '' ? undefined : deleteBody(s.uid), signal });
        writes++;
      } catch (err) {
        // Already gone, or re-created since (409: the uid precondition failed; the watch tells).
        if (!isStatus(err, 404) && !isStatus(err, 409)) throw err;
      }
      if (w.stored.get(k) === s) w.stored.delete(k);
    }
    return writes;
  }

  const pacer = createPacer({
    clock,
    minIntervalMs: o.minIntervalMs ?? DEFAULT_AGGREGATOR_MIN_INTERVAL_MS,
    ...retry,
    run: pass,
    onResult: (result, err) => {
      if (result === 'error') {
        if (!signal.aborted) failures.failed(err);
      } else failures.succeeded();
      o.onWrite?.(result);
    },
  });

  return {
    start() {
      elector.start();
    },
    update(input) {
      latest = input;
      poke();
    },
    isHolder: () => elector.isHolder(),
    async stop() {
      abort.abort();
      const w = watching;
      stopWatching();
      await pacer.stop();
      await Promise.allSettled(w?.loops ?? []);
      await elector.stop();
      await client.close();
    },
  };
}

const WRITES_IN_FLIGHT = 8;
/** Heap growth during a pass's writes that gets a full collection. */
const WRITE_HEAP_GROWTH = 32 * 2 ** 20;
/** A pass that wrote this many objects is a burst (a new holder, a new cluster): V8's pages
 *  are given back after it. */
const COMPACT_AFTER_WRITES = 1_000;

/** Runs `fn` over `items` with at most `n` at a time, in order of start; stops starting new ones
 *  when one returns false; rejects with the first failure once those in flight settle. */
async function forEachLimited<T>(items: readonly T[], n: number, fn: (item: T) => Promise<boolean>): Promise<void> {
  let next = 0;
  let stop = false;
  let failure: { err: unknown } | null = null;
  const worker = async (): Promise<void> => {
    while (!stop && next < items.length) {
      try {
        if (!(await fn(items[next++]))) stop = true;
      } catch (err) {
        stop = true;
        failure ??= { err };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  if (failure !== null) throw (failure as { err: unknown }).err;
}

const key = (namespace: string, name: string): string => `${namespace}/${name}`;

/** What a write answered is held at once, so that a pass before its watch event arrives does
 *  not write it again. */
function remember(w: Watching, k: string, obj: unknown): void {
  const s = readStored(obj);
  // The watch may have brought the same content first: its object is the reflector's too, so
  // keeping it holds one copy instead of two.
  const held = w.stored.get(k);
  if (s !== null && (held === undefined || !sameStored(held, s))) w.stored.set(k, s);
}

const DELETED = 'DELETED';

function expect(w: Watching, k: string, content: string): void {
  let set = w.expecting.get(k);
  // A write that failed leaves its entry behind; a few are plenty.
  if (set === undefined || set.size > 4) w.expecting.set(k, (set = new Set()));
  set.add(content);
}

/** Whether a watch event brings what one of our writes made: then it is our own. */
function unexpect(w: Watching, k: string, content: string): boolean {
  const set = w.expecting.get(k);
  if (set === undefined || !set.delete(content)) return false;
  // An empty set per object, 20k of them, was most of what this map held at rest.
  if (set.size === 0) w.expecting.delete(k);
  return true;
}

/** What an object holds, regardless of who wrote it when. */
const contentKey = (s: Pick<Stored, 'ownerUids' | 'status'>): string => JSON.stringify([s.ownerUids, s.status === null ? null : policyStatusKey(s.status)]);

function readStored(raw: unknown): Stored | null {
  if (!isRecord(raw) || !isRecord(raw.metadata)) return null;
  const m = raw.metadata;
  const owners = Array.isArray(m.ownerReferences) ? (m.ownerReferences as unknown[]) : [];
  return {
    uid: typeof m.uid === 'string' ? m.uid : '',
    ownerUids: owners.map((r) => (isRecord(r) ? r.uid : undefined)).filter((u): u is string => typeof u === 'string'),
    status: parsePolicyStatus(raw.status),
  };
}

/** Whether two stored objects are the same object with the same content, compared in place
 *  (every watch event and every write answer asks). */
const sameStored = (a: Stored, b: Stored): boolean =>
  a.uid === b.uid && sameStrings(a.ownerUids, b.ownerUids) && (a.status === null || b.status === null ? a.status === b.status : samePolicyStatus(a.status, b.status));

/** NetworkPolicyStatus objects by namespace/name. */
const storedCodec: Codec<Stored> = {
  decode(raw) {
    const ref = rawRefOf(raw, true);
    const value = readStored(raw) ?? { uid: ref.uid, ownerUids: [], status: null };
    return { key: ref.key, name: ref.key, value, warnings: [] };
  },
  same: sameStored,
  ref: (raw) => rawRefOf(raw, true),
};

/** NodePolicyStatus objects by node name; only the uid and the digests matter, so a heartbeat
 *  (lastSyncTime) or a count changing is no change here and brings no pass. */
const nodeCodec: Codec<NodeEntry> = {
  decode(raw) {
    const ref = rawRefOf(raw, false);
    const digest = nodeDigestOf(isRecord(raw) ? raw.status : undefined);
    return { key: ref.name, name: ref.name, value: { uid: ref.uid, digest }, warnings: [] };
  },
  same: (a, b) => a.uid === b.uid && (a.digest === null ? '' : encodeDigest(a.digest)) === (b.digest === null ? '' : encodeDigest(b.digest)),
  ref: (raw) => rawRefOf(raw, false),
};
