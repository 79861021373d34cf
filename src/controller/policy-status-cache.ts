// What the policy status aggregator (./aggregator.ts) reads: while this replica holds the Lease,
// every NodePolicyStatus, NetworkPolicyStatus and ClusterNetworkPolicy (when served), listed
// once and then watched (the shared reflector: relist on 410 Gone, jittered backoff on errors),
// so that a pass costs no request to read. It holds each node's digests and what proofs they
// gave (../status/realization.ts), what each NetworkPolicyStatus holds, what Weir's conditions
// on each ClusterNetworkPolicy say and on which version, and which watch events bring back our
// own writes: those ask for no pass. Dropped, and started afresh, when the Lease is lost and won
// again.

import type { Backoff } from '../backoff.ts';
import type { Clock } from '../clock.ts';
import type { KubeClient } from '../kube/client.ts';
import { type Codec, rawRefOf } from '../kube/collection.ts';
import { createReflector, DEFAULT_LIST_WATCH_TIMINGS, type ListWatchTimings } from '../kube/reflector.ts';
import type { Logger } from '../log.ts';
import { isRecord } from '../records.ts';
import { clusterPolicyListPath, nodeStatusListPath, policyStatusListPath } from '../status/bodies.ts';
import { ownClusterPolicyConditions, sameConditions } from '../status/cluster-policy-status.ts';
import { type Condition, conditionsKey } from '../status/conditions.ts';
import { nodeDigestOf } from '../status/node-status.ts';
import { parsePolicyStatus, policyStatusKey, samePolicyStatus, sameStrings } from '../status/policy-status.ts';
import type { PolicyStatus, Realization } from '../status/policy-status.ts';
import { createRealizationTracker, encodeDigest } from '../status/realization.ts';
import type { NodeDigest, Realizable } from '../status/realization.ts';

/** A NetworkPolicyStatus as the API server holds it. */
export interface StoredStatus {
  readonly uid: string;
  readonly ownerUids: readonly string[];
  readonly status: PolicyStatus | null;
}

/** A ClusterNetworkPolicy as the API server holds it: the version, and Weir's conditions on it. */
export interface StoredClusterPolicy {
  readonly uid: string;
  readonly generation: number;
  /** The precondition of a status write: it fails (409) once the object has changed. */
  readonly resourceVersion: string;
  /** Weir's conditions (Accepted, Enforced), by type; others' are not kept. */
  readonly conditions: readonly Condition[];
}

export interface PolicyStatusCacheOptions {
  readonly client: KubeClient;
  readonly log: Logger;
  /** The watches' retry delays wait on it, so that tests drive the backoff too. */
  readonly clock: Clock;
  readonly timings: ListWatchTimings;
  readonly backoff: Backoff;
  /** [0, 1): the retry jitter and the randomised watch timings. */
  readonly random: () => number;
  /** Something a pass should look at: a kind listed, a node's digests, or a status somebody
   *  else wrote or deleted (kubectl edit, a stale holder). */
  readonly onChange: () => void;
}

export interface PolicyStatusCache {
  /** Every kind has been listed (or found not served) since the cache started. */
  listed(): boolean;
  /** Each input policy's realization (by uid), from the nodes' latest digests: NetworkPolicies
   *  and ClusterNetworkPolicies in one call, since a node's digests cover both. */
  realizations(policies: readonly Realizable[]): Map<string, Realization>;
  /** What each NetworkPolicyStatus holds, by namespace/name. */
  readonly stored: ReadonlyMap<string, StoredStatus>;
  /** Each ClusterNetworkPolicy, by name. */
  readonly clusterStored: ReadonlyMap<string, StoredClusterPolicy>;
  /** A status write on `name` is in flight that will make it hold these conditions. */
  expectClusterWrite(name: string, uid: string, conditions: readonly Condition[]): void;
  /** Holds what a status write answered, unless the watch brought a version after the one it
   *  was written on (`writtenOn`, its resourceVersion). */
  rememberCluster(name: string, writtenOn: string, answer: unknown): void;
  /** A write in flight will make `key` hold this: its watch event is our own. */
  expectWrite(key: string, content: Pick<StoredStatus, 'ownerUids' | 'status'>): void;
  /** A DELETE of `key` is in flight: its watch event is our own. */
  expectDelete(key: string): void;
  /** Holds what a write answered at once, so that a pass before its watch event arrives does
   *  not write it again. */
  remember(key: string, answer: unknown): void;
  /** `held` was deleted (or found gone): drop it, unless the watch brought something newer. */
  forget(key: string, held: StoredStatus): void;
  /** Stops the watches; resolves once they have ended. */
  stop(): Promise<void>;
}

