// Conformance: ClusterNetworkPolicy tiers (policy.networking.k8s.io/v1beta1) with and against
// NetworkPolicies, proved with real packets in both families. Each predicate is written by
// hand from the API's evaluation order: Admin tier by priority (first match decides; Pass
// leaves the tier), then NetworkPolicy, then the Baseline tier (only for pods no
// NetworkPolicy isolates), then allow; its protocols (port numbers, ranges, named ports); and
// from docs/behaviour.md for what the API leaves open (an invalid policy fails closed). The
// tables live in explain-scenarios.ts, where weir explain is checked over them too.

import { after, before, describe, test } from 'node:test';
import { CLUSTER_NETWORK_POLICY_SCENARIOS, playScenario } from './explain-scenarios.ts';
import { Conformance } from './harness.ts';

describe('conformance: ClusterNetworkPolicy tiers', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wcnp');
  });
  after(async () => {
    await c?.stop();
  });

  for (const s of CLUSTER_NETWORK_POLICY_SCENARIOS) test(s.name, () => playScenario(c, s));
});
