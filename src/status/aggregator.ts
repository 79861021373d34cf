// Writes NetworkPolicyStatus objects from one agent at a time (the Lease holder). Each pass
// lists every NodePolicyStatus and NetworkPolicyStatus (a periodic list, every minIntervalMs
// while holding the lease), computes each policy's status from the agent's latest input, and
// applies only what differs from what the API server holds. Orphans (their NetworkPolicy is
// gone) are deleted explicitly rather than left to the garbage collector.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from '../log.ts';
import {
  AGGREGATOR_FIELD_MANAGER,
  applyQuery,
  deleteBody,
  nodeStatusListPath,
  policyObjectBody,
  policyStatusBody,
  policyStatusListPath,
  policyStatusPath,
} from './bodies.ts';
import { systemClock } from './clock.ts';
import type { Clock } from './clock.ts';
import { createLeaseElector } from './elector.ts';
import { createFailureLog } from './failures.ts';
import { APPLY_PATCH, createKubeClient, isStatus } from '../kube/client.ts';
import type { RequestRecord } from '../kube/client.ts';
import { createPacer } from './pacer.ts';
import type { PassResult } from './pacer.ts';
import { DEFAULT_RETRY_MAX_MS, DEFAULT_RETRY_MIN_MS } from './pacing.ts';
import { buildPolicyStatus, parsePolicyStatus, policyStatusKey, realizationsFromList, realize } from './policy-status.ts';
import type { PolicyStatus, PolicyStatusInput } from './policy-status.ts';

export interface PolicyStatusAggregatorOptions {
  readonly kubeConfig: KubeConfig;
  /** This agent's identity in the Lease: its node name. */
  readonly identity: string;
  readonly log: Logger;
  readonly clock?: Clock;
  readonly leaseNamespace?: string;
  readonly leaseName?: string;
  readonly leaseDurationSeconds?: number;
  /** Passes (two lists, then the writes) run at most this often, and this often while holding. */
  readonly minIntervalMs?: number;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  readonly onWrite?: (result: PassResult) => void;
  /** Sees every request the writer sends (e.g. to count them). */
  readonly onRequest?: (r: RequestRecord) => void;
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
  /** True while this agent holds the Lease (e.g. to record cluster-wide events only once). */
  isHolder(): boolean;
  /** Stops writing and releases the Lease. */
  stop(): Promise<void>;
}

export const DEFAULT_LEASE_NAMESPACE = 'kube-system';
export const DEFAULT_LEASE_NAME = 'weir-policy-status';
export const DEFAULT_LEASE_DURATION_SECONDS = 15;
export const DEFAULT_AGGREGATOR_MIN_INTERVAL_MS = 2_000;

const GRANT = 'list nodepolicystatuses.weir.dev; list, create, patch, delete networkpolicystatuses.weir.dev; patch networkpolicystatuses/status';
const LEASE_GRANT = 'get, create, update on leases.coordination.k8s.io in the lease namespace';

interface Stored {
  readonly uid: string;
  readonly ownerUids: readonly string[];
  readonly status: PolicyStatus | null;
}