/** One node's NodePolicyStatus as the aggregator needs it. */
interface NodeEntry {
  readonly uid: string;
  readonly digest: NodeDigest | null;
}

const DELETED = 'DELETED';

/** The ClusterNetworkPolicy watch relists at least this often, so that a CRD installed after the
 *  holder started is found about when the controller's own source finds it. */
const CLUSTER_POLICY_RELIST_MS = DEFAULT_LIST_WATCH_TIMINGS.relistMs;

export function startPolicyStatusCache(o: PolicyStatusCacheOptions): PolicyStatusCache {
  const abort = new AbortController();
  const nodes = new Map<string, NodeEntry>();
  const stored = new Map<string, StoredStatus>();
  const clusterStored = new Map<string, StoredClusterPolicy>();
  /** What our writes in flight will make each object hold (contentKey, or DELETED), until the
   *  watch brings it back; one map per kind. */
  const expecting = new Map<string, Set<string>>();
  const expectingCluster = new Map<string, Set<string>>();
  const listedKinds = new Set<string>();
  const tracker = createRealizationTracker();

  function expect(k: string, content: string, map = expecting): void {
    let set = map.get(k);
    // A write that failed leaves its entry behind; a few are plenty.
    if (set === undefined || set.size > 4) map.set(k, (set = new Set()));
    set.add(content);
  }

  /** Whether a watch event brings what one of our writes made: then it is our own. */
  function unexpect(k: string, content: string, map = expecting): boolean {
    const set = map.get(k);
    if (set === undefined || !set.delete(content)) return false;
    // An empty set per object was most of what this map held at rest.
    if (set.size === 0) map.delete(k);
    return true;
  }

  const deps = {
    client: o.client,
    log: o.log,
    timings: o.timings,
    backoff: o.backoff,
    delay: clockDelay(o.clock),
    random: o.random,
    now: () => performance.now(),
    onWatchEvent: () => {},
  };
  const listed = (kind: string) => () => {
    listedKinds.add(kind);
    o.onChange();
  };
  const nodeReflector = createReflector({ kind: 'NodePolicyStatus', path: nodeStatusListPath() }, nodeCodec, deps, {
    change(node, entry) {
      const old = nodes.get(node);
      // Deleted or re-created: what it proved no longer stands.
      if (old !== undefined && (entry === undefined || entry.uid !== old.uid)) tracker.forgetNode(node);
      if (entry === undefined) nodes.delete(node);
      else nodes.set(node, entry);
      o.onChange();
    },
    listed: listed('NodePolicyStatus'),
  });
  const policyReflector = createReflector({ kind: 'NetworkPolicyStatus', path: policyStatusListPath() }, storedCodec, deps, {
    change(key, entry) {
      const own = unexpect(key, entry === undefined ? DELETED : contentKey(entry));
      if (entry === undefined) stored.delete(key);
      else stored.set(key, entry);
      if (!own) o.onChange();
    },
    listed: listed('NetworkPolicyStatus'),
  });
  // Optional: a cluster without the CRD has none, and is listed again at the relist interval.
  const clusterTimings = { ...o.timings, relistMs: o.timings.relistMs[1] <= CLUSTER_POLICY_RELIST_MS[1] ? o.timings.relistMs : CLUSTER_POLICY_RELIST_MS };
  const clusterReflector = createReflector(
    { kind: 'ClusterNetworkPolicy', path: clusterPolicyListPath(), optional: true },
    clusterCodec,
    { ...deps, timings: clusterTimings },
    {
      change(name, entry) {
        const own = entry !== undefined && unexpect(name, clusterContentKey(entry.uid, entry.conditions), expectingCluster);
        if (entry === undefined) clusterStored.delete(name);
        else clusterStored.set(name, entry);
        if (!own) o.onChange();
      },
      listed: listed('ClusterNetworkPolicy'),
    },
  );
  const loops = Promise.allSettled([nodeReflector.run(abort.signal), policyReflector.run(abort.signal), clusterReflector.run(abort.signal)]);

  return {
    listed: () => listedKinds.size === 3,
    realizations(policies) {
      const digests = new Map<string, NodeDigest>();
      for (const [node, e] of nodes) if (e.digest !== null) digests.set(node, e.digest);
      return tracker.update(policies, digests);
    },
    stored,
    clusterStored,
    expectClusterWrite: (name, uid, conditions) => expect(name, clusterContentKey(uid, conditions), expectingCluster),
    rememberCluster(name, writtenOn, answer) {
      const s = readStoredClusterPolicy(answer);
      const held = clusterStored.get(name);
      // The watch may be ahead (a newer version: keep it) or have brought this very one.
      if (s !== null && (held === undefined || (held.resourceVersion === writtenOn && held.uid === s.uid))) clusterStored.set(name, s);
    },
    expectWrite: (k, content) => expect(k, contentKey(content)),
    expectDelete: (k) => expect(k, DELETED),
    remember(k, answer) {
      const s = readStored(answer);
      // The watch may have brought the same content first: its object is the reflector's too,
      // so keeping it holds one copy instead of two.
      const held = stored.get(k);
      if (s !== null && (held === undefined || !sameStored(held, s))) stored.set(k, s);
    },
    forget(k, held) {
      if (stored.get(k) === held) stored.delete(k);
    },
    async stop() {
      abort.abort();
      await loops;
    },
  };
}

