// The controller's metrics: its status writes and leadership, and what the status objects say
// that alerts and dashboards need without a Kubernetes client of their own: each node's
// conditions and last sync time, and how long the policy waiting longest has not been
// Enforced. Those are read at scrape time from what the controller already holds.

import { Counter, Gauge, type Registry } from 'prom-client';
import type { PolicyStatus } from '../status/policy-status.ts';
import type { NodeReport } from './node-reports.ts';

/** The NodePolicyStatus conditions served; anything else a status holds is left out. */
export const NODE_CONDITIONS: ReadonlySet<string> = new Set(['Ready', 'Programmed', 'Degraded']);

export interface ControllerMetricSources {
  /** Every node's latest report. */
  nodes(): Iterable<Pick<NodeReport, 'node' | 'conditions' | 'lastSyncTime'>>;
  /** See PolicyStatusAggregator.notEnforcedMs. */
  notEnforcedMs(): number;
}

export interface ControllerMetrics {
  readonly statusWrites: Counter<'kind' | 'result'>;
  readonly leader: Gauge;
}

export function createControllerMetrics(registry: Registry, sources: ControllerMetricSources): ControllerMetrics {
  const registers = [registry];
  new Gauge({
    name: 'weir_node_status_condition',
    help: "A condition of each node's NodePolicyStatus (Ready, Programmed, Degraded): 1 when True, 0 when False or Unknown",
    labelNames: ['node', 'condition'],
    registers,
    collect() {
      this.reset();
      for (const r of sources.nodes()) for (const c of r.conditions) if (NODE_CONDITIONS.has(c.type)) this.set({ node: r.node, condition: c.type }, c.status === 'True' ? 1 : 0);
    },
  });
  new Gauge({
    name: 'weir_node_status_last_sync_timestamp_seconds',
    help: "Each node's NodePolicyStatus lastSyncTime (its agent's last successful write, refreshed in the status at least every heartbeat), Unix seconds; absent while it has none",
    labelNames: ['node'],
    registers,
    collect() {
      this.reset();
      for (const r of sources.nodes()) if (r.lastSyncTime !== null) this.set({ node: r.node }, r.lastSyncTime / 1000);
    },
  });
  new Gauge({
    name: 'weir_policy_not_enforced_seconds',
    help: 'How long the policy waiting longest has not been Enforced (its NetworkPolicyStatus, or the ClusterNetworkPolicy itself, Enforced False since its lastTransitionTime; audit-only policies left out); 0 when none waits, or on a replica not writing status',
    registers,
    collect() {
      this.set(sources.notEnforcedMs() / 1000);
    },
  });
  return {
    statusWrites: new Counter({ name: 'weir_status_writes_total', help: 'Status object writes, by kind and result', labelNames: ['kind', 'result'], registers }),
    leader: new Gauge({ name: 'weir_controller_leader', help: '1 while this replica holds the controller Lease and writes status', registers }),
  };
}

/** How long the policy waiting longest has not been Enforced, in ms, from the statuses as
 *  written: Enforced False since its lastTransitionTime, which moves when a change (a new
 *  generation, a pod on a new node) makes it False. Audit-only policies are never Enforced by
 *  design, so they never wait. 0 when none waits. */
export function longestNotEnforcedMs(stored: Iterable<{ readonly status: Pick<PolicyStatus, 'conditions' | 'mode'> | null }>, nowMs: number): number {
  let oldest = Number.POSITIVE_INFINITY;
  for (const { status } of stored) {
    if (status === null || status.mode === 'audit') continue;
    const enforced = status.conditions.find((c) => c.type === 'Enforced');
    if (enforced === undefined || enforced.status === 'True') continue;
    const since = Date.parse(enforced.lastTransitionTime);
    if (Number.isFinite(since) && since < oldest) oldest = since;
  }
  return oldest === Number.POSITIVE_INFINITY ? 0 : Math.max(0, nowMs - oldest);
}
