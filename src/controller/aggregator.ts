// Writes NetworkPolicyStatus objects, and Weir's conditions on each ClusterNetworkPolicy, from
// one controller replica at a time, the Lease holder
// (./elector.ts). While it holds the Lease, a cache lists and watches what it reads
// (./policy-status-cache.ts), and a pass runs when the input or a node's digests change: it
// computes each policy's status from the latest input and the nodes' digests, and applies only
// what differs from what the API server holds (./policy-status-writer.ts).

import { v8Collector } from '../agent/gc.ts';
import { systemClock } from '../clock.ts';
import { createKubeClient } from '../kube/client.ts';
import type { KubeClient } from '../kube/client.ts';
import { DEFAULT_LIST_WATCH_TIMINGS, type ListWatchTimings } from '../kube/reflector.ts';
import { createFailureLog, passReporter } from '../status/failures.ts';
import { DEFAULT_RETRY_MAX_MS, DEFAULT_RETRY_MIN_MS, type PacedWriterOptions } from '../status/pacing.ts';
import type { ClusterPolicyStatusInput } from '../status/cluster-policy-status.ts';
import type { PolicyStatus, PolicyStatusInput } from '../status/policy-status.ts';
import { createLeaseElector } from './elector.ts';
import { longestNotEnforcedMs } from './metrics.ts';
import { type PolicyStatusCache, startPolicyStatusCache } from './policy-status-cache.ts';
import { createPolicyStatusWriter } from './policy-status-writer.ts';

export interface PolicyStatusAggregatorOptions extends PacedWriterOptions {
  /** This replica's identity in the Lease: its pod name. */
  readonly identity: string;
  readonly leaseNamespace?: string;
  readonly leaseName?: string;
  readonly leaseDurationSeconds?: number;
  readonly watchTimings?: Partial<ListWatchTimings>;
  /** [0, 1) like Math.random (the default): the watches' retry jitter and randomised timings. */
  readonly random?: () => number;
  /** V8's collector (agent/gc.ts; `compact` gives the freed pages back): asked for a full
   *  collection whenever a pass's writes have grown the heap by WRITE_HEAP_GROWTH, and for a
   *  compacting one after a pass that wrote COMPACT_AFTER_WRITES objects or more (both in
   *  ./policy-status-writer.ts). Default:
   *  v8Collector(), which is there when Node runs with --expose-gc (the image's flags). */
  readonly collectGarbage?: (compact: boolean) => void;
}

export interface PolicyStatusAggregatorInput {
  /** Every NetworkPolicy in the cluster. */
  readonly policies: readonly PolicyStatusInput[];
  /** Every ClusterNetworkPolicy in the cluster (none: the cluster serves none, or has none). */
  readonly clusterPolicies?: readonly ClusterPolicyStatusInput[];
}

export interface PolicyStatusAggregator {
  /** Starts competing for the Lease. */
  start(): void;
  /** Stores the input (the latest wins); returns at once. Nothing is written, and nothing is
   *  deleted, before the first call: call it once the agent has a synced view. */
  update(input: PolicyStatusAggregatorInput): void;
  /** True while this replica holds the Lease (e.g. to record cluster-wide events only once). */
  isHolder(): boolean;
  /** How long the policy waiting longest has not been Enforced, in ms, from the statuses the
   *  holder's cache holds (./metrics.ts longestNotEnforcedMs); 0 on a replica not holding. */
  notEnforcedMs(): number;
  /** Stops writing and releases the Lease. */
  stop(): Promise<void>;
}

export const DEFAULT_LEASE_NAMESPACE = 'kube-system';
export const DEFAULT_LEASE_NAME = 'weir-policy-status';
export const DEFAULT_LEASE_DURATION_SECONDS = 15;
export const DEFAULT_AGGREGATOR_MIN_INTERVAL_MS = 2_000;

/** The watches of the holder. The relist is a rare safety net (the watch delivers every change;
 *  410 relists at once): a relist reads every NodePolicyStatus, one per node. */