/** Waits on `clock`; resolves early when the signal aborts. */
const clockDelay =
  (clock: Clock) =>
  (ms: number, s: AbortSignal): Promise<void> =>
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

/** What an object holds, regardless of who wrote it when. */
const contentKey = (s: Pick<StoredStatus, 'ownerUids' | 'status'>): string => JSON.stringify([s.ownerUids, s.status === null ? null : policyStatusKey(s.status)]);

function readStored(raw: unknown): StoredStatus | null {
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
const sameStored = (a: StoredStatus, b: StoredStatus): boolean =>
  a.uid === b.uid && sameStrings(a.ownerUids, b.ownerUids) && (a.status === null || b.status === null ? a.status === b.status : samePolicyStatus(a.status, b.status));

/** NetworkPolicyStatus objects by namespace/name. */
const storedCodec: Codec<StoredStatus> = {
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

/** Weir's conditions on a ClusterNetworkPolicy, whatever version holds them. */
const clusterContentKey = (uid: string, conditions: readonly Condition[]): string => JSON.stringify([uid, conditionsKey(conditions)]);

function readStoredClusterPolicy(raw: unknown): StoredClusterPolicy | null {
  if (!isRecord(raw) || !isRecord(raw.metadata)) return null;
  const m = raw.metadata;
  return {
    uid: typeof m.uid === 'string' ? m.uid : '',
    generation: typeof m.generation === 'number' ? m.generation : 0,
    resourceVersion: typeof m.resourceVersion === 'string' ? m.resourceVersion : '',
    conditions: ownClusterPolicyConditions(raw.status),
  };
}

/** ClusterNetworkPolicies by name; only the version and Weir's conditions matter, so the spec is
 *  never held. Every new version is stored (its resourceVersion is the next write's
 *  precondition). */
const clusterCodec: Codec<StoredClusterPolicy> = {
  decode(raw) {
    const ref = rawRefOf(raw, false);
    const value = readStoredClusterPolicy(raw) ?? { uid: ref.uid, generation: 0, resourceVersion: '', conditions: [] };
    return { key: ref.name, name: ref.name, value, warnings: [] };
  },
  same: (a, b) => a.uid === b.uid && a.generation === b.generation && a.resourceVersion === b.resourceVersion && sameConditions(a.conditions, b.conditions),
  ref: (raw) => rawRefOf(raw, false),
};
