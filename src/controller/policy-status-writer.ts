// What the policy status aggregator (./aggregator.ts) writes: a pass computes each policy's
// NetworkPolicyStatus, and Weir's conditions on each ClusterNetworkPolicy, from the latest input
// and the nodes' proofs (./policy-status-cache.ts), applies only what differs from what the API
// server holds, and deletes the statuses whose NetworkPolicy is gone, explicitly rather than
// leaving them to the garbage collector. Passes are paced (src/pacer.ts): one at a time, at most
// one per interval, again with backoff after a failure.

import type { Clock } from '../clock.ts';
import { listHeapGuard } from '../agent/gc.ts';
import { APPLY_PATCH, isStatus } from '../kube/client.ts';
import type { KubeClient } from '../kube/client.ts';
import { compareStrings } from '../model/order.ts';
import { createPacer } from '../pacer.ts';
import type { PassResult } from '../pacer.ts';
import { AGGREGATOR_FIELD_MANAGER, applyQuery, clusterPolicyPath, clusterPolicyStatusBody, deleteBody, policyObjectBody, policyStatusBody, policyStatusPath } from '../status/bodies.ts';
import { buildClusterPolicyConditions, sameConditions } from '../status/cluster-policy-status.ts';
import type { ClusterPolicyStatusInput } from '../status/cluster-policy-status.ts';
import { buildPolicyStatus, samePolicyStatus } from '../status/policy-status.ts';
import type { PolicyStatusInput, Realization } from '../status/policy-status.ts';
import type { PolicyStatusCache, StoredStatus } from './policy-status-cache.ts';

/** What a pass writes from: every NetworkPolicy and ClusterNetworkPolicy, and the holder's cache. */
export interface PolicyStatusWork {
  readonly policies: readonly PolicyStatusInput[];
  readonly clusterPolicies: readonly ClusterPolicyStatusInput[];
  readonly cache: PolicyStatusCache;
}

export interface PolicyStatusWriterOptions {
  readonly client: KubeClient;
  readonly clock: Clock;
  /** Aborts the requests in flight when the aggregator stops. */
  readonly signal: AbortSignal;
  readonly minIntervalMs: number;
  readonly retryMinMs: number;
  readonly retryMaxMs: number;
  /** Whether this replica still holds the Lease: a pass stops writing as soon as it does not. */
  readonly isHolder: () => boolean;
  /** What to write from; null while there is nothing to compute it from. */
  readonly work: () => PolicyStatusWork | null;
  readonly onResult: (result: PassResult, err?: unknown) => void;
  /** V8's collector, if any: see PolicyStatusAggregatorOptions.collectGarbage. */
  readonly collectGarbage: ((compact: boolean) => void) | undefined;
}

export interface PolicyStatusWriter {
  /** Asks for a pass (within the pacing); returns at once. */
  poke(): void;
  /** Cancels the pending pass and waits for a running one. */
  stop(): Promise<void>;
}

const WRITES_IN_FLIGHT = 8;
/** Heap growth during a pass's writes that gets a full collection. */
const WRITE_HEAP_GROWTH = 32 * 2 ** 20;
/** A pass that wrote this many objects is a burst (a new holder, a new cluster): V8's pages
 *  are given back after it. */
const COMPACT_AFTER_WRITES = 1_000;

