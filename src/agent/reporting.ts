// Status reporting, hung on the reconcile loop's onPass: what this node enforces goes to its
// NodePolicyStatus, the Lease holder aggregates NetworkPolicyStatus objects, and rejections
// and failed writes become Events. Everything here is fire-and-forget: the status writers
// rate-limit and retry on their own, and never block or fail enforcement.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Calculator } from '../calc/index.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { formatPolicyErrors, INVALID_POLICY_EFFECT } from '../model/policy-errors.ts';
import { createEventRecorder, createNodeStatusReporter, createPolicyStatusAggregator, type EnforcedPolicy, type NodeProblem, type PolicyStatusInput } from '../status/index.ts';
import type { PassOutcome } from './reconciler.ts';

export interface ReportingDeps {
  readonly kubeConfig: KubeConfig;
  readonly nodeName: string;
  readonly calc: Calculator;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly synced: () => boolean;
  readonly counts: () => { sets: number; chains: number; rules: number };
  /** Node-level problems found at start-up (br_netfilter off, ...). */
  readonly problems: readonly NodeProblem[];
  /** How often the Lease holder recomputes every policy's desired nodes. */
  readonly aggregateEveryMs?: number;
}

export interface Reporting {
  onPass(outcome: PassOutcome): void;
  stop(): Promise<void>;
}

export function startReporting(d: ReportingDeps): Reporting {
  const written = (kind: string) => (result: string) => d.metrics.statusWrites.inc({ kind, result });
  const node = createNodeStatusReporter({ kubeConfig: d.kubeConfig, nodeName: d.nodeName, log: d.log, onWrite: written('NodePolicyStatus') });
  const aggregator = createPolicyStatusAggregator({ kubeConfig: d.kubeConfig, identity: d.nodeName, log: d.log, onWrite: written('NetworkPolicyStatus') });
  const events = createEventRecorder({ kubeConfig: d.kubeConfig, component: 'weir-agent', host: d.nodeName, log: d.log, onWrite: written('Event') });
  aggregator.start();
  // Every policy in the cluster with the nodes that must enforce it: O(policies x pods of
  // their namespaces), so only the Lease holder does it, at most once per interval, and only
  // when the model changed since or it has just become the holder (a periodic resync or a
  // retry changes nothing it reads).
  let changed = true;
  let wasHolder = false;
  const aggregate = () => {
    const holder = aggregator.isHolder();
    const due = holder && d.synced() && (changed || !wasHolder);
    wasHolder = holder;
    if (!due) return;
    changed = false;
    const cluster = d.calc.cluster;
    const policies: PolicyStatusInput[] = [];
    for (const p of cluster.policies.values()) {
      policies.push({
        namespace: p.namespace,
        name: p.name,
        uid: p.uid,
        generation: p.generation,
        accepted: p.errors.length === 0 ? { ok: true, message: 'the policy is valid and supported' } : { ok: false, message: formatPolicyErrors(p.errors) },
        desiredNodes: cluster.nodesEnforcing(p),
        mode: p.enforcement,
      });
    }
    aggregator.update({ policies });
  };
  const aggregateTimer = setInterval(aggregate, d.aggregateEveryMs ?? 2000);
  aggregateTimer.unref();

  return {
    onPass(outcome) {
      const enforced: EnforcedPolicy[] = [];
      for (const r of d.calc.enforcedPolicyReports()) {
        const [namespace, name] = [r.key.slice(0, r.key.indexOf('/')), r.key.slice(r.key.indexOf('/') + 1)];
        enforced.push({ namespace, name, uid: r.uid, generation: r.generation, ...(r.errors.length > 0 ? { error: formatPolicyErrors(r.errors) } : {}) });
      }
      node.update({
        synced: d.synced(),
        lastApply: outcome.ok ? { ok: true } : { ok: false, message: outcome.error ?? 'unknown error' },
        lastSyncTime: outcome.ok ? Date.now() : null,
        counts: { localPods: d.calc.localPodCount, policies: enforced.length, ...d.counts() },
        policies: enforced,
        problems: d.problems,
      });
      // Every agent validates every policy; only the Lease holder tells the policy about it,
      // so a rejection is one Event, not one per node.
      for (const { policy } of outcome.policyChanges) {
        if (!policy) continue;
        const ref = { namespace: policy.namespace, name: policy.name, uid: policy.uid };
        if (policy.errors.length > 0 && aggregator.isHolder()) {
          events.record(ref, 'Warning', 'PolicyRejected', `invalid: it ${INVALID_POLICY_EFFECT}: ${formatPolicyErrors(policy.errors)}`);
        }
        if (!outcome.ok) events.record(ref, 'Warning', 'ApplyFailed', `node ${d.nodeName} could not apply this change yet (will retry): ${outcome.error ?? ''}`);
      }
      if (outcome.modelChanged) changed = true;
    },
    async stop() {
      clearInterval(aggregateTimer);
      await Promise.allSettled([node.stop(), aggregator.stop(), events.stop()]);
    },
  };
}
