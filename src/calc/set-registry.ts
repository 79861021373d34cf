// The peer sets calc keeps: reference counted, with union membership and reverse selector
// indexes so that a pod or namespace change visits only the sets it may affect.
//
// A set lives while a rule or a union references it, and is in the kernel (kernelSets) only
// while a rule does: a union's parts only carry its counts.

import type { ClusterState } from '../model/cluster.ts';
import { isPeerEligible } from '../model/cluster.ts';
import { narrowing, SelectorIndex } from '../model/label-index.ts';
import { selectorMatches } from '../model/selector.ts';
import type { Family, Labels, Pod, PodsPeer, PrefixSet } from '../model/types.ts';
import { familyOf } from '../model/types.ts';
import type { Changes } from './changes.ts';
import type { DesiredSet, Members, SetType } from './desired.ts';
import { netMember } from './desired.ts';
import type { Names } from './names.ts';
import type { SetSpec } from './rules.ts';
import { setKey } from './rules.ts';

export class ActiveSet implements DesiredSet {
  readonly name: string;
  readonly family: Family;
  readonly type: SetType;
  readonly spec: SetSpec;
  /** References from rules: the kernel holds the set while there are any. */
  refs = 0;
  /** References from unions it is a part of. */
  unionRefs = 0;
  /** Member -> number of pods (or blocks) contributing it: two pods may briefly share an IP.
   *  Its keys are the members; no second collection, since sets can be very large. */
  readonly counts = new Map<string, number>();
  readonly members: Members;
  /** Union sets this set is a part of: they follow its members. */
  readonly unions = new Set<ActiveSet>();
  /** For a union: its parts (each holding a reference taken by the union). */
  readonly parts: ActiveSet[] = [];
  constructor(name: string, family: Family, type: SetType, spec: SetSpec) {
    const counts = this.counts;
    this.members = {
      has: (m) => counts.has(m),
      get size() {
        return counts.size;
      },
      [Symbol.iterator]: () => counts.keys(),
    };
    this.name = name;
    this.family = family;
    this.type = type;
    this.spec = spec;
  }
}

export class SetRegistry {
  readonly #cluster: ClusterState;
  readonly #names: Names;
  readonly #changes: Changes;
  /** Every live set, parts of unions included. */
  readonly #sets = new Map<string, ActiveSet>();
  /** The sets some rule references: what the kernel holds. */
  readonly #kernelSets = new Map<string, ActiveSet>();
  // Reverse indexes over pod-peer sets: own-namespace peers by namespace; other peers by a
  // narrowing requirement of their pod selector, else by their namespace selector (for pod
  // changes); every namespace-selector peer by its namespace selector (for namespace changes).
  readonly #byOwnNs = new Map<string, Set<ActiveSet>>();
  readonly #byPodLabels = new SelectorIndex<ActiveSet>();
  readonly #byNsLabelsForPods = new SelectorIndex<ActiveSet>();
  readonly #byNsLabels = new SelectorIndex<ActiveSet>();
  readonly #candidates = new Set<ActiveSet>();

  constructor(cluster: ClusterState, names: Names, changes: Changes) {
    this.#cluster = cluster;
    this.#names = names;
    this.#changes = changes;
  }

  /** The sets the kernel holds (live view). */
  get kernelSets(): ReadonlyMap<string, DesiredSet> {
    return this.#kernelSets;
  }

  /** Every live set, parts of unions included (for tests and figures). */
  get liveCount(): number {
    return this.#sets.size;
  }

  /** Takes a rule's reference: the set is in the kernel while any rule holds one. */
  acquire(spec: SetSpec): ActiveSet {
    return this.#acquire(spec, false);
  }

  release(set: ActiveSet): void {
    this.#release(set, false);
  }

  /** The set a spec names, taking no reference and keeping nothing: the live set when one
   *  exists (what the kernel holds), else one filled as acquire would fill it. For readers
   *  such as `weir explain`, which must judge by calc's members. */
  peek(spec: SetSpec): DesiredSet {
    const name = this.#names.peerSet(spec.family, setKey(spec));
    const live = this.#sets.get(name);
    if (live) return live;
    const members = new Set<string>();
    const peer = spec.peer;
    if (peer.kind === 'union') for (const part of peer.parts) for (const m of this.peek(part).members) members.add(m);
    else fill(this.#cluster, spec, peer, (m) => members.add(m));
    return { name, family: spec.family, type: typeOf(spec), members };
  }

  /** A pod came, went or changed: only the sets its old or new labels (or its namespace's)
   *  may satisfy are visited. */
  podChanged(old: Pod | undefined, pod: Pod | undefined): void {
    const candidates = this.#candidates;
    candidates.clear();
    for (const p of [old, pod]) {
      if (!p) continue;
      const own = this.#byOwnNs.get(p.namespace);
      if (own) for (const s of own) candidates.add(s);
      this.#byPodLabels.collect(p.labels, candidates);
      this.#byNsLabelsForPods.collect(this.#cluster.namespaceLabels(p.namespace), candidates);
    }
    for (const set of candidates) {
      const peer = set.spec.peer;
      if (peer.kind !== 'pods') continue;
      const before = old && this.#cluster.peerMatchesPod(peer, old) ? podMembers(old, set.spec) : [];
      const after = pod && this.#cluster.peerMatchesPod(peer, pod) ? podMembers(pod, set.spec) : [];
      if (before.length === after.length && before.every((m, i) => m === after[i])) continue;
      for (const m of before) this.#removeMember(set, m);
      for (const m of after) this.#addMember(set, m);
    }
  }

  /** A namespace's labels changed: only sets whose namespace selector may match either
   *  version are visited, and then only that namespace's pods. */
  namespaceLabelsChanged(ns: string, before: Labels, after: Labels): void {
    const candidates = new Set<ActiveSet>();
    this.#byNsLabels.collect(before, candidates);
    this.#byNsLabels.collect(after, candidates);
    for (const set of candidates) {
      const peer = set.spec.peer;
      if (peer.kind !== 'pods' || peer.namespaceSelector === null) continue;
      const was = selectorMatches(peer.namespaceSelector, before);
      const is = selectorMatches(peer.namespaceSelector, after);
      if (was === is) continue;
      for (const pod of this.#cluster.podsIn(ns)) {
        if (!selectorMatches(peer.podSelector, pod.labels)) continue;
        for (const m of podMembers(pod, set.spec)) is ? this.#addMember(set, m) : this.#removeMember(set, m);
      }
    }
  }

  /** A reference for a rule, or for a union (`forUnion`), which keeps the set out of the kernel. */
  #acquire(spec: SetSpec, forUnion: boolean): ActiveSet {
    const name = this.#names.peerSet(spec.family, setKey(spec));
    let set = this.#sets.get(name);
    if (!set) set = this.#create(name, spec);
    if (forUnion) set.unionRefs++;
    else if (set.refs++ === 0) {
      // Entering the kernel: its members were not recorded while out, so it goes whole.
      this.#kernelSets.set(name, set);
      this.#changes.wholeSet(name);
    }
    return set;
  }

