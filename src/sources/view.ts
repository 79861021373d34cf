// A source's view of the world (model objects by key) and the exact events between two views.
// Shared by the manifest and kube sources, so both emit the same events in the same order.

import { createHash } from 'node:crypto';
import type { ModelEvent, ObjectKind } from '../model/types.ts';

/** An upsert of one of the kinds a source reads from the cluster or a manifest. */
export type ModelUpsert = Extract<ModelEvent, { op: 'upsert'; kind: ObjectKind }>;

export interface ViewEntry {
  readonly key: string;
  readonly upsert: ModelUpsert;
  /** A digest of the model object's canonical JSON: equal digests mean no event. */
  readonly canonical: string;
  /** Where the object came from: a manifest file name, or an API collection path. */
  readonly file: string;
}

export type View = ReadonlyMap<string, ViewEntry>;

// Deletes run from dependents to dependencies, upserts the other way round, so a consumer
// never sees a pod before its namespace exists within one batch.
const UPSERT_ORDER: readonly ObjectKind[] = ['Namespace', 'Node', 'Pod', 'NetworkPolicy'];

/** Identity of an object: kind + namespace + name, Pods by uid. */
export function objectKey(u: ModelUpsert): string {
  switch (u.kind) {
    case 'Pod':
      return `Pod/${u.object.uid}`;
    case 'Namespace':
      return `Namespace/${u.object.name}`;
    case 'Node':
      return `Node/${u.object.name}`;
    case 'NetworkPolicy':
      return `NetworkPolicy/${u.object.namespace}/${u.object.name}`;
  }
}

/** Human reference for messages, e.g. "Pod default/web". */
export function objectRef(u: ModelUpsert): string {
  switch (u.kind) {
    case 'Pod':
    case 'NetworkPolicy':
      return `${u.kind} ${u.object.namespace}/${u.object.name}`;
    case 'Namespace':
    case 'Node':
      return `${u.kind} ${u.object.name}`;
  }
}

/** A view entry for one upsert. */
export function viewEntry(upsert: ModelUpsert, file: string): ViewEntry {
  return { key: objectKey(upsert), upsert, canonical: canonicalDigest(upsert.object), file };
}

/** SHA-256 of the canonical JSON: what a view keeps per object to tell changes (44 characters
 *  where the JSON of a pod is about 400, times every pod of the cluster). */
export function canonicalDigest(value: unknown): string {
  return createHash('sha256').update(canonicalJson(value)).digest('base64');
}

/** JSON with object keys sorted, so key order in a file never produces an event. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) return v;
    const rec = v as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(rec).sort()) out[k] = rec[k];
    return out;
  });
}

/** Code-unit order, independent of locale, so every agent sorts alike. */
export function byName(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The events that turn `prev` into `next`: nothing for an object whose model form is unchanged. */
export function diffViews(prev: View, next: View): ModelEvent[] {
  const deletes: ViewEntry[] = [];
  const upserts: ViewEntry[] = [];
  for (const [key, entry] of prev) if (!next.has(key)) deletes.push(entry);
  for (const [key, entry] of next) if (prev.get(key)?.canonical !== entry.canonical) upserts.push(entry);
  const rank = (e: ViewEntry) => UPSERT_ORDER.indexOf(e.upsert.kind);
  deletes.sort((a, b) => rank(b) - rank(a) || byName(a.key, b.key));
  upserts.sort((a, b) => rank(a) - rank(b) || byName(a.key, b.key));
  return [...deletes.map((e) => deleteEvent(e.upsert)), ...upserts.map((e) => e.upsert)];
}

function deleteEvent(u: ModelUpsert): ModelEvent {
  switch (u.kind) {
    case 'Pod':
      return { kind: 'Pod', op: 'delete', uid: u.object.uid };
    case 'Namespace':
      return { kind: 'Namespace', op: 'delete', name: u.object.name };
    case 'Node':
      return { kind: 'Node', op: 'delete', name: u.object.name };
    case 'NetworkPolicy':
      return { kind: 'NetworkPolicy', op: 'delete', namespace: u.object.namespace, name: u.object.name };
  }
}
