// The controller's model of the cluster and what it hands the status aggregator: every
// NetworkPolicy with its validation and the nodes that must enforce it. Pure: model events in,
// answers out.

import { ClusterState } from '../model/cluster.ts';
import { compilePolicy } from '../model/policy.ts';
import { formatPolicyErrors } from '../model/policy-errors.ts';
import type { CompiledPolicy, ModelEvent } from '../model/types.ts';
import type { PolicyStatusInput } from '../status/index.ts';

export class ControllerModel {
  readonly #cluster = new ClusterState();
  readonly #byUid = new Map<string, CompiledPolicy>();

  /** Applies a batch; returns the policies it created or changed (compiled). */
  apply(events: readonly ModelEvent[]): CompiledPolicy[] {
    const changed: CompiledPolicy[] = [];
    for (const e of events) {
      switch (e.kind) {
        case 'Pod':
          if (e.op === 'upsert') this.#cluster.upsertPod(e.object);
          else this.#cluster.deletePod(e.uid);
          break;
        case 'Namespace':
          if (e.op === 'upsert') this.#cluster.upsertNamespace(e.object);
          else this.#cluster.deleteNamespace(e.name);
          break;
        case 'NetworkPolicy':
          if (e.op === 'upsert') {
            const p = compilePolicy(e.object);
            this.#forget(this.#cluster.upsertPolicy(p));
            this.#byUid.set(p.uid, p);
            changed.push(p);
          } else this.#forget(this.#cluster.deletePolicy(`${e.namespace}/${e.name}`));
          break;
        case 'Node':
          // Which nodes must enforce a policy follows from the pods alone.
          break;
      }
    }
    return changed;
  }

  #forget(old: CompiledPolicy | undefined): void {
    if (old !== undefined) this.#byUid.delete(old.uid);
  }

  policies(): Iterable<CompiledPolicy> {
    return this.#cluster.policies.values();
  }

  /** The policy of that uid, if the model holds it. */
  policyByUid(uid: string): CompiledPolicy | undefined {
    return this.#byUid.get(uid);
  }

  /** Every policy with the nodes that must enforce it: O(policies × pods of their namespaces). */
  statusInputs(): PolicyStatusInput[] {
    const out: PolicyStatusInput[] = [];
    for (const p of this.#cluster.policies.values()) {
      out.push({
        namespace: p.namespace,
        name: p.name,
        uid: p.uid,
        generation: p.generation,
        accepted: p.errors.length === 0 ? { ok: true, message: 'the policy is valid and supported' } : { ok: false, message: formatPolicyErrors(p.errors) },
        desiredNodes: this.#cluster.nodesEnforcing(p),
        mode: p.enforcement,
      });
    }
    return out;
  }
}
