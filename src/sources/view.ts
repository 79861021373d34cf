// A source's view of the world (model objects by key) and the exact events between two views.
// Shared by the manifest and kube sources, so both emit the same events in the same order.

import { compareStrings } from '../model/order.ts';
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
const UPSERT_ORDER: readonly ObjectKind[] = ['Namespace', 'Node', 'Pod', 'NetworkPolicy', 'ClusterNetworkPolicy'];

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
    case 'ClusterNetworkPolicy':
      return `ClusterNetworkPolicy/${u.object.name}`;
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
    case 'ClusterNetworkPolicy':
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

/** One key's change: the object before and after it (undefined: absent). */
export type KeyChange = readonly [key: string, before: ModelUpsert | undefined, after: ModelUpsert | undefined];

/** The events that turn `prev` into `next` (diffChanges). */
export function diffViews(prev: View, next: View): ModelEvent[] {
  return diffChanges(
    (function* (): Generator<KeyChange> {
      for (const [key, entry] of prev) if (!next.has(key)) yield [key, entry.upsert, undefined];
      for (const [key, entry] of next) yield [key, prev.get(key)?.upsert, entry.upsert];
    })(),
  );
}

/** The events of changes by key: deletes, then upserts, in UPSERT_ORDER's sense, each kind in
 *  key order; nothing for an object whose model form is unchanged (equal as JSON; a policy
 *  held without its spec is never equal to one with it). */
export function diffChanges(changes: Iterable<KeyChange>): ModelEvent[] {
  // Keys and events side by side, sorted through their indexes: no wrapper object per change,
  // which a large first batch would make by the hundred thousand, garbage at once.
  const group = () => ({ keys: [] as string[], events: [] as ModelEvent[] });
  const deletes = UPSERT_ORDER.map(group);
  const upserts = UPSERT_ORDER.map(group);
  for (const [key, before, after] of changes) {
    let g: ReturnType<typeof group>;
    if (after !== undefined) {
      if (before !== undefined && sameJson(before.object, after.object)) continue;
      g = upserts[UPSERT_ORDER.indexOf(after.kind)];
      g.events.push(after);
    } else if (before !== undefined) {
      g = deletes[UPSERT_ORDER.indexOf(before.kind)];
      g.events.push(deleteEvent(before));
    } else continue;
    g.keys.push(key);
  }
  const out: ModelEvent[] = [];
  for (const { keys, events } of [...deletes.reverse(), ...upserts]) {
    const order = keys.map((_, i) => i).sort((a, b) => compareStrings(keys[a], keys[b]));
    for (const i of order) out.push(events[i]);
  }
  return out;
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
    case 'ClusterNetworkPolicy':
      return { kind: 'ClusterNetworkPolicy', op: 'delete', name: u.object.name };
  }
}
