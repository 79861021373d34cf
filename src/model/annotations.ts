// Weir's own annotations, on Namespaces and (Cluster)NetworkPolicies. Sources keep only keys with this
// prefix; the model reads them here.

import type { AuditLevel, Enforcement, Labels, PolicyError } from './types.ts';

export const ANNOTATION_PREFIX = 'weir.dev/';
/** `deny` logs drops, `all` drops and allows, `off` nothing: on a Namespace for every policy of
 *  it, on a NetworkPolicy for that policy's rules (overriding its namespace). */
export const AUDIT_ANNOTATION = 'weir.dev/audit';
/** `audit` on a NetworkPolicy: evaluate and log it, never enforce it. `enforce` is the default. */
export const ENFORCEMENT_ANNOTATION = 'weir.dev/enforcement';
/** `true` on a Namespace or a (Cluster)NetworkPolicy: after a write, the tracked connections of
 *  the pods it covers that their new rules deny are deleted (docs/behaviour.md). */
export const CUT_EXISTING_ANNOTATION = 'weir.dev/cut-existing';

export const AUDIT_LEVELS: readonly AuditLevel[] = ['off', 'deny', 'all'];
const ENFORCEMENTS: readonly Enforcement[] = ['enforce', 'audit'];

/** Only Weir's annotations, sorted, so that other annotations never produce a model event. */
export function weirAnnotations(all: Labels): Labels {
  const out: Record<string, string> = {};
  for (const key of Object.keys(all).sort()) if (key.startsWith(ANNOTATION_PREFIX)) out[key] = all[key];
  return out;
}

export function parseAuditLevel(value: string): AuditLevel | null {
  return (AUDIT_LEVELS as readonly string[]).includes(value) ? (value as AuditLevel) : null;
}

/**
 * A Namespace's level. One that cannot be read logs everything: a typo must not hide the
 * evidence a security team asked for, and more lines never change a verdict.
 */
export function namespaceAuditLevel(value: string | undefined): AuditLevel | null {
  if (value === undefined) return null;
  return parseAuditLevel(value.trim()) ?? 'all';
}

/** A Namespace's opt-in. A value other than true or false counts as true: the cut only ends
 *  connections the policies already deny, so a typo must not leave them running. */
export function namespaceCutsExisting(value: string | undefined): boolean {
  return value !== undefined && value.trim() !== 'false';
}

const annotationPath = (key: string) => `metadata.annotations[${JSON.stringify(key)}]`;

/** A policy's annotations. A value that cannot be read is an error: the policy is then invalid
 *  and enforced (it isolates what it selects), never silently switched to audit-only. Other
 *  weir.dev/ keys are ignored (a misspelt enforcement key leaves the policy enforced). */
export function readPolicyAnnotations(annotations: Labels | undefined, errors: PolicyError[]): { audit: AuditLevel | null; enforcement: Enforcement; cutExisting?: true } {
  let audit: AuditLevel | null = null;
  let enforcement: Enforcement = 'enforce';
  let cutExisting = false;
  for (const [key, value] of Object.entries(annotations ?? {})) {
    if (key === CUT_EXISTING_ANNOTATION) {
      if (value === 'true' || value === 'false') cutExisting = value === 'true';
      else errors.push({ path: annotationPath(key), message: `must be true or false, got ${JSON.stringify(value)}` });
    }
    if (key === AUDIT_ANNOTATION) {
      audit = parseAuditLevel(value);
      if (audit === null) errors.push({ path: annotationPath(key), message: `must be one of ${AUDIT_LEVELS.join(', ')}, got ${JSON.stringify(value)}` });
    } else if (key === ENFORCEMENT_ANNOTATION) {
      if ((ENFORCEMENTS as readonly string[]).includes(value)) enforcement = value as Enforcement;
      else errors.push({ path: annotationPath(key), message: `must be one of ${ENFORCEMENTS.join(', ')}, got ${JSON.stringify(value)}` });
    }
  }
  return { audit, enforcement, ...(cutExisting ? { cutExisting: true as const } : {}) };
}
