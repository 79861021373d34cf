// The cluster as the model sees it: pods, namespaces, nodes and compiled policies, with the
// indexes that answer "which pods does this peer select" in time proportional to the answer.

import { LabelIndex } from './label-index.ts';
import { selectorMatches } from './selector.ts';
import { familyOf, type CompiledPolicy, type Family, type Labels, type Namespace, type Node, type Pod, type PodsPeer } from './types.ts';

/** The API server labels every namespace with its own name; manifests may omit it. */
export const NAMESPACE_NAME_LABEL = 'kubernetes.io/metadata.name';

export function namespaceLabels(name: string, labels: Labels | undefined): Labels {
  return { ...labels, [NAMESPACE_NAME_LABEL]: name };
}

/** A pod is a member of peer sets only while Running with an IP; an IP that outlives its pod
 *  is reused by the next one, and a stale member would be a hole. */
export function isPeerEligible(pod: Pod): boolean {
  return pod.phase === 'Running' && pod.ips.length > 0 && !pod.hostNetwork;
}

/** A pod some node polices: it has an IP of its own and has not finished (a terminating or
 *  pending pod with an IP is still policed). */
export function isPoliced(pod: Pod): boolean {
  return !pod.hostNetwork && pod.ips.length > 0 && pod.phase !== 'Succeeded' && pod.phase !== 'Failed';
}

/** How many podsMatching answers are kept at most: a policy's peers in both families. */
const KEPT_MATCHES = 16;

/** A peer's pods, and the addresses of those eligible by family once asked for. */
interface Matches {
  readonly pods: readonly Pod[];
  addresses?: Record<Family, string[]>;
}

export class ClusterState {
  readonly pods = new Map<string, Pod>();
  readonly nodes = new Map<string, Node>();
  readonly policies = new Map<string, CompiledPolicy>();
  readonly #namespaces = new Map<string, Labels>();
  readonly #podsByNs = new Map<string, Set<Pod>>();
  readonly #podLabels = new LabelIndex<Pod>();
  readonly #nsLabels = new LabelIndex<string>();
  /** What #nsLabels holds: known namespaces, and namespaces only known from their pods. */
  readonly #nsIndexed = new Map<string, Labels>();
  readonly #policiesByNs = new Map<string, Set<CompiledPolicy>>();
  /** podsMatching's recent answers by peer key, dropped at any change of pods or namespaces. */
  readonly #matches = new Map<string, Matches>();

  /** Clearing a Map allocates a new table even when it is empty: not once per pod of a list. */
  #forgetMatches(): void {
    if (this.#matches.size > 0) this.#matches.clear();
  }

  /** Effective labels of a namespace, known or not (pods may arrive before their namespace). */
  namespaceLabels(name: string): Labels {
    return this.#namespaces.get(name) ?? namespaceLabels(name, undefined);
  }

  hasNamespace(name: string): boolean {
    return this.#namespaces.has(name);
  }

  /** Returns the previous pod with that uid, if any. */
  upsertPod(pod: Pod): Pod | undefined {
    // deletePod drops the kept answers.
    const old = this.deletePod(pod.uid);
    this.pods.set(pod.uid, pod);
    let s = this.#podsByNs.get(pod.namespace);
    if (!s) this.#podsByNs.set(pod.namespace, (s = new Set()));
    s.add(pod);
    this.#podLabels.add(pod, pod.labels);
    this.#reindexNamespace(pod.namespace);
    return old;
  }

  deletePod(uid: string): Pod | undefined {
    this.#forgetMatches();
    const old = this.pods.get(uid);
    if (!old) return undefined;
    this.pods.delete(uid);
    const s = this.#podsByNs.get(old.namespace)!;
    s.delete(old);
    if (s.size === 0) this.#podsByNs.delete(old.namespace);
    this.#podLabels.remove(old, old.labels);
    this.#reindexNamespace(old.namespace);
    return old;
  }

  /** Returns the previous effective labels. */
  upsertNamespace(ns: Namespace): Labels {
    this.#forgetMatches();
    const old = this.namespaceLabels(ns.name);
    this.#namespaces.set(ns.name, namespaceLabels(ns.name, ns.labels));
    this.#reindexNamespace(ns.name);
    return old;
  }

  deleteNamespace(name: string): Labels {
    this.#forgetMatches();
    const old = this.namespaceLabels(name);
    this.#namespaces.delete(name);
    this.#reindexNamespace(name);
    return old;
  }