export const DEFAULT_AGGREGATOR_WATCH_TIMINGS: ListWatchTimings = { ...DEFAULT_LIST_WATCH_TIMINGS, relistMs: [1_800_000, 3_600_000] };

const GRANT =
  'list, watch nodepolicystatuses.weir.dev; list, watch, create, patch, delete networkpolicystatuses.weir.dev; patch networkpolicystatuses/status; ' +
  'list, watch clusternetworkpolicies.policy.networking.k8s.io; patch clusternetworkpolicies/status';
const LEASE_GRANT = 'get, create, update on leases.coordination.k8s.io in the lease namespace';

export function createPolicyStatusAggregator(o: PolicyStatusAggregatorOptions): PolicyStatusAggregator {
  const clock = o.clock ?? systemClock;
  const log = o.log.child({ component: 'status', aggregator: o.identity });
  const client: KubeClient = createKubeClient(o.kubeConfig, o.onRequest ? { onRequest: o.onRequest } : {});
  const abort = new AbortController();
  const signal = abort.signal;
  const retryMinMs = o.retryMinMs ?? DEFAULT_RETRY_MIN_MS;
  const retryMaxMs = o.retryMaxMs ?? DEFAULT_RETRY_MAX_MS;
  const timings: ListWatchTimings = { ...DEFAULT_AGGREGATOR_WATCH_TIMINGS, ...o.watchTimings };
  let latest: PolicyStatusAggregatorInput | null = null;
  /** The holder's cache; null while this replica does not hold the Lease. */
  let cache: PolicyStatusCache | null = null;

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
      else void stopWatching();
    },
  });

  const writer = createPolicyStatusWriter({
    client,
    clock,
    signal,
    minIntervalMs: o.minIntervalMs ?? DEFAULT_AGGREGATOR_MIN_INTERVAL_MS,
    retryMinMs,
    retryMaxMs,
    isHolder: () => elector.isHolder(),
    work: () => (latest !== null && cache !== null && elector.isHolder() && cache.listed() ? { policies: latest.policies, clusterPolicies: latest.clusterPolicies ?? [], cache } : null),
    onResult: passReporter(createFailureLog(log, 'policy status', GRANT), signal, o.onWrite),
    collectGarbage: 'collectGarbage' in o ? o.collectGarbage : v8Collector(),
  });

  function startWatching(): void {
    if (cache !== null || signal.aborted) return;
    cache = startPolicyStatusCache({
      client,
      log,
      clock,
      timings,
      backoff: { initialMs: retryMinMs, maxMs: retryMaxMs },
      random: o.random ?? Math.random,
      onChange: poke,
    });
  }

  /** Asks for a pass once there is something to compute it from: an input, and both kinds
   *  listed since this replica became the holder. */
  function poke(): void {
    if (latest !== null && cache?.listed()) writer.poke();
  }

  /** What both kinds' statuses say, for the metric: a ClusterNetworkPolicy's are Weir's conditions on it. */
  function* statusesOf(c: PolicyStatusCache): Generator<{ readonly status: Pick<PolicyStatus, 'conditions' | 'mode'> | null }> {
    yield* c.stored.values();
    for (const p of c.clusterStored.values()) yield { status: { conditions: p.conditions, mode: 'enforce' } };
  }

  /** Drops the cache; resolves once its watches have ended. */
  function stopWatching(): Promise<void> {
    const c = cache;
    cache = null;
    return c?.stop() ?? Promise.resolve();
  }

  return {
    start() {
      elector.start();
    },
    update(input) {
      latest = input;
      poke();
    },
    isHolder: () => elector.isHolder(),
    notEnforcedMs: () => (cache !== null && elector.isHolder() ? longestNotEnforcedMs(statusesOf(cache), clock.now()) : 0),
    async stop() {
      abort.abort();
      const watchesEnded = stopWatching();
      await writer.stop();
      await watchesEnded;
      await elector.stop();
      await client.close();
    },
  };
}
