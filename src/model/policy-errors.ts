// The one wording of an invalid policy's errors, for logs, Events, status and `weir render`.
// Pure.

import type { PolicyError } from './types.ts';

/** One line per error: `<field path>: <message>`. */
export function policyErrorLines(errors: readonly PolicyError[]): string[] {
  return errors.map((e) => `${e.path}: ${e.message}`);
}

/** Every error on one line, separated by `; `. */
export function formatPolicyErrors(errors: readonly PolicyError[]): string {
  return policyErrorLines(errors).join('; ');
}

/** What an invalid policy means for traffic, the same everywhere it is told. */
export const INVALID_POLICY_EFFECT = 'adds no allowance; the pods it selects stay isolated';

/** What an invalid ClusterNetworkPolicy means for traffic (cluster-network-policy.ts). */
export const INVALID_CLUSTER_POLICY_EFFECT = 'denies all traffic of the pods it selects in each direction it has rules for, at its tier and priority';
