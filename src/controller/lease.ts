// Leader election over a coordination.k8s.io/v1 Lease, the decision part. Expiry is judged by
// when *this* agent last saw the lease record change, on its own clock (as client-go does),
// so clock skew between nodes cannot make a live holder look expired. Pure.

import { microTime } from '../status/conditions.ts';

export interface LeaseRecord {
  /** null: nobody holds it (never taken, or released). */
  readonly holder: string | null;
  readonly leaseDurationSeconds: number | null;
  readonly acquireTime: string | null;
  readonly renewTime: string | null;
  readonly leaseTransitions: number;
  readonly resourceVersion: string;
}

/** The record as last seen, and when it was first seen in that state (local clock). */
export interface LeaseObservation {
  readonly key: string;
  readonly sinceMs: number;
}

export type LeaseAction =
  /** Create the Lease (it does not exist). */
  | { readonly kind: 'create' }
  /** Already ours: write a new renewTime. */
  | { readonly kind: 'renew' }
  /** Free or expired: take it over. */
  | { readonly kind: 'take' }
  /** Somebody else holds it: wait at least this long before trying again. */
  | { readonly kind: 'wait'; readonly holder: string; readonly expiresInMs: number };

export function parseLease(raw: unknown): LeaseRecord {
  const o = (raw ?? {}) as { metadata?: { resourceVersion?: unknown }; spec?: Record<string, unknown> };
  const s = o.spec ?? {};
  const str = (v: unknown) => (typeof v === 'string' && v !== '' ? v : null);
  return {
    holder: str(s.holderIdentity),
    leaseDurationSeconds: typeof s.leaseDurationSeconds === 'number' ? s.leaseDurationSeconds : null,
    acquireTime: str(s.acquireTime),
    renewTime: str(s.renewTime),
    leaseTransitions: typeof s.leaseTransitions === 'number' ? s.leaseTransitions : 0,
    resourceVersion: typeof o.metadata?.resourceVersion === 'string' ? o.metadata.resourceVersion : '',
  };
}

/** Keeps `prev.sinceMs` while the record is unchanged; a renewal by the holder changes it. */
export function observe(prev: LeaseObservation | null, rec: LeaseRecord, nowMs: number): LeaseObservation {
  const key = JSON.stringify([rec.holder, rec.renewTime, rec.acquireTime, rec.leaseTransitions, rec.leaseDurationSeconds]);
  return prev !== null && prev.key === key ? prev : { key, sinceMs: nowMs };
}

export function decideLease(rec: LeaseRecord | null, obs: LeaseObservation | null, identity: string, nowMs: number, defaultDurationSeconds: number): LeaseAction {
  if (rec === null) return { kind: 'create' };
  if (rec.holder === identity) return { kind: 'renew' };
  if (rec.holder === null) return { kind: 'take' };
  const durationMs = (rec.leaseDurationSeconds ?? defaultDurationSeconds) * 1000;
  const since = obs?.sinceMs ?? nowMs;
  const expiresInMs = since + durationMs - nowMs;
  return expiresInMs <= 0 ? { kind: 'take' } : { kind: 'wait', holder: rec.holder, expiresInMs };
}

export interface LeaseSpecInput {
  readonly holder: string | null;
  readonly leaseDurationSeconds: number;
  readonly acquireMs: number | null;
  readonly renewMs: number;
  readonly leaseTransitions: number;
}

/** A full Lease for POST (no resourceVersion) or PUT (with it: the write fails with 409 if
 *  anybody wrote the Lease since we read it). */
export function leaseBody(namespace: string, name: string, spec: LeaseSpecInput, resourceVersion?: string): object {
  return {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name, namespace, ...(resourceVersion === undefined ? {} : { resourceVersion }) },
    spec: {
      ...(spec.holder === null ? {} : { holderIdentity: spec.holder }),
      leaseDurationSeconds: spec.leaseDurationSeconds,
      ...(spec.acquireMs === null ? {} : { acquireTime: microTime(spec.acquireMs) }),
      renewTime: microTime(spec.renewMs),
      leaseTransitions: spec.leaseTransitions,
    },
  };
}

/** The Lease to write for an action: renew keeps acquireTime and the transition count; take
 *  starts a new term; release (holder null) leaves the term's counts alone. */
export function nextLeaseSpec(action: 'create' | 'renew' | 'take' | 'release', rec: LeaseRecord | null, identity: string, durationSeconds: number, nowMs: number): LeaseSpecInput {
  const transitions = rec?.leaseTransitions ?? 0;
  switch (action) {
    case 'create':
      return { holder: identity, leaseDurationSeconds: durationSeconds, acquireMs: nowMs, renewMs: nowMs, leaseTransitions: 0 };
    case 'renew': {
      const acquired = rec?.acquireTime ? Date.parse(rec.acquireTime) : NaN;
      return {
        holder: identity,
        leaseDurationSeconds: durationSeconds,
        acquireMs: Number.isNaN(acquired) ? nowMs : acquired,
        renewMs: nowMs,
        leaseTransitions: transitions,
      };
    }
    case 'take':
      return { holder: identity, leaseDurationSeconds: durationSeconds, acquireMs: nowMs, renewMs: nowMs, leaseTransitions: transitions + 1 };
    case 'release':
      return { holder: null, leaseDurationSeconds: durationSeconds, acquireMs: null, renewMs: nowMs, leaseTransitions: transitions };
  }
}
