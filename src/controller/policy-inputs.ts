// The controller's model of the cluster and what it hands the status aggregator: every
// NetworkPolicy and ClusterNetworkPolicy with its validation and the nodes that must enforce it.
// Pure: model events in, answers out.
//
// It holds only what those answers need: each policy's identity, validation, mode and pod
// selector or subject (its rules are the agents' business), the pods of each namespace, and the
// namespaces' labels (a ClusterNetworkPolicy's subject selects namespaces). The agents'
// ClusterState also indexes pods and namespaces by label to resolve peers, which the controller
// never does: that and whole compiled policies were memory for nothing (docs/performance.md).

import { isPoliced, namespaceLabels } from '../model/cluster.ts';
import { compileClusterNetworkPolicy } from '../model/cluster-network-policy.ts';
import { compilePolicy } from '../model/policy.ts';
import { formatPolicyErrors } from '../model/policy-errors.ts';
import { selectorMatches } from '../model/selector.ts';
import type { CompiledClusterNetworkPolicy, CompiledPolicy, Labels, ModelEvent, Pod, PodsPeer } from '../model/types.ts';
import type { ClusterPolicyStatusInput } from '../status/cluster-policy-status.ts';
import type { PolicyStatusInput } from '../status/index.ts';

/** A policy as the controller needs it: what its NetworkPolicyStatus and Events say, and which
 *  pods it selects. */
export type ControllerPolicy = Pick<CompiledPolicy, 'key' | 'namespace' | 'name' | 'uid' | 'generation' | 'podSelector' | 'errors' | 'enforcement'>;

/** A ClusterNetworkPolicy as the controller needs it: what its conditions say, and its subject. */
export type ControllerClusterPolicy = Pick<CompiledClusterNetworkPolicy, 'name' | 'uid' | 'generation' | 'subject' | 'errors'>;

/** One object for every valid policy's input, not one per policy at each recompute. */
const VALID = Object.freeze({ ok: true, message: 'the policy is valid and supported' });

export class ControllerModel {
  /** Pods by uid (a delete names the uid alone), and by namespace. */
  readonly #pods = new Map<string, Pod>();
  readonly #podsByNs = new Map<string, Set<Pod>>();
  /** Policies by namespace/name (a delete names those), and by uid. */
  readonly #policies = new Map<string, ControllerPolicy>();
  readonly #byUid = new Map<string, ControllerPolicy>();
  /** ClusterNetworkPolicies by name, and the effective labels of each namespace known. */
  readonly #clusterPolicies = new Map<string, ControllerClusterPolicy>();
  readonly #namespaces = new Map<string, Labels>();

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
        case 'ClusterNetworkPolicy':
          if (e.op === 'upsert') {
            const c = compileClusterNetworkPolicy(e.object);
            this.#clusterPolicies.set(c.name, { name: c.name, uid: c.uid, generation: c.generation, subject: c.subject, errors: c.errors });
          } else this.#clusterPolicies.delete(e.name);
          break;
        case 'Namespace':
          // A NetworkPolicy's nodes follow from the pods of its namespace alone; a
          // ClusterNetworkPolicy's subject selects namespaces by these labels.
          if (e.op === 'upsert') this.#namespaces.set(e.object.name, namespaceLabels(e.object.name, e.object.labels));
          else this.#namespaces.delete(e.name);
          break;
        case 'Node':
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

  /** Every ClusterNetworkPolicy with the nodes running a pod of its subject (host-networked
   *  pods never are): O(distinct subjects × pods of the namespaces they select), each subject's
   *  walk ending once it has found every node that runs a policed pod. */
  clusterStatusInputs(): ClusterPolicyStatusInput[] {
    if (this.#clusterPolicies.size === 0) return [];
    const everyNode = new Set<string>();
    for (const pod of this.#pods.values()) if (pod.nodeName && isPoliced(pod)) everyNode.add(pod.nodeName);
    // Policies often share a subject (a tier's default and its exceptions): walked once.
    const bySubject = new Map<string, string[]>();
    const out: ClusterPolicyStatusInput[] = [];
    for (const p of this.#clusterPolicies.values()) {
      let desiredNodes = bySubject.get(p.subject.key);
      if (desiredNodes === undefined) bySubject.set(p.subject.key, (desiredNodes = this.#subjectNodes(p.subject, everyNode.size)));
      out.push({
        name: p.name,
        uid: p.uid,
        generation: p.generation,
        accepted: p.errors.length === 0 ? VALID : { ok: false, message: formatPolicyErrors(p.errors) },
        desiredNodes,
      });
    }
    return out;
  }

  /** Nodes running a policed pod the subject selects, sorted; stops once it has `all` of them. */
  #subjectNodes(subject: PodsPeer, all: number): string[] {
    const nodes = new Set<string>();
    for (const [ns, pods] of this.#podsByNs) {
      if (nodes.size === all) break;
      if (subject.namespace !== null ? ns !== subject.namespace : !selectorMatches(subject.namespaceSelector!, this.#namespaces.get(ns) ?? namespaceLabels(ns, undefined))) continue;
      for (const pod of pods) {
        if (!pod.nodeName || !isPoliced(pod) || nodes.has(pod.nodeName)) continue;
        if (selectorMatches(subject.podSelector, pod.labels)) nodes.add(pod.nodeName);
      }
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
