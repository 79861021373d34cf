// The status side channel: enforcement status written back to the cluster as weir.dev/v1alpha1
// custom resources (crds/). Nothing here blocks enforcement. This folder holds the agent's writer
// (its node's NodePolicyStatus) and what agent and controller share; the controller's writers
// (NetworkPolicyStatus, Events) are in src/controller/.

export { createNodeStatusReporter, DEFAULT_HEARTBEAT_MS, DEFAULT_NODE_MIN_INTERVAL_MS } from './node-reporter.ts';
export type { NodeStatusReporter, NodeStatusReporterOptions } from './node-reporter.ts';
export type { Clock } from '../clock.ts';
export type { PassResult } from '../pacer.ts';
export type { ApplyOutcome, EnforcedPolicy, NodeCounts, NodeProblem, NodeStatusInput, PolicyRef } from './node-status.ts';
export type { PolicyStatusInput } from './policy-status.ts';
