// What a Calculator is built with, and what it reports about policies.

import type { AuditLevel, CompiledPolicy, Enforcement, Family } from '../model/types.ts';
import type { Names } from './names.ts';
import type { AllowAction, MarkBits } from './rules.ts';

export interface CalcConfig {
  readonly nodeName: string;
  readonly names: Names;
  readonly families: readonly Family[];
  readonly marks: MarkBits;
  /** The bridge local pods hang off; traffic through it of no known pod is dropped. Default
   *  '' (none): then only this node's pod CIDRs fail closed. */
  readonly podBridge?: string;
  /** Default ACCEPT. */
  readonly allowAction?: AllowAction;
  /** Bind each local pod's address to its bridge port (PodInterface events): a pod may send
   *  only from its own address through its own port, and not before its port is known. */
  readonly sourceBinding?: boolean;
  /** Audit log rules (NFLOG); absent: none are written, and audit-only policies only stay
   *  unenforced. */
  readonly audit?: AuditConfig;
}

export interface AuditConfig {
  /** The NFLOG group the agent's reader listens on. */
  readonly group: number;
  /** The level of policies whose namespace and own annotations say nothing. */
  readonly defaultLevel: AuditLevel;
  /** Kernel-side cap on events per second on this node, per family (one bucket for every rule). */
  readonly perSecond: number;
  readonly burst: number;
}

/** What the status reporter and logs want to know about a policy on this node. */
export interface PolicyReport {
  readonly key: string;
  readonly uid: string;
  readonly generation: number;
  readonly errors: CompiledPolicy['errors'];
  /** Local pods it selects. */
  readonly localPods: number;
  /** 'audit': evaluated and logged, never enforced. */
  readonly enforcement: Enforcement;
  /** What its rules log on this node (its annotation, else its namespace's, else the default). */
  readonly auditLevel: AuditLevel;
}
