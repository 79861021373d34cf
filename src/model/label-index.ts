// Two indexes that keep selector work proportional to the answer, not to the cluster:
// - LabelIndex: objects by label, to list the objects a selector may match;
// - SelectorIndex: selectors by one of their requirements, to list the selectors an
//   object's labels may satisfy. Both give candidates only; callers still run the matcher.

import type { Labels, Selector } from './types.ts';

const kv = (k: string, v: string) => `${k}\n${v}`;

export class LabelIndex<Id> {
  /** Label key -> value -> objects. One entry per label of an object: an `Exists` walks the
   *  key's values rather than keeping a second set of every object with the key, which would
   *  cost memory in proportion to the pods. */
  readonly #byKey = new Map<string, Map<string, Set<Id>>>();

  add(id: Id, labels: Labels): void {
    for (const k in labels) {
      let values = this.#byKey.get(k);
      if (!values) this.#byKey.set(k, (values = new Map()));
      addTo(values, labels[k], id);
    }
  }

  remove(id: Id, labels: Labels): void {
    for (const k in labels) {
      const values = this.#byKey.get(k);
      if (!values) continue;
      removeFrom(values, labels[k], id);
      if (values.size === 0) this.#byKey.delete(k);
    }
  }

  /** The smallest candidate list one requirement of sel allows, or null when no requirement
   *  narrows the search (only NotIn / DoesNotExist, or the empty selector). */
  candidates(sel: Selector): { size: number; ids: Iterable<Id> } | null {
    let best: { size: number; ids: Iterable<Id> } | null = null;
    for (const r of sel.requirements) {
      if (r.operator !== 'In' && r.operator !== 'Exists') continue;
      const values = this.#byKey.get(r.key);
      // Not push(...values): a key with a value a pod (a StatefulSet's pod-name label) passes
      // the engine's limit on a call's arguments, about 120k, in a large cluster.
      let sets: Set<Id>[] = [];
      if (values !== undefined) {
        if (r.operator === 'Exists') sets = [...values.values()];
        else
          for (const v of r.values) {
            const s = values.get(v);
            if (s !== undefined) sets.push(s);
          }
      }
      const size = sets.reduce((n, s) => n + s.size, 0);
      if (best === null || size < best.size) best = { size, ids: sets.length === 1 ? sets[0] : concat(sets) };
    }
    return best;
  }
}

/** Values (e.g. active peer sets) registered under one narrowing requirement of a selector. */
export class SelectorIndex<V> {
  readonly #byValue = new Map<string, Set<V>>();
  readonly #byKey = new Map<string, Set<V>>();
  readonly #unindexed = new Set<V>();

  add(value: V, sel: Selector | null): void {
    this.#walk(value, sel, addTo);
  }

  remove(value: V, sel: Selector | null): void {
    this.#walk(value, sel, removeFrom);
  }

  /** Adds to `out` every value whose selector might match labels. */
  collect(labels: Labels, out: Set<V>): void {
    for (const v of this.#unindexed) out.add(v);
    for (const k in labels) {
      const a = this.#byValue.get(kv(k, labels[k]));
      if (a) for (const v of a) out.add(v);
      const b = this.#byKey.get(k);
      if (b) for (const v of b) out.add(v);
    }
  }

  #walk(value: V, sel: Selector | null, op: (m: Map<string, Set<V>>, k: string, v: V) => void): void {
    const r = sel && narrowing(sel);
    if (!r) {
      if (op === addTo) this.#unindexed.add(value);
      else this.#unindexed.delete(value);
    } else if (r.operator === 'In') {
      for (const v of r.values) op(this.#byValue, kv(r.key, v), value);
    } else {
      op(this.#byKey, r.key, value);
    }
  }
}

/** The requirement a selector is indexed under: the first In, else the first Exists.
 *  Deterministic, so add and remove always find the same entry. */
export function narrowing(sel: Selector) {
  return sel.requirements.find((r) => r.operator === 'In') ?? sel.requirements.find((r) => r.operator === 'Exists');
}

function addTo<K, V>(m: Map<K, Set<V>>, k: K, v: V): void {
  let s = m.get(k);
  if (!s) m.set(k, (s = new Set()));
  s.add(v);
}

function removeFrom<K, V>(m: Map<K, Set<V>>, k: K, v: V): void {
  const s = m.get(k);
  if (s?.delete(v) && s.size === 0) m.delete(k);
}

function* concat<T>(sets: readonly Set<T>[]): Iterable<T> {
  for (const s of sets) yield* s;
}
