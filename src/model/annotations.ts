// Weir's own annotations, on Namespaces and NetworkPolicies. Sources keep only keys with this
// prefix; the model reads them here.

import type { AuditLevel, Enforcement, Labels, PolicyError } from './types.ts';

export const ANNOTATION_PREFIX = 'weir.dev/';
/** `deny` logs drops, `all` drops and allows, `off` nothing: on a Namespace for every policy of
 *  it, on a NetworkPolicy for that policy's rules (overriding its namespace). */
export const AUDIT_ANNOTATION = 'weir.dev/audit';
/** `audit` on a NetworkPolicy: evaluate and log it, never enforce it. `enforce` is the default. */
export const ENFORCEMENT_ANNOTATION = 'weir.dev/enforcement';

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

const annotationPath = (key: string) => `metadata.annotations[${JSON.stringify(key)}]`;

/** A policy's annotations. A value that cannot be read is an error: the policy is then invalid
 *  and enforced (it isolates what it selects), never silently switched to audit-only. Other
 *  weir.dev/ keys are ignored (a misspelt enforcement key leaves the policy enforced). */
export function readPolicyAnnotations(annotations: Labels | undefined, errors: PolicyError[]): { audit: AuditLevel | null; enforcement: Enforcement } {
  let audit: AuditLevel | null = null;
  let enforcement: Enforcement = 'enforce';
  for (const [key, value] of Object.entries(annotations ?? {})) {
    if (key === AUDIT_ANNOTATION) {
      audit = parseAuditLevel(value);
      if (audit === null) errors.push({ path: annotationPath(key), message: `must be one of ${AUDIT_LEVELS.join(', ')}, got ${JSON.stringify(value)}` });
    } else if (key === ENFORCEMENT_ANNOTATION) {
      if ((ENFORCEMENTS as readonly string[]).includes(value)) enforcement = value as Enforcement;
      else errors.push({ path: annotationPath(key), message: `must be one of ${ENFORCEMENTS.join(', ')}, got ${JSON.stringify(value)}` });
    }
  }
  return { audit, enforcement };
}
