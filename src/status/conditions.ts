// metav1.Condition rules, shared by both status kinds: a CamelCase reason, a bounded message,
// and a lastTransitionTime that moves only when the status does. Pure: the time is passed in.

import { compareStrings } from '../model/order.ts';

export type ConditionStatus = 'True' | 'False' | 'Unknown';

/** What a writer decides; lastTransitionTime is added by mergeConditions. */
export interface ConditionSpec {
  readonly type: string;
  readonly status: ConditionStatus;
  readonly reason: string;
  readonly message: string;
}

/** A metav1.Condition, key order as written to the API server. */
export interface Condition {
  readonly type: string;
  readonly status: ConditionStatus;
  readonly observedGeneration?: number;
  readonly lastTransitionTime: string;
  readonly reason: string;
  readonly message: string;
}

/** metav1.Condition's limit on message. */
export const MAX_CONDITION_MESSAGE = 32768;
/** metav1.Condition's pattern for reason. */
export const REASON_PATTERN = /^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$/;

/** RFC 3339 with second precision, as metav1.Time serializes. */
export function rfc3339(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

/** RFC 3339 with microsecond precision, as metav1.MicroTime serializes (Lease times). */
export function microTime(ms: number): string {
  return new Date(Math.floor(ms)).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

/** Cuts a message to `max` characters, saying that it did. */
export function truncate(message: string, max: number = MAX_CONDITION_MESSAGE): string {
  if (message.length <= max) return message;
  const tail = ' ... (truncated)';
  return message.slice(0, max - tail.length) + tail;
}

/** Builds the conditions for `next`, in its order. A condition whose status equals the previous
 *  one of its type keeps that one's lastTransitionTime; any other gets `nowMs`. */
export function mergeConditions(previous: readonly Condition[] | undefined, next: readonly ConditionSpec[], nowMs: number, observedGeneration?: number): Condition[] {
  const prev = new Map((previous ?? []).map((c) => [c.type, c]));
  return next.map((spec) => {
    const old = prev.get(spec.type);
    const lastTransitionTime = old !== undefined && old.status === spec.status ? old.lastTransitionTime : rfc3339(nowMs);
    return {
      type: spec.type,
      status: spec.status,
      ...(observedGeneration === undefined ? {} : { observedGeneration }),
      lastTransitionTime,
      reason: spec.reason,
      message: truncate(spec.message),
    };
  });
}

/** Reads conditions back from an API object; anything malformed is left out. */
export function parseConditions(raw: unknown): Condition[] {
  if (!Array.isArray(raw)) return [];
  const out: Condition[] = [];
  for (const c of raw as unknown[]) {
    if (typeof c !== 'object' || c === null) continue;
    const { type, status, reason, message, lastTransitionTime, observedGeneration } = c as Record<string, unknown>;
    if (typeof type !== 'string' || typeof lastTransitionTime !== 'string') continue;
    if (status !== 'True' && status !== 'False' && status !== 'Unknown') continue;
    out.push({
      type,
      status,
      ...(typeof observedGeneration === 'number' ? { observedGeneration } : {}),
      lastTransitionTime,
      reason: typeof reason === 'string' ? reason : '',
      message: typeof message === 'string' ? message : '',
    });
  }
  return out;
}

/** Canonical text of a condition list, independent of its order (for "did anything change"). */
export function conditionsKey(conditions: readonly Condition[]): string {
  return JSON.stringify([...conditions].sort((a, b) => compareStrings(a.type, b.type)).map((c) => [c.type, c.status, c.observedGeneration ?? null, c.lastTransitionTime, c.reason, c.message]));
}
