// What a Calculator is built with, and what it reports about policies.

import type { AuditLevel, CompiledPolicy, Enforcement, Family } from '../model/types.ts';
import type { Match } from './desired.ts';
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
  /** Under that cap, a bucket per source address (shared by every rule), so that one noisy
   *  source cannot spend the node's for the others. Absent: the node's bucket alone. */
  readonly perSource?: { readonly perSecond: number; readonly burst: number };
}

/** How often the kernel sweeps expired addresses out of a hashlimit table (its default), ms. */
const HASHLIMIT_SWEEP_MS = 1000;
/** The most addresses the kernel lets a hashlimit table hold: it silently cuts a larger max. */
export const HASHLIMIT_TABLE_LIMIT = 1 << 20;

/**
 * The limit every audit rule ends with: the node's bucket, then, with perSource, one bucket per
 * source address. A full per-source table would drop the packet (the kernel's hashlimit), even
 * one an allowing rule was about to accept, so the table is sized so that it never fills: only
 * packets the node's bucket let through reach it (perSecond, plus its burst), and an address
 * stays at most expireMs plus one sweep after its last packet.
 */
export function auditLimit(prefix: string, audit: AuditConfig): Match & { readonly kind: 'limit' } {
  const node = { kind: 'limit', name: `${prefix}-an`, perSecond: audit.perSecond, burst: audit.burst } as const;
  const s = audit.perSource;
  if (s === undefined) return node;
  // Once its bucket would be full again, an address's entry carries nothing a new one would not.
  const expireMs = Math.ceil((1000 * s.burst) / s.perSecond);
  const tableMax = Math.ceil((audit.perSecond * (expireMs + HASHLIMIT_SWEEP_MS)) / 1000) + audit.burst;
  if (tableMax > HASHLIMIT_TABLE_LIMIT)
    throw new RangeError(`audit per-source table of ${tableMax} addresses is more than the kernel's ${HASHLIMIT_TABLE_LIMIT}: lower the node's rate (${audit.perSecond}/s, burst ${audit.burst})`);
  return { ...node, perSource: { name: `${prefix}-as`, perSecond: s.perSecond, burst: s.burst, tableMax, expireMs } };
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
