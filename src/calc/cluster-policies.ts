// The cluster's ClusterNetworkPolicies, and which of them apply to a pod, in evaluation order.

import type { ClusterState } from '../model/cluster.ts';
import { compareClusterNetworkPolicies } from '../model/cluster-network-policy.ts';
import type { CompiledClusterNetworkPolicy, Pod } from '../model/types.ts';

export interface TierSelection {
  /** The policies of each tier whose subject holds the pod, in evaluation order. */
  readonly admin: readonly CompiledClusterNetworkPolicy[];
  readonly baseline: readonly CompiledClusterNetworkPolicy[];
}

const NONE: TierSelection = { admin: [], baseline: [] };

export class ClusterPolicies {
  readonly #cluster: ClusterState;
  readonly #byName = new Map<string, CompiledClusterNetworkPolicy>();
  /** Every policy in evaluation order; rebuilt on the first read after a change. */
  #ordered: CompiledClusterNetworkPolicy[] | null = [];
  /** One array per distinct list selected since the last change: pods that share a list get
   *  the same array, so what is built from it can be built once (see WorkloadChains). */
  readonly #lists = new Map<string, readonly CompiledClusterNetworkPolicy[]>();

  constructor(cluster: ClusterState) {
    this.#cluster = cluster;
  }

  get size(): number {
    return this.#byName.size;
  }

  get(name: string): CompiledClusterNetworkPolicy | undefined {
    return this.#byName.get(name);
  }

  /** Returns the version it replaced. */
  upsert(p: CompiledClusterNetworkPolicy): CompiledClusterNetworkPolicy | undefined {
    const old = this.#byName.get(p.name);
    this.#byName.set(p.name, p);
    this.#changed();
    return old;
  }

  delete(name: string): CompiledClusterNetworkPolicy | undefined {
    const old = this.#byName.get(name);
    if (this.#byName.delete(name)) this.#changed();
    return old;
  }

  #changed(): void {
    this.#ordered = null;
    this.#lists.clear();
  }

  #intern(list: CompiledClusterNetworkPolicy[]): readonly CompiledClusterNetworkPolicy[] {
    if (list.length === 0) return NONE.admin;
    const key = list.map((p) => p.name).join('\n');
    const held = this.#lists.get(key);
    if (held) return held;
    this.#lists.set(key, list);
    return list;
  }

  /** The policies selecting a pod (host-networked pods are never subjects). */
  selecting(pod: Pod): TierSelection {
    if (this.#byName.size === 0 || pod.hostNetwork) return NONE;
    if (this.#ordered === null) this.#ordered = [...this.#byName.values()].sort(compareClusterNetworkPolicies);
    const admin: CompiledClusterNetworkPolicy[] = [];
    const baseline: CompiledClusterNetworkPolicy[] = [];
    for (const p of this.#ordered) {
      if (!this.#cluster.peerMatchesPod(p.subject, pod)) continue;
      (p.tier === 'Admin' ? admin : baseline).push(p);
    }
    return { admin: this.#intern(admin), baseline: this.#intern(baseline) };
  }
}
