// A source's view of the world (model objects by key) and the exact events between two views.
// Shared by the manifest and kube sources, so both emit the same events in the same order.

import type { ModelEvent, ObjectKind } from '../model/types.ts';

/** An upsert of one of the kinds a source reads from the cluster or a manifest. */
export type ModelUpsert = Extract<ModelEvent, { op: 'upsert'; kind: ObjectKind }>;

export interface ViewEntry {
  readonly key: string;
  readonly upsert: ModelUpsert;
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
  return { key: objectKey(upsert), upsert, file };
}

/** Whether two model objects are equal as JSON, whatever their keys' order: equal means no
 *  event. Compared in place rather than through a digest kept per object: the objects are held
 *  anyway, and hashing 100k pods' canonical JSON took about half a second of a cold start. */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameJson(a[i], b[i])) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  // A Date from a YAML manifest, say: compare what JSON makes of it.
  if (hasToJson(a) || hasToJson(b)) return JSON.stringify(a) === JSON.stringify(b);
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  // JSON leaves out a key whose value is undefined.
  let defined = 0;
  for (const k of Object.keys(x)) {
    if (x[k] === undefined) continue;
    defined++;
    if (!sameJson(x[k], y[k])) return false;
  }
  for (const k of Object.keys(y)) if (y[k] !== undefined) defined--;
  return defined === 0;
}

const hasToJson = (v: object): boolean => typeof (v as { toJSON?: unknown }).toJSON === 'function';

/** Code-unit order, independent of locale, so every agent sorts alike. */
export function byName(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The events that turn `prev` into `next`: nothing for an object whose model form is
 *  unchanged (equal as JSON; a policy held without its spec is never equal to one with it). */
export function diffViews(prev: View, next: View): ModelEvent[] {
  const deletes: ViewEntry[] = [];
  const upserts: ViewEntry[] = [];
  for (const [key, entry] of prev) if (!next.has(key)) deletes.push(entry);
  for (const [key, entry] of next) {
    const before = prev.get(key);
    if (before === undefined || !sameJson(before.upsert.object, entry.upsert.object)) upserts.push(entry);
  }
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
