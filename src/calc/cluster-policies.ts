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
    this.#ordered = null;
    return old;
  }

  delete(name: string): CompiledClusterNetworkPolicy | undefined {
    const old = this.#byName.get(name);
    if (this.#byName.delete(name)) this.#ordered = null;
    return old;
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
    return { admin, baseline };
  }
}
