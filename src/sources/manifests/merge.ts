// The objects of every manifest file merged into one view: the last definition of an object
// wins, and objects whose metadata cannot be read are turned into what keeps traffic closed.
// Kept apart from file I/O so merging is tested directly.

import { createHash } from 'node:crypto';
import type { Pod, RawNetworkPolicy } from '../../model/types.ts';
import { compareStrings } from '../../model/order.ts';
import { objectKey, objectRef, viewEntry } from '../view.ts';
import type { ModelUpsert, View, ViewEntry } from '../view.ts';

/** What a manifest document yields: a model object, or what stands for one that cannot be read. */
export type ManifestItem =
  | ModelUpsert
  /** A NetworkPolicy (invalid, see convert.ts) whose namespace cannot be read: it is copied
   *  into every namespace the view knows, since it may have isolated pods of any of them. */
  | { readonly kind: 'AnyNamespacePolicy'; readonly policy: RawNetworkPolicy }
  /** A Namespace whose metadata cannot be read; name null when not even its name can. */
  | { readonly kind: 'UnreadableNamespace'; readonly name: string | null };

export interface ManifestFileObjects {
  readonly name: string;
  readonly items: readonly ManifestItem[];
}

/** Two definitions of one object: `winner` is the one kept (the later file, or the later
 *  document when both are in the same file). */
export interface Duplicate {
  readonly key: string;
  readonly ref: string;
  readonly loser: string;
  readonly winner: string;
}

type Keyed = ModelUpsert | { readonly kind: 'UnreadableNamespace'; readonly name: string };

/**
 * Merges the objects of every file; for a key defined twice the file that sorts last wins (an
 * unreadable Namespace competes with readable definitions of its name). Then, failing closed:
 * - the pods of a namespace whose Namespace cannot be read are no peer of any policy (its
 *   labels are unknown, so no namespaceSelector may be trusted to match or not match them),
 *   and when a Namespace's very name cannot be read, so are the pods of every namespace
 *   without a readable Namespace; they stay policed by the policies that select them;
 * - a policy whose namespace cannot be read stands in every namespace of the view.
 */
export function mergeFiles(files: readonly ManifestFileObjects[]): { view: View; duplicates: Duplicate[] } {
  const winners = new Map<string, { item: Keyed; file: string }>();
  const duplicates: Duplicate[] = [];
  const anyNamespace: { policy: RawNetworkPolicy; file: string }[] = [];
  let unnamedNamespace = false;
  for (const f of [...files].sort((a, b) => compareStrings(a.name, b.name))) {
    for (const item of f.items) {
      if (item.kind === 'AnyNamespacePolicy') {
        anyNamespace.push({ policy: item.policy, file: f.name });
        continue;
      }
      if (item.kind === 'UnreadableNamespace' && item.name === null) {
        unnamedNamespace = true;
        continue;
      }
      const keyed = item as Keyed;
      const key = keyOf(keyed);
      const prev = winners.get(key);
      if (prev !== undefined) duplicates.push({ key, ref: refOf(keyed), loser: prev.file, winner: f.name });
      winners.set(key, { item: keyed, file: f.name });
    }
  }

  const readable = new Set<string>();
  const unreadable = new Set<string>();
  const known = new Set<string>();
  for (const { item } of winners.values()) {
    if (item.kind === 'Namespace') readable.add(item.object.name);
    else if (item.kind === 'UnreadableNamespace') unreadable.add(item.name);
    else if (item.kind === 'Pod') known.add(item.object.namespace);
  }
  for (const ns of [...readable, ...unreadable]) known.add(ns);
  const noPeer = (ns: string) => unreadable.has(ns) || (unnamedNamespace && !readable.has(ns));

  const view = new Map<string, ViewEntry>();
  for (const [key, { item, file }] of winners) {
    if (item.kind === 'UnreadableNamespace') continue;
    view.set(key, viewEntry(item.kind === 'Pod' && noPeer(item.object.namespace) ? notAPeer(item.object) : item, file));
  }
  for (const { policy, file } of anyNamespace) {
    for (const namespace of [...known].sort(compareStrings)) {
      const upsert: ModelUpsert = { kind: 'NetworkPolicy', op: 'upsert', object: { ...policy, namespace, uid: `${namespace}/${policy.name}` } };
      const entry = viewEntry(upsert, file);
      const prev = view.get(entry.key);
      if (prev !== undefined) duplicates.push({ key: entry.key, ref: objectRef(upsert), loser: prev.file, winner: file });
      view.set(entry.key, entry);
    }
  }
  return { view, duplicates };
}

/** The model keeps a pod out of every peer set unless it is Running (model/cluster.ts,
 *  isPeerEligible) and polices it in every phase but Succeeded and Failed: Unknown does both. */
function notAPeer(pod: Pod): ModelUpsert {
  return { kind: 'Pod', op: 'upsert', object: pod.phase === 'Running' ? { ...pod, phase: 'Unknown' } : pod };
}

function keyOf(item: Keyed): string {
  return item.kind === 'UnreadableNamespace' ? `Namespace/${item.name}` : objectKey(item);
}

function refOf(item: Keyed): string {
  return item.kind === 'UnreadableNamespace' ? `Namespace ${item.name}` : objectRef(item);
}

/** sha256 (hex) over the sorted (file name, content) pairs. The source passes each file's last
 *  content that parsed, so two agents reading the same directory report the same revision. */
export function manifestRevision(files: readonly { readonly name: string; readonly content: string }[]): string {
  const pairs = [...files].sort((a, b) => compareStrings(a.name, b.name)).map((f) => [f.name, f.content]);
  return createHash('sha256').update(JSON.stringify(pairs)).digest('hex');
}
