// The cluster's ClusterNetworkPolicies, and which of them apply to a pod, in evaluation order:
// found by a walk over every policy when a pod changes, and updated from what changed when
// policies or a namespace's labels change, so such a change costs what it touches.

import type { ClusterState } from '../model/cluster.ts';
import { compareClusterNetworkPolicies } from '../model/cluster-network-policy.ts';
import { selectorMatches } from '../model/selector.ts';
import type { CnpTier, CompiledClusterNetworkPolicy, Labels, Pod } from '../model/types.ts';

type PolicyList = readonly CompiledClusterNetworkPolicy[];

export interface TierSelection {
  /** The policies of each tier whose subject holds the pod, in evaluation order. */
  readonly admin: PolicyList;
  readonly baseline: PolicyList;
}

/** How to bring a selection up to date with some policies whose membership may have changed. */
export interface TierReselect {
  /** A pod's selection with the changes applied, taken (see ClusterPolicies.release);
   *  undefined when they change neither of its lists. */
  reselect(current: TierSelection, pod: Pod): TierSelection | undefined;
}

/** The policies changed since the last take, and how to bring a selection up to date. */
export interface TierChanges extends TierReselect {
  /** The count of changes a selection made now reflects (see ClusterPolicies.version). */
  readonly version: number;
}

const NONE: TierSelection = { admin: [], baseline: [] };
const EMPTY: PolicyList = NONE.admin;

interface Held {
  readonly key: string;
  holders: number;
}

export class ClusterPolicies {
  readonly #cluster: ClusterState;
  readonly #byName = new Map<string, CompiledClusterNetworkPolicy>();
  /** Every policy in evaluation order; rebuilt on the first read after a change. */
  #ordered: CompiledClusterNetworkPolicy[] | null = [];
  /** Changes so far: a selection records the count it reflects. */
  #version = 0;
  /** Names upserted or deleted since the last takeChanges. */
  readonly #changed = new Set<string>();
  /** The lists workloads hold, by the versions of the policies in them: pods that share a list
   *  get the same array, so what is built from it can be built once (see WorkloadChains). */
  readonly #lists = new Map<string, PolicyList>();
  readonly #held = new Map<PolicyList, Held>();
  /** The held lists that name each policy: a change visits only those. */
  readonly #listsNaming = new Map<string, Set<PolicyList>>();
  /** A number per policy version, for the keys of #lists. */
  readonly #ids = new WeakMap<CompiledClusterNetworkPolicy, number>();
  #nextId = 0;

  constructor(cluster: ClusterState) {
    this.#cluster = cluster;
  }

  get size(): number {
    return this.#byName.size;
  }

  get version(): number {
    return this.#version;
  }

  get(name: string): CompiledClusterNetworkPolicy | undefined {
    return this.#byName.get(name);
  }

  /** Returns the version it replaced. */
  upsert(p: CompiledClusterNetworkPolicy): CompiledClusterNetworkPolicy | undefined {
    const old = this.#byName.get(p.name);
    this.#byName.set(p.name, p);
    this.#ids.set(p, this.#nextId++);
    this.#changedName(p.name);
    return old;
  }

  delete(name: string): CompiledClusterNetworkPolicy | undefined {
    const old = this.#byName.get(name);
    if (this.#byName.delete(name)) this.#changedName(name);
    return old;
  }

  #changedName(name: string): void {
    this.#ordered = null;
    this.#version++;
    this.#changed.add(name);
  }

  /** Names of the policies whose subject holds a pod that holds a selection, in no order. */
  heldNames(): Iterable<string> {
    return this.#listsNaming.keys();
  }