export function createPolicyStatusWriter(o: PolicyStatusWriterOptions): PolicyStatusWriter {
  const { client, clock, signal, isHolder } = o;
  const q = applyQuery(AGGREGATOR_FIELD_MANAGER);
  const collect = o.collectGarbage;
  const heapGuard = collect && listHeapGuard(collect, { every: 200, growthBytes: WRITE_HEAP_GROWTH });

  async function pass(): Promise<'ok' | 'skipped'> {
    const work = o.work();
    if (work === null) return 'skipped';
    const { policies, clusterPolicies, cache } = work;
    // One call for both kinds: a node's digests cover both, so each is proven against both.
    const realizations = cache.realizations(clusterPolicies.length === 0 ? policies : [...policies, ...clusterPolicies]);
    // In namespace/name order, once per key (the first of the input wins); each key made once.
    const keyed = policies.map((p) => ({ p, k: key(p.namespace, p.name) })).sort((a, b) => compareStrings(a.k, b.k));
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
    const counted = (): void => {
      writes++;
      wrote?.();
    };
    const written = (answer: unknown, k: string): void => {
      cache.remember(k, answer);
      counted();
    };
    try {
      // A few writes in flight: one at a time, a new cluster's statuses take minutes
      // (docs/performance.md).
      await forEachLimited(todo, WRITES_IN_FLIGHT, async ({ p, k }) => {
        // Lost the lease mid-pass: the new holder takes it from here.
        if (!isHolder()) return false;
        const old = cache.stored.get(k);
        const r = realizations.get(p.uid) ?? { desired: 0, realized: 0, pending: [] };
        const next = buildPolicyStatus(p, r, old?.status?.conditions, clock.now());
        if (old === undefined || !old.ownerUids.includes(p.uid)) {
          cache.expectWrite(k, { ownerUids: [p.uid], status: old?.status ?? null });
          written(await client.send({ method: 'PATCH', path: policyStatusPath(p.namespace, p.name), query: q, body: policyObjectBody(p), contentType: APPLY_PATCH, signal }), k);
        }
        const held = cache.stored.get(k);
        if (held?.status == null || !samePolicyStatus(held.status, next)) {
          cache.expectWrite(k, { ownerUids: held?.ownerUids ?? [p.uid], status: next });
          const body = policyStatusBody(p, next);
          written(await client.send({ method: 'PATCH', path: policyStatusPath(p.namespace, p.name, 'status'), query: q, body, contentType: APPLY_PATCH, signal }), k);
        }
        return true;
      });
      if (!isHolder()) return writes > 0 ? 'ok' : 'skipped';
      await forEachLimited(clusterPolicies, WRITES_IN_FLIGHT, async (p) => {
        if (!isHolder()) return false;
        if (await writeClusterPolicy(cache, p, realizations.get(p.uid) ?? { desired: 0, realized: 0, pending: [] })) counted();
        return true;
      });
      if (!isHolder()) return writes > 0 ? 'ok' : 'skipped';
      writes += await deleteOrphans(cache, seen);
      return writes > 0 ? 'ok' : 'skipped';
    } finally {
      // V8 keeps the pages a burst of writes grew its heap to, collected or not, until asked.
      if (writes >= COMPACT_AFTER_WRITES) collect?.(true);
    }
  }

  /** Applies Weir's conditions to a ClusterNetworkPolicy's status when they differ from what it
   *  holds; returns whether it wrote. Only on the version the watch holds of the same object
   *  (uid) at the generation described: otherwise the model or the watch is behind, and the
   *  one catching up asks for another pass. */
  async function writeClusterPolicy(cache: PolicyStatusCache, p: ClusterPolicyStatusInput, r: Realization): Promise<boolean> {
    const held = cache.clusterStored.get(p.name);
    if (held === undefined || held.uid !== p.uid || held.generation !== p.generation) return false;
    const next = buildClusterPolicyConditions(p, r, held.conditions, clock.now());
    if (sameConditions(held.conditions, next)) return false;
    cache.expectClusterWrite(p.name, p.uid, next);
    try {
      const body = clusterPolicyStatusBody(p.name, held.resourceVersion, next);
      const answer = await client.send({ method: 'PATCH', path: clusterPolicyPath(p.name, 'status'), query: q, body, contentType: APPLY_PATCH, signal });
      cache.rememberCluster(p.name, held.resourceVersion, answer);
      return true;
    } catch (err) {
      // Changed since (409: its watch event asks for another pass) or deleted (404).
      if (isStatus(err, 409) || isStatus(err, 404)) return false;
      throw err;
    }
  }

  /** DELETEs every status whose policy is not in the input; returns how many. */
  async function deleteOrphans(cache: PolicyStatusCache, seen: ReadonlySet<string>): Promise<number> {
    let writes = 0;
    // The orphans alone: a copy of the whole map would be garbage every pass.
    const orphans: [string, StoredStatus][] = [];
    for (const [k, s] of cache.stored) if (!seen.has(k)) orphans.push([k, s]);
    for (const [k, s] of orphans) {
      if (!isHolder()) break;
      const [namespace, name] = k.split('/');
      cache.expectDelete(k);
      try {
        await client.send({ method: 'DELETE', path: policyStatusPath(namespace, name), body: s.uid === '' ? undefined : deleteBody(s.uid), signal });
        writes++;
      } catch (err) {
        // Already gone, or re-created since (409: the uid precondition failed; the watch tells).
        if (!isStatus(err, 404) && !isStatus(err, 409)) throw err;
      }
      cache.forget(k, s);
    }
    return writes;
  }

  const pacer = createPacer({ clock, minIntervalMs: o.minIntervalMs, retryMinMs: o.retryMinMs, retryMaxMs: o.retryMaxMs, run: pass, onResult: o.onResult });
  return { poke: () => pacer.poke(), stop: () => pacer.stop() };
}

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
