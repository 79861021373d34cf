// Which local pods have their denied connections cut after a write: those of a namespace, or
// selected by a (Cluster)NetworkPolicy, that says `weir.dev/cut-existing: "true"`, or every
// one when the agent's flag says so. The cut itself is the agent's (agent/connection-cut.ts).

import { namespaceCutsExisting } from '../model/annotations.ts';
import type { CompiledClusterNetworkPolicy, CompiledPolicy, Pod } from '../model/types.ts';
import type { TierSelection } from './cluster-policies.ts';

/** What the opt-in reads of a local workload. */
export interface CutCandidate {
  readonly pod: Pod;
  /** The enforced policies selecting it, each direction. */
  readonly ingress: readonly CompiledPolicy[];
  readonly egress: readonly CompiledPolicy[];
  readonly tiers: TierSelection;
}

export class CutOptIn {
  readonly #namespaces = new Set<string>();
  /** Keys of NetworkPolicies and names of ClusterNetworkPolicies that opt in. */
  readonly #policies = new Set<string>();
  readonly #clusterPolicies = new Set<string>();

  setNamespace(ns: string, annotation: string | undefined): void {
    if (namespaceCutsExisting(annotation)) this.#namespaces.add(ns);
    else this.#namespaces.delete(ns);
  }

  setPolicy(key: string, p: CompiledPolicy | undefined): void {
    if (p?.cutExisting) this.#policies.add(key);
    else this.#policies.delete(key);
  }

  setClusterPolicy(name: string, p: CompiledClusterNetworkPolicy | undefined): void {
    if (p?.cutExisting) this.#clusterPolicies.add(name);
    else this.#clusterPolicies.delete(name);
  }

  /** Whether anything opts in at all (then the agent asks for the pods after each write). */
  any(): boolean {
    return this.#namespaces.size > 0 || this.#policies.size > 0 || this.#clusterPolicies.size > 0;
  }

  covers(w: CutCandidate): boolean {
    if (this.#namespaces.has(w.pod.namespace)) return true;
    if (this.#policies.size > 0 && (w.ingress.some((p) => p.cutExisting) || w.egress.some((p) => p.cutExisting))) return true;
    return this.#clusterPolicies.size > 0 && (w.tiers.admin.some((p) => p.cutExisting) || w.tiers.baseline.some((p) => p.cutExisting));
  }
}