  #create(name: string, spec: SetSpec): ActiveSet {
    const set = new ActiveSet(name, spec.family, typeOf(spec), spec);
    this.#sets.set(name, set);
    const peer = spec.peer;
    if (peer.kind === 'union') {
      // A member's count in a union is the number of its parts that hold it.
      for (const partSpec of peer.parts) {
        const part = this.#acquire(partSpec, true);
        set.parts.push(part);
        part.unions.add(set);
        for (const m of part.counts.keys()) this.#addMember(set, m);
      }
      return set;
    }
    fill(this.#cluster, spec, peer, (m) => this.#addMember(set, m));
    if (peer.kind === 'pods') this.#index(set, peer, true);
    return set;
  }

  #release(set: ActiveSet, forUnion: boolean): void {
    if (forUnion) set.unionRefs--;
    else if (--set.refs === 0) {
      this.#kernelSets.delete(set.name);
      this.#changes.wholeSet(set.name);
    }
    if (set.refs + set.unionRefs > 0) return;
    this.#sets.delete(set.name);
    if (set.spec.peer.kind === 'pods') this.#index(set, set.spec.peer, false);
    for (const part of set.parts.splice(0)) {
      part.unions.delete(set);
      this.#release(part, true);
    }
  }

  #index(set: ActiveSet, peer: PodsPeer, add: boolean): void {
    if (peer.namespace !== null) {
      let s = this.#byOwnNs.get(peer.namespace);
      if (add) {
        if (!s) this.#byOwnNs.set(peer.namespace, (s = new Set()));
        s.add(set);
      } else if (s) {
        s.delete(set);
        if (s.size === 0) this.#byOwnNs.delete(peer.namespace);
      }
      return;
    }
    const op = add ? 'add' : 'remove';
    if (narrowing(peer.podSelector)) this.#byPodLabels[op](set, peer.podSelector);
    else this.#byNsLabelsForPods[op](set, peer.namespaceSelector);
    this.#byNsLabels[op](set, peer.namespaceSelector);
  }

  #addMember(set: ActiveSet, m: string): void {
    const n = set.counts.get(m) ?? 0;
    set.counts.set(m, n + 1);
    if (n > 0) return;
    // A set the kernel does not hold gets all its members when it enters.
    if (set.refs > 0) this.#changes.member(set.name, m);
    for (const u of set.unions) this.#addMember(u, m);
  }

  #removeMember(set: ActiveSet, m: string): void {
    const n = set.counts.get(m) ?? 0;
    if (n > 1) set.counts.set(m, n - 1);
    else if (set.counts.delete(m)) {
      if (set.refs > 0) this.#changes.member(set.name, m);
      for (const u of set.unions) this.#removeMember(u, m);
    }
  }
}

const typeOf = (spec: SetSpec): SetType => (spec.namedPort ? 'hash:ip,port' : 'hash:net');

/** Gives `add` the members a new set of prefixes or pods (`peer`, its spec's) starts with,
 *  once per block or pod contributing each; a union's come from its parts. */
function fill(cluster: ClusterState, spec: SetSpec, peer: PodsPeer | PrefixSet, add: (m: string) => void): void {
  // ipBlock prefixes, aggregated by the model: never a /0, which hash:net cannot hold.
  // As the kernel prints them: a union holding an address from a /32 block and from a pod
  // counts it twice, so the pod leaving does not delete what the block still needs.
  if (peer.kind === 'prefixes') for (const m of peer.cidrs) add(netMember(m));
  else if (spec.namedPort) for (const pod of cluster.podsMatching(peer)) for (const m of podMembers(pod, spec)) add(m);
  else for (const m of cluster.peerAddresses(peer, spec.family)) add(m);
}

/** Members a pod gives a set: its addresses of the set's family, with the resolved port
 *  for a named-port set (pods lacking that name and protocol give none). */
function podMembers(pod: Pod, spec: SetSpec): string[] {
  if (!isPeerEligible(pod)) return [];
  const ips = pod.ips.filter((ip) => familyOf(ip) === spec.family);
  const np = spec.namedPort;
  if (!np) return ips;
  const proto = np.protocol.toLowerCase();
  const out: string[] = [];
  for (const cp of pod.ports) {
    if (cp.name === np.name && cp.protocol === np.protocol) for (const ip of ips) out.push(`${ip},${proto}:${cp.port}`);
  }
  return out;
}
