// Status reporting, hung on the reconcile loop's onPass: what this node enforces goes to its
// NodePolicyStatus, the one object an agent writes. Whatever concerns a policy across nodes
// (NetworkPolicyStatus, Events) is the controller's (src/controller/), made from these.
// Everything here is fire-and-forget: the writer rate-limits and retries on its own, and never
// blocks or fails enforcement.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Calculator } from '../calc/index.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { formatPolicyErrors } from '../model/policy-errors.ts';
import { createNodeStatusReporter, type EnforcedPolicy, type NodeProblem } from '../status/index.ts';
import type { FailingPolicy } from '../status/node-status.ts';
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
}

export interface Reporting {
  onPass(outcome: PassOutcome): void;
  stop(): Promise<void>;
}

/** Policies remembered while applies fail; the status lists the first 20 of them. */
const MAX_REMEMBERED_FAILURES = 1_000;

export function startReporting(d: ReportingDeps): Reporting {
  const written = (kind: string) => (result: string) => d.metrics.statusWrites.inc({ kind, result });
  const node = createNodeStatusReporter({ kubeConfig: d.kubeConfig, nodeName: d.nodeName, log: d.log, onWrite: written('NodePolicyStatus') });
  // The changes the failing applies carried, by policy uid: a retry pass carries no change of
  // its own, yet the same ones are still not applied.
  const failures = new Map<string, FailingPolicy>();

  return {
    onPass(outcome) {
      if (outcome.ok) failures.clear();
      else {
        for (const { policy } of outcome.policyChanges) {
          if (policy === null || (failures.size >= MAX_REMEMBERED_FAILURES && !failures.has(policy.uid))) continue;
          const error = `could not apply generation ${policy.generation} (will retry): ${outcome.error ?? 'unknown error'}`;
          failures.set(policy.uid, { namespace: policy.namespace, name: policy.name, uid: policy.uid, generation: policy.generation, error });
        }
      }
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
        applyFailures: [...failures.values()],
      });
    },
    async stop() {
      await node.stop();
    },
  };
}