export function createPolicyStatusAggregator(o: PolicyStatusAggregatorOptions): PolicyStatusAggregator {
  const clock = o.clock ?? systemClock;
  const log = o.log.child({ component: 'status', aggregator: o.identity });
  const client = createKubeClient(o.kubeConfig, o.onRequest ? { onRequest: o.onRequest } : {});
  const failures = createFailureLog(log, 'policy status', GRANT);
  const abort = new AbortController();
  const signal = abort.signal;
  const q = applyQuery(AGGREGATOR_FIELD_MANAGER);
  let latest: PolicyStatusAggregatorInput | null = null;

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
      if (holder) pacer.poke();
    },
  });

  async function pass(): Promise<'ok' | 'skipped'> {
    const input = latest;
    if (input === null || !elector.isHolder()) return 'skipped';
    const nodes = realizationsFromList(await client.send({ method: 'GET', path: nodeStatusListPath(), signal }));
    const stored = readStored(await client.send({ method: 'GET', path: policyStatusListPath(), signal }));
    let writes = 0;
    const seen = new Set<string>();
    for (const p of [...input.policies].sort((a, b) => cmp(key(a.namespace, a.name), key(b.namespace, b.name)))) {
      const k = key(p.namespace, p.name);
      if (seen.has(k)) continue;
      seen.add(k);
      // Lost the lease mid-pass: the new holder takes it from here.
      if (!elector.isHolder()) return writes > 0 ? 'ok' : 'skipped';
      const old = stored.get(k);
      const next = buildPolicyStatus(p, realize(p, nodes), old?.status?.conditions, clock.now());
      if (old === undefined || !old.ownerUids.includes(p.uid)) {
        await client.send({ method: 'PATCH', path: policyStatusPath(p.namespace, p.name), query: q, body: policyObjectBody(p), contentType: APPLY_PATCH, signal });
        writes++;
      }
      if (old?.status == null || policyStatusKey(old.status) !== policyStatusKey(next)) {
        await client.send({
          method: 'PATCH',
          path: policyStatusPath(p.namespace, p.name, 'status'),
          query: q,
          body: policyStatusBody(p, next),
          contentType: APPLY_PATCH,
          signal,
        });
        writes++;
      }
    }
    for (const [k, s] of stored) {
      if (seen.has(k)) continue;
      if (!elector.isHolder()) break;
      const [namespace, name] = k.split('/');
      try {
        await client.send({ method: 'DELETE', path: policyStatusPath(namespace, name), body: s.uid === '' ? undefined : deleteBody(s.uid), signal });
        writes++;
      } catch (err) {
        // Already gone, or re-created since the list (409: the uid precondition failed).
        if (!isStatus(err, 404) && !isStatus(err, 409)) throw err;
      }
    }
    return writes > 0 ? 'ok' : 'skipped';
  }

  const pacer = createPacer({
    clock,
    minIntervalMs: o.minIntervalMs ?? DEFAULT_AGGREGATOR_MIN_INTERVAL_MS,
    retryMinMs: o.retryMinMs ?? DEFAULT_RETRY_MIN_MS,
    retryMaxMs: o.retryMaxMs ?? DEFAULT_RETRY_MAX_MS,
    run: pass,
    onResult: (result, err) => {
      if (result === 'error') {
        if (!signal.aborted) failures.failed(err);
      } else failures.succeeded();
      // Poll the nodes' progress while holding: another pass after minIntervalMs.
      if (result !== 'error' && latest !== null && elector.isHolder()) pacer.poke();
      o.onWrite?.(result);
    },
  });

  return {
    start() {
      elector.start();
    },
    update(input) {
      latest = input;
      pacer.poke();
    },
    isHolder: () => elector.isHolder(),
    async stop() {
      abort.abort();
      await pacer.stop();
      await elector.stop();
      await client.close();
    },
  };
}

const key = (namespace: string, name: string): string => `${namespace}/${name}`;
const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** NetworkPolicyStatus objects by namespace/name. */
function readStored(list: unknown): Map<string, Stored> {
  const out = new Map<string, Stored>();
  const items = (list as { items?: unknown } | null)?.items;
  if (!Array.isArray(items)) return out;
  for (const item of items as unknown[]) {
    const o = item as {
      metadata?: { name?: unknown; namespace?: unknown; uid?: unknown; ownerReferences?: { uid?: unknown }[] };
      status?: unknown;
    } | null;
    const m = o?.metadata;
    if (typeof m?.name !== 'string' || typeof m.namespace !== 'string') continue;
    out.set(key(m.namespace, m.name), {
      uid: typeof m.uid === 'string' ? m.uid : '',
      ownerUids: (m.ownerReferences ?? []).map((r) => r?.uid).filter((u): u is string => typeof u === 'string'),
      status: parsePolicyStatus(o?.status),
    });
  }
  return out;
}