  #reindexNamespace(name: string): void {
    const have = this.#nsIndexed.get(name);
    const known = this.#namespaces.get(name);
    if (known === have && known !== undefined) return;
    // A namespace known only from its pods keeps its implicit entry while it has pods.
    if (!known && have && this.#podsByNs.has(name)) return;
    const want = known ?? (this.#podsByNs.has(name) ? namespaceLabels(name, undefined) : undefined);
    if (want === have) return;
    if (have) this.#nsLabels.remove(name, have);
    if (want) {
      this.#nsLabels.add(name, want);
      this.#nsIndexed.set(name, want);
    } else this.#nsIndexed.delete(name);
  }

  upsertPolicy(p: CompiledPolicy): CompiledPolicy | undefined {
    const old = this.deletePolicy(p.key);
    this.policies.set(p.key, p);
    let s = this.#policiesByNs.get(p.namespace);
    if (!s) this.#policiesByNs.set(p.namespace, (s = new Set()));
    s.add(p);
    return old;
  }

  deletePolicy(key: string): CompiledPolicy | undefined {
    const old = this.policies.get(key);
    if (!old) return undefined;
    this.policies.delete(key);
    const s = this.#policiesByNs.get(old.namespace)!;
    s.delete(old);
    if (s.size === 0) this.#policiesByNs.delete(old.namespace);
    return old;
  }

  policiesIn(namespace: string): Iterable<CompiledPolicy> {
    return this.#policiesByNs.get(namespace) ?? [];
  }

  podsIn(namespace: string): Iterable<Pod> {
    return this.#podsByNs.get(namespace) ?? [];
  }

  /** Nodes running a pod the policy selects (not host-network, not finished, with an IP):
   *  the nodes that must enforce it. */
  nodesEnforcing(policy: CompiledPolicy): string[] {
    const nodes = new Set<string>();
    for (const pod of this.podsIn(policy.namespace)) {
      if (!pod.nodeName || !isPoliced(pod)) continue;
      if (policy.podSelector === null || selectorMatches(policy.podSelector, pod.labels)) nodes.add(pod.nodeName);
    }
    return [...nodes].sort();
  }

  peerMatchesPod(peer: PodsPeer, pod: Pod): boolean {
    if (peer.namespace !== null) {
      if (pod.namespace !== peer.namespace) return false;
    } else if (!selectorMatches(peer.namespaceSelector!, this.namespaceLabels(pod.namespace))) {
      return false;
    }
    return selectorMatches(peer.podSelector, pod.labels);
  }

  /**
   * Every pod (eligible or not) the peer selects. Walks the smaller of two candidate lists: the
   * pods under the pod selector's most selective requirement, or the pods of the namespaces the
   * peer names or its namespace selector narrows to (each namespace checked once, not per pod:
   * at scale the time goes to reading objects scattered over the heap, not to matching).
   * Answers are kept until pods or namespaces change, since each IP family asks for the same
   * peer's pods in turn; a few only, as a cold start asks for every peer without a change.
   */
  podsMatching(peer: PodsPeer): readonly Pod[] {
    return this.#matching(peer).pods;
  }

  /**
   * The addresses of the peer's pods that are peer-eligible, in one family: an entry per pod
   * and address (two pods may briefly share one). Both families are read in one walk over the
   * pods and kept with them, so the second family's set reads no pod.
   */
  peerAddresses(peer: PodsPeer, family: Family): readonly string[] {
    const m = this.#matching(peer);
    if (!m.addresses) {
      const addresses: Record<Family, string[]> = { 4: [], 6: [] };
      for (const pod of m.pods) if (isPeerEligible(pod)) for (const ip of pod.ips) addresses[familyOf(ip)].push(ip);
      m.addresses = addresses;
    }
    return m.addresses[family];
  }

  #matching(peer: PodsPeer): Matches {
    const known = this.#matches.get(peer.key);
    if (known) return known;
    const pods: Pod[] = [];
    const byLabel = this.#podLabels.candidates(peer.podSelector);
    const namespaces = this.#namespacesOf(peer);
    const viaNamespaces = namespaces ? namespaces.reduce((n, ns) => n + (this.#podsByNs.get(ns)?.size ?? 0), 0) : this.pods.size;
    if (byLabel && byLabel.size < viaNamespaces) {
      for (const pod of byLabel.ids) if (this.peerMatchesPod(peer, pod)) pods.push(pod);
    } else {
      for (const ns of namespaces ?? this.#podsByNs.keys()) {
        const inNs = this.#podsByNs.get(ns);
        if (!inNs || (peer.namespaceSelector && !selectorMatches(peer.namespaceSelector, this.namespaceLabels(ns)))) continue;
        for (const pod of inNs) if (selectorMatches(peer.podSelector, pod.labels)) pods.push(pod);
      }
    }
    if (this.#matches.size >= KEPT_MATCHES) this.#matches.clear();
    const m: Matches = { pods };
    this.#matches.set(peer.key, m);
    return m;
  }

  /** The namespaces a peer's pods may live in (candidates: its selector is still to check),
   *  or null for every namespace. */
  #namespacesOf(peer: PodsPeer): readonly string[] | null {
    if (peer.namespace !== null) return [peer.namespace];
    const candidates = this.#nsLabels.candidates(peer.namespaceSelector!);
    return candidates && [...candidates.ids];
  }
}
