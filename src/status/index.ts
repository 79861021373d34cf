// The status side channel: enforcement status written back to the cluster as weir.dev/v1alpha1
// custom resources (crds/), plus Events on NetworkPolicies. Nothing here blocks enforcement.

export { createNodeStatusReporter, DEFAULT_HEARTBEAT_MS, DEFAULT_NODE_MIN_INTERVAL_MS } from './node-reporter.ts';
export type { NodeStatusReporter, NodeStatusReporterOptions } from './node-reporter.ts';
export {
  createPolicyStatusAggregator,
  DEFAULT_AGGREGATOR_MIN_INTERVAL_MS,
  DEFAULT_LEASE_DURATION_SECONDS,
  DEFAULT_LEASE_NAME,
  DEFAULT_LEASE_NAMESPACE,
} from './aggregator.ts';
export type { PolicyStatusAggregator, PolicyStatusAggregatorInput, PolicyStatusAggregatorOptions } from './aggregator.ts';
export { createEventRecorder, DEFAULT_EVENT_WINDOW_MS } from './events.ts';
export type { EventRecorder, EventRecorderOptions } from './events.ts';
export type { EventType } from './bodies.ts';
export type { Clock } from '../clock.ts';
export type { PassResult } from '../pacer.ts';
export type { ApplyOutcome, EnforcedPolicy, NodeCounts, NodeProblem, NodeStatusInput, PolicyRef } from './node-status.ts';
export type { PolicyStatusInput } from './policy-status.ts';
