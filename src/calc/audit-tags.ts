// What an audit NFLOG rule means. calc gives every audit rule a short NFLOG prefix and keeps
// the tag it stands for; the audit pipeline (src/audit/) reads events by that prefix.

import type { Direction } from './rules.ts';

export type { AuditLevel } from '../model/types.ts';
import type { CnpTier } from '../model/types.ts';

export type AuditVerdict = 'allow' | 'deny' | 'would-deny';

export interface PolicyRef {
  readonly namespace: string;
  readonly name: string;
}

/** A rule of a ClusterNetworkPolicy (cluster-scoped: no namespace). */
export interface ClusterPolicyRuleRef {
  readonly kind: 'ClusterNetworkPolicy';
  readonly name: string;
  readonly tier: CnpTier;
  /** Its index in spec.ingress or spec.egress; -1: the deny-all of an invalid policy. */
  readonly rule: number;
}

export interface AuditTag {
  readonly verdict: AuditVerdict;
  readonly direction: Direction;
  /** The rule that allowed (or, for a ClusterNetworkPolicy, denied) the connection; null for a
   *  drop (or would-drop) no rule caused. */
  readonly policy: (PolicyRef & { readonly rule: number }) | ClusterPolicyRuleRef | null;
  /** Set when policy is null: no policy allows the connection to or from an isolated pod. */
  readonly reason?: 'default-deny';
  /** For default-deny: the policies that isolate the pod in this direction, sorted. */
  readonly isolatedBy?: readonly PolicyRef[];
}

/** Reads an NFLOG prefix back to its tag; undefined for a prefix this agent never wrote. */
export interface AuditCatalog {
  lookup(prefix: string): AuditTag | undefined;
}
