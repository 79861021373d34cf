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
import { ApplyFailures } from './apply-failures.ts';
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
  /** Says that the node's rules were removed for this uninstall; later passes are not reported. */
  removed(token: string): void;
  onPass(outcome: PassOutcome): void;
  stop(): Promise<void>;
}

export function startReporting(d: ReportingDeps): Reporting {
  const written = (kind: string) => (result: string) => d.metrics.statusWrites.inc({ kind, result });
  const node = createNodeStatusReporter({ kubeConfig: d.kubeConfig, nodeName: d.nodeName, log: d.log, onWrite: written('NodePolicyStatus') });
  const failures = new ApplyFailures();
  let removed = false;
  /** The ClusterNetworkPolicies this node enforces, as of the last pass that changed the model:
   *  which subjects hold a local pod changes with model events only. */
  let clusterPolicies: EnforcedPolicy[] = [];
  /** What the last successful write put in the kernel: a failed write leaves it as it was
   *  (every write is atomic), so that is what a failed pass reports. */
  let held: EnforcedPolicy[] = [];

  return {
    removed(token) {
      removed = true;
      const counts = { localPods: 0, policies: 0, sets: 0, chains: 0, rules: 0 };
      node.update({ synced: true, lastApply: { ok: true }, lastSyncTime: Date.now(), counts, policies: [], removedFor: token });
    },
    onPass(outcome) {
      if (removed) return;
      const applyFailures = failures.record(outcome);
      const enforced: EnforcedPolicy[] = [];
      for (const r of d.calc.enforcedPolicyReports()) {
        const [namespace, name] = [r.key.slice(0, r.key.indexOf('/')), r.key.slice(r.key.indexOf('/') + 1)];
        enforced.push({ namespace, name, uid: r.uid, generation: r.generation, ...(r.errors.length > 0 ? { error: formatPolicyErrors(r.errors) } : {}) });
      }
      // Cluster-scoped: namespace ''. Their uids share the digest with the NetworkPolicies'.
      if (outcome.modelChanged) {
        clusterPolicies = d.calc
          .enforcedClusterPolicyReports()
          .map((r) => ({ namespace: '', name: r.name, uid: r.uid, generation: r.generation, ...(r.errors.length > 0 ? { error: formatPolicyErrors(r.errors) } : {}) }));
      }
      for (const p of clusterPolicies) enforced.push(p);
      if (outcome.ok) held = enforced;
      node.update({
        synced: d.synced(),
        lastApply: outcome.ok ? { ok: true } : { ok: false, message: outcome.error ?? 'unknown error' },
        lastSyncTime: outcome.ok ? Date.now() : null,
        counts: { localPods: d.calc.localPodCount, policies: held.length, ...d.counts() },
        policies: held,
        problems: d.problems,
        applyFailures,
      });
    },
    async stop() {
      await node.stop();
    },
  };
}
