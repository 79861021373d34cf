// The merged view of a manifest directory and the exact events between two views.
// Kept apart from file I/O so merging, duplicate handling and diffing are tested directly.

import { createHash } from 'node:crypto';
import type { ModelEvent, ObjectKind } from '../../model/types.ts';

export type ModelUpsert = Extract<ModelEvent, { op: 'upsert' }>;

export interface ViewEntry {
  readonly key: string;
  readonly upsert: ModelUpsert;
  /** Canonical JSON of the model object: equal text means no event. */
  readonly canonical: string;
  readonly file: string;
}

export type View = ReadonlyMap<string, ViewEntry>;

/** Two definitions of one object: `winner` is the one kept (the later file, or the later
 *  document when both are in the same file). */
export interface Duplicate {
  readonly key: string;
  readonly ref: string;
  readonly loser: string;
  readonly winner: string;
}

export interface ManifestFileObjects {
  readonly name: string;
  readonly upserts: readonly ModelUpsert[];
}

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

/** Code-unit order, independent of locale, so every agent sorts files alike. */
export function byName(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Merges the objects of every file; for a key defined twice, the file that sorts last wins. */
export function mergeFiles(files: readonly ManifestFileObjects[]): { view: View; duplicates: Duplicate[] } {
  const view = new Map<string, ViewEntry>();
  const duplicates: Duplicate[] = [];
  for (const f of [...files].sort((a, b) => byName(a.name, b.name))) {
    for (const upsert of f.upserts) {
      const key = objectKey(upsert);
      const prev = view.get(key);
      if (prev !== undefined) duplicates.push({ key, ref: objectRef(upsert), loser: prev.file, winner: f.name });
      view.set(key, { key, upsert, canonical: canonicalJson(upsert.object), file: f.name });
    }
  }
  return { view, duplicates };
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

/** sha256 (hex) over the sorted (file name, content) pairs. The source passes each file's last
 *  content that parsed, so two agents reading the same directory report the same revision. */
export function manifestRevision(files: readonly { readonly name: string; readonly content: string }[]): string {
  const pairs = [...files].sort((a, b) => byName(a.name, b.name)).map((f) => [f.name, f.content]);
  return createHash('sha256').update(JSON.stringify(pairs)).digest('hex');
}