  /** The policies selecting a pod (host-networked pods are never subjects), taken: every
   *  policy's subject is matched against the pod. */
  selecting(pod: Pod): TierSelection {
    if (this.#byName.size === 0 || pod.hostNetwork) return NONE;
    if (this.#ordered === null) this.#ordered = [...this.#byName.values()].sort(compareClusterNetworkPolicies);
    const admin: CompiledClusterNetworkPolicy[] = [];
    const baseline: CompiledClusterNetworkPolicy[] = [];
    for (const p of this.#ordered) {
      if (!this.#cluster.peerMatchesPod(p.subject, pod)) continue;
      (p.tier === 'Admin' ? admin : baseline).push(p);
    }
    return { admin: this.#take(admin), baseline: this.#take(baseline) };
  }

  /** One more hold on a selection held already (a workload rebuilt with the same lists). */
  hold(s: TierSelection): TierSelection {
    return { admin: this.#take(s.admin), baseline: this.#take(s.baseline) };
  }

  /** Gives up a selection selecting or reselect returned: a list no pod holds is forgotten. */
  release(s: TierSelection): void {
    for (const list of [s.admin, s.baseline]) {
      if (list.length === 0) continue;
      const held = this.#held.get(list);
      if (!held) throw new Error(`ClusterPolicies.release: a list of ${list.length} policies (first ${list[0].name}) that no pod holds`);
      if (--held.holders > 0) continue;
      this.#held.delete(list);
      if (this.#lists.get(held.key) === list) this.#lists.delete(held.key);
      for (const p of list) {
        const naming = this.#listsNaming.get(p.name)!;
        naming.delete(list);
        if (naming.size === 0) this.#listsNaming.delete(p.name);
      }
    }
  }

  /**
   * The changes since the last call (undefined: none). A selection is brought up to date by
   * dropping the changed policies by name, whatever version it holds, and adding the current
   * versions whose subject holds the pod: a pod costs a subject match per changed policy, and
   * a new list is built once for the pods that held the same list and match alike.
   */
  takeChanges(): TierChanges | undefined {
    if (this.#changed.size === 0) return undefined;
    const names = new Set(this.#changed);
    this.#changed.clear();
    return { version: this.#version, ...this.#reselecting(names) };
  }

  /**
   * A namespace's labels changed (its pods' did not): its pods enter or leave only the subjects
   * whose namespace selector matches one of the labels and not the other, found with two
   * selector matches per policy. Reselects just those (undefined: none moves); a selection keeps
   * the version it reflects, since other changes of the batch may still be to take.
   */
  namespaceChanged(before: Labels, after: Labels): TierReselect | undefined {
    const names = new Set<string>();
    for (const [name, p] of this.#byName) {
      const sel = p.subject.namespaceSelector;
      // A subject naming its namespace, or none, holds the same pods whatever its labels.
      if (p.subject.namespace !== null || sel === null) continue;
      if (selectorMatches(sel, before) !== selectorMatches(sel, after)) names.add(name);
    }
    return names.size === 0 ? undefined : this.#reselecting(names);
  }

  /** Drops the named policies from a selection and adds the current versions whose subject
   *  holds the pod. */
  #reselecting(names: ReadonlySet<string>): TierReselect {
    const now = [...names].flatMap((n) => this.#byName.get(n) ?? []).sort(compareClusterNetworkPolicies);
    // The held lists naming a changed policy: any other list keeps what it holds.
    const touched = new Set<PolicyList>();
    for (const n of names) for (const list of this.#listsNaming.get(n) ?? []) touched.add(list);
    // A list's successor by which of `now` hold the pod ('1' each), per tier.
    const successors = { Admin: new Map<PolicyList, Map<string, PolicyList>>(), Baseline: new Map<PolicyList, Map<string, PolicyList>>() };
    const successor = (list: PolicyList, tier: CnpTier, holds: string): PolicyList => {
      let byHolds = successors[tier].get(list);
      if (!byHolds) successors[tier].set(list, (byHolds = new Map()));
      let next = byHolds.get(holds);
      if (next) return next;
      const added = now.filter((p, i) => p.tier === tier && holds[i] === '1');
      next = list;
      if (touched.has(list) || added.length > 0) {
        const kept = list.filter((p) => !names.has(p.name));
        next = this.#intern(mergeOrdered(kept, added));
      }
      byHolds.set(holds, next);
      return next;
    };
    return {
      reselect: (current, pod) => {
        if (pod.hostNetwork) return undefined;
        let holds = '';
        for (const p of now) holds += this.#cluster.peerMatchesPod(p.subject, pod) ? '1' : '0';
        const admin = successor(current.admin, 'Admin', holds);
        const baseline = successor(current.baseline, 'Baseline', holds);
        if (admin === current.admin && baseline === current.baseline) return undefined;
        return { admin: this.#take(admin), baseline: this.#take(baseline) };
      },
    };
  }

  /** The held list with the same policy versions, else the list itself. */
  #intern(list: PolicyList): PolicyList {
    if (list.length === 0) return EMPTY;
    return this.#lists.get(this.#keyOf(list)) ?? list;
  }

  #keyOf(list: PolicyList): string {
    return list.map((p) => this.#ids.get(p)).join(',');
  }

  /** One more holder of the list (or of the held one with the same versions: that is returned). */
  #take(list: PolicyList): PolicyList {
    if (list.length === 0) return EMPTY;
    const held = this.#held.get(list);
    if (held) {
      held.holders++;
      return list;
    }
    const key = this.#keyOf(list);
    const same = this.#lists.get(key);
    if (same) return this.#take(same);
    this.#lists.set(key, list);
    this.#held.set(list, { key, holders: 1 });
    for (const p of list) {
      let naming = this.#listsNaming.get(p.name);
      if (!naming) this.#listsNaming.set(p.name, (naming = new Set()));
      naming.add(list);
    }
    return list;
  }
}

/** Two lists in evaluation order, merged into one. */
function mergeOrdered(a: PolicyList, b: PolicyList): CompiledClusterNetworkPolicy[] {
  const out: CompiledClusterNetworkPolicy[] = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) out.push(compareClusterNetworkPolicies(a[i], b[j]) <= 0 ? a[i++] : b[j++]);
  while (i < a.length) out.push(a[i++]);
  while (j < b.length) out.push(b[j++]);
  return out;
}
