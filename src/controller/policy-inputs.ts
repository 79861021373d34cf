// The controller's model of the cluster and what it hands the status aggregator: every
// NetworkPolicy with its validation and the nodes that must enforce it. Pure: model events in,
// answers out.
//
// It holds only what those answers need: each policy's identity, validation, mode and pod
// selector (its rules are the agents' business), and the pods of each namespace. The agents'
// ClusterState also indexes pods and namespaces by label to resolve peers, which the controller
// never does: that and whole compiled policies were memory for nothing (docs/performance.md).

import { isPoliced } from '../model/cluster.ts';
import { compilePolicy } from '../model/policy.ts';
import { formatPolicyErrors } from '../model/policy-errors.ts';
import { selectorMatches } from '../model/selector.ts';
import type { CompiledPolicy, ModelEvent, Pod } from '../model/types.ts';
import type { PolicyStatusInput } from '../status/index.ts';

/** A policy as the controller needs it: what its NetworkPolicyStatus and Events say, and which
 *  pods it selects. */
export type ControllerPolicy = Pick<CompiledPolicy, 'key' | 'namespace' | 'name' | 'uid' | 'generation' | 'podSelector' | 'errors' | 'enforcement'>;

/** One object for every valid policy's input, not one per policy at each recompute. */
const VALID = Object.freeze({ ok: true, message: 'the policy is valid and supported' });

export class ControllerModel {
  /** Pods by uid (a delete names the uid alone), and by namespace. */
  readonly #pods = new Map<string, Pod>();
  readonly #podsByNs = new Map<string, Set<Pod>>();
  /** Policies by namespace/name (a delete names those), and by uid. */
  readonly #policies = new Map<string, ControllerPolicy>();
  readonly #byUid = new Map<string, ControllerPolicy>();

  /** Applies a batch; returns the policies it created or changed. */
  apply(events: readonly ModelEvent[]): ControllerPolicy[] {
    const changed: ControllerPolicy[] = [];
    for (const e of events) {
      switch (e.kind) {
        case 'Pod':
          this.#deletePod(e.op === 'upsert' ? e.object.uid : e.uid);
          if (e.op === 'upsert') this.#addPod(e.object);
          break;
        case 'NetworkPolicy':
          if (e.op === 'upsert') {
            const c = compilePolicy(e.object);
            // A new object of the fields kept: the compiled rules become garbage at once.
            const p: ControllerPolicy = {
              key: c.key,
              namespace: c.namespace,
              name: c.name,
              uid: c.uid,
              generation: c.generation,
              podSelector: c.podSelector,
              errors: c.errors,
              enforcement: c.enforcement,
            };
            this.#deletePolicy(p.key);
            this.#policies.set(p.key, p);
            this.#byUid.set(p.uid, p);
            changed.push(p);
          } else this.#deletePolicy(`${e.namespace}/${e.name}`);
          break;
        case 'Namespace':
        case 'Node':
          // Which nodes must enforce a policy follows from the pods of its namespace alone.
          break;
      }
    }
    return changed;
  }

  #addPod(pod: Pod): void {
    this.#pods.set(pod.uid, pod);
    let s = this.#podsByNs.get(pod.namespace);
    if (s === undefined) this.#podsByNs.set(pod.namespace, (s = new Set()));
    s.add(pod);
  }

  #deletePod(uid: string): void {
    const old = this.#pods.get(uid);
    if (old === undefined) return;
    this.#pods.delete(uid);
    const s = this.#podsByNs.get(old.namespace)!;
    s.delete(old);
    if (s.size === 0) this.#podsByNs.delete(old.namespace);
  }

  #deletePolicy(key: string): void {
    const old = this.#policies.get(key);
    if (old === undefined) return;
    this.#policies.delete(key);
    this.#byUid.delete(old.uid);
  }

  policies(): Iterable<ControllerPolicy> {
    return this.#policies.values();
  }

  /** The policy of that uid, if the model holds it. */
  policyByUid(uid: string): ControllerPolicy | undefined {
    return this.#byUid.get(uid);
  }

  /** Nodes running a pod the policy selects (not host-network, not finished, with an IP): the
   *  nodes that must enforce it, sorted. */
  nodesEnforcing(p: ControllerPolicy): string[] {
    const nodes = new Set<string>();
    for (const pod of this.#podsByNs.get(p.namespace) ?? []) {
      if (!pod.nodeName || !isPoliced(pod)) continue;
      if (p.podSelector === null || selectorMatches(p.podSelector, pod.labels)) nodes.add(pod.nodeName);
    }
    return [...nodes].sort();
  }

  /** Every policy with the nodes that must enforce it: O(policies × pods of their namespaces). */
  statusInputs(): PolicyStatusInput[] {
    const out: PolicyStatusInput[] = [];
    for (const p of this.#policies.values()) {
      out.push({
        namespace: p.namespace,
        name: p.name,
        uid: p.uid,
        generation: p.generation,
        accepted: p.errors.length === 0 ? VALID : { ok: false, message: formatPolicyErrors(p.errors) },
        desiredNodes: this.nodesEnforcing(p),
        mode: p.enforcement,
      });
    }
    return out;
  }
}
