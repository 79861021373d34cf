// The incremental compiler: model events in, desired dataplane and exactly-what-changed out.
//
// Work per event follows what the event touches:
// - a pod change looks up only the active peer sets its labels (or its namespace's) may
//   satisfy, and refreshes its own chains if it runs on this node;
// - a namespace label change revisits only sets whose namespace selector may match it;
// - a policy change recompiles that policy and the local pods of its namespace.
// Only policies that select a pod of this node are "active": they own chains and hold
// references on peer sets. A set lives while a rule or a union references it, and is in the
// kernel (desired.sets) only while a rule does: a union's parts only carry its counts.

import { compareStrings } from '../model/order.ts';
import { ClusterState, isPeerEligible, isPoliced } from '../model/cluster.ts';
import { narrowing, SelectorIndex } from '../model/label-index.ts';
import { formatCidr, parseIp } from '../model/cidr.ts';
import { compilePolicy, PolicyParts } from '../model/policy.ts';
import { selectorMatches } from '../model/selector.ts';
import { namespaceAuditLevel } from '../model/annotations.ts';
import type { AuditLevel, CalcEvent, CompiledPolicy, Enforcement, Family, Labels, Pod, PodsPeer } from '../model/types.ts';
import type { AuditCatalog, AuditTag, AuditVerdict } from './audit-tags.ts';
import { familyOf } from '../model/types.ts';
import type { Action, DesiredDataplane, DesiredSet, Dirty, Match, Members, Rule, SetType } from './desired.ts';
import { sha256Base64Url } from './hash.ts';
import { emptyDirty, netMember } from './desired.ts';
import type { Names } from './names.ts';
import type { AllowAlternative, AuditRules, Direction, MarkBits, SetSpec } from './rules.ts';
import type { AllowAction } from './rules.ts';
import {
  acceptChainRules,
  allowAlternatives,
  bucketTailRule,
  dispatchTailRules,
  hostCidr,
  mergeable,
  policyChainRules,
  setKey,
  topChainRules,
  workloadChainRules,
  workloadCommonRules,
} from './rules.ts';

export interface CalcConfig {
  readonly nodeName: string;
  readonly names: Names;
  readonly families: readonly Family[];
  readonly marks: MarkBits;
  /** The bridge local pods hang off; traffic through it of no known pod is dropped. Default
   *  '' (none): then only this node's pod CIDRs fail closed. */
  readonly podBridge?: string;
  /** Default ACCEPT. */
  readonly allowAction?: AllowAction;
  /** Bind each local pod's address to its bridge port (PodInterface events): a pod may send
   *  only from its own address through its own port, and not before its port is known. */
  readonly sourceBinding?: boolean;
  /** Audit log rules (NFLOG); absent: none are written, and audit-only policies only stay
   *  unenforced. */
  readonly audit?: AuditConfig;
}

export interface AuditConfig {
  /** The NFLOG group the agent's reader listens on. */
  readonly group: number;
  /** The level of policies whose namespace and own annotations say nothing. */
  readonly defaultLevel: AuditLevel;
  /** Kernel-side cap on events per second on this node, per family (one bucket for every rule). */
  readonly perSecond: number;
  readonly burst: number;
}

/** Bytes of each packet NFLOG copies: the IP and transport headers are all the log needs. */
export const AUDIT_COPY_BYTES = 128;
/** Tags of audit rules that were removed stay readable this long (in tags): an event the
 *  kernel logged just before the rule went may still be on its way. */
const RETIRED_TAGS = 4096;

/** What the status reporter and logs want to know about a policy on this node. */
export interface PolicyReport {
  readonly key: string;
  readonly uid: string;
  readonly generation: number;
  readonly errors: CompiledPolicy['errors'];
  /** Local pods it selects. */
  readonly localPods: number;
  /** 'audit': evaluated and logged, never enforced. */
  readonly enforcement: Enforcement;
  /** What its rules log on this node (its annotation, else its namespace's, else the default). */
  readonly auditLevel: AuditLevel;
}

class ActiveSet implements DesiredSet {
  readonly name: string;
  readonly family: Family;
  readonly type: SetType;
  readonly spec: SetSpec;
  /** References from rules: the kernel holds the set while there are any. */
  refs = 0;
  /** References from unions it is a part of. */
  unionRefs = 0;
  /** Member -> number of pods (or blocks) contributing it: two pods may briefly share an IP.
   *  Its keys are the members; no second collection, since sets can be very large (sizes in docs/performance.md). */
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

interface ActivePolicy {
  readonly policy: CompiledPolicy;
  readonly level: AuditLevel;
  readonly sets: readonly ActiveSet[];
  /** NFLOG prefixes of its audit rules. */
  readonly tags: readonly string[];
}

interface Workload {
  readonly pod: Pod;
  /** Keys of the enforced policies selecting the pod that isolate each direction, sorted. */
  readonly ingress: readonly string[];
  readonly egress: readonly string[];
  /** The same for audit-only policies: they never isolate. */
  readonly auditIngress: readonly string[];
  readonly auditEgress: readonly string[];
  /** NFLOG prefixes of its chains' audit rules. */
  readonly tags: readonly string[];
  /** Sets its chains use directly (merged peers), one reference each. */
  readonly sets: readonly ActiveSet[];
}

export class Calculator {
  readonly #cfg: CalcConfig;
  readonly #cluster = new ClusterState();
  /** Every live set, parts of unions included. */
  readonly #sets = new Map<string, ActiveSet>();
  /** The sets some rule references: what the kernel holds (desired.sets). */
  readonly #kernelSets = new Map<string, ActiveSet>();
  readonly #chains = { 4: new Map<string, readonly Rule[]>(), 6: new Map<string, readonly Rule[]>() };
  readonly #workloads = new Map<string, Workload>();
  readonly #workloadsByNs = new Map<string, Set<string>>();
  /** Addresses local pods gave up since the last takeReleasedAddresses: address -> the pod's uid. */
  readonly #released = new Map<string, string>();
  /** Local workloads selecting each policy key (in any direction it isolates). */
  readonly #policyRefs = new Map<string, number>();
  readonly #active = new Map<string, ActivePolicy>();
  /** How many of the cluster's policies are invalid. */
  #invalidPolicies = 0;
  // Reverse indexes over active pod-peer sets, see the header comment.
  readonly #setsByOwnNs = new Map<string, Set<ActiveSet>>();
  readonly #setsByPodLabels = new SelectorIndex<ActiveSet>();
  readonly #setsByNsLabelsForPods = new SelectorIndex<ActiveSet>();
  readonly #setsByNsLabels = new SelectorIndex<ActiveSet>();
  readonly #candidates = new Set<ActiveSet>();
  #policyChanges: { key: string; policy: CompiledPolicy | null }[] = [];
  #dirty: Dirty = emptyDirty();
  #touchedPolicies = new Set<string>();
  /** Dispatch block -> local workloads (uid -> address) in it, and blocks changed this batch. */
  readonly #blockPods = new Map<string, Map<string, string>>();
  readonly #dirtyBlocks = new Set<string>();
  /** Local pod address -> the bridge port it lives behind (learned from the kernel). */
  readonly #ports = new Map<string, string>();
  readonly #allow: AllowAction;
  /** This node's pod CIDRs, from its Node object. */
  #podCIDRs: readonly string[] = [];
  /** Namespace -> its weir.dev/audit level, for namespaces that set one. */
  readonly #nsAudit = new Map<string, AuditLevel>();
  /** NFLOG prefix -> what its rule means, for the rules desired now, and recently removed. */
  readonly #tags = new Map<string, AuditTag>();
  readonly #retiredTags = new Map<string, AuditTag>();
  readonly #auditRules: AuditRules | undefined;
  /** Equal selectors and rule lists of different policies, held once. */
  readonly #policyParts = new PolicyParts();
  /** A compiled policy's allow alternatives, by direction and family (computed once). */
  readonly #alternatives = new WeakMap<CompiledPolicy, Map<string, AllowAlternative[]>>();
  /** Workload set references to drop once the batch's policies are synced. */
  #releaseLater: ActiveSet[] = [];

  constructor(cfg: CalcConfig) {
    this.#cfg = cfg;
    this.#allow = cfg.allowAction ?? 'ACCEPT';
    if (cfg.audit) this.#auditRules = { limit: { kind: 'limit', name: `${cfg.names.prefix}-audit`, perSecond: cfg.audit.perSecond, burst: cfg.audit.burst } };
    const n = cfg.names;
    for (const f of cfg.families) {
      this.#setChain(
        f,
        n.forward,
        topChainRules({ family: f, fromDispatch: n.fromWorkloadDispatch, toDispatch: n.toWorkloadDispatch, marks: cfg.marks, allowAction: this.#allow, acceptChain: n.accept }),
      );
      this.#setChain(f, n.workloadCommon, workloadCommonRules(cfg.marks, this.#allow, n.accept));
      if (this.#allow === 'ACCEPT') this.#setChain(f, n.accept, acceptChainRules(cfg.marks));
    }
    // Before anything is known every pod of the bridge is unknown: the very first desired
    // state already fails closed (agent/ may write it before the source has synced).
    this.#rebuildTopDispatch(new Set(cfg.families));
  }

  /** The whole desired dataplane (live view; read it between calls to applyEvents). */
  get desired(): DesiredDataplane {
    return { sets: this.#kernelSets, chains: this.#chains, topChain: this.#cfg.names.forward };
  }

  get cluster(): ClusterState {
    return this.#cluster;
  }

  /** What each NFLOG prefix of the audit rules means (removed ones stay for a while). */
  get auditCatalog(): AuditCatalog {
    return { lookup: (prefix) => this.#tags.get(prefix) ?? this.#retiredTags.get(prefix) };
  }

  /** Applies a batch of events; returns exactly the sets, members and chains they changed. */
  applyEvents(events: Iterable<CalcEvent>): Dirty {
    for (const e of events) this.#apply(e);
    return this.#finishBatch();
  }

  /** Dirty state accumulated since construction/last call (the cold-start payload). */
  takeDirty(): Dirty {
    const d = this.#dirty;
    this.#dirty = emptyDirty();
    return d;
  }

  /** Policies upserted (compiled, with their errors) or deleted (null) since the last call,
   *  in order, so the agent can report invalid ones once per change. */
  takePolicyChanges(): { key: string; policy: CompiledPolicy | null }[] {
    return this.#policyChanges.splice(0);
  }

  /**
   * Addresses a local pod gave up since the last call (deleted, no longer policed, or given a
   * new address), sorted; one that went back to the same pod is not among them. The kernel
   * still tracks their connections, and would let a pod that gets the address next carry on
   * with them as established, past its own policies: the dataplane forgets those flows.
   */
  takeReleasedAddresses(): string[] {
    const out = [...this.#released.keys()].sort();
    this.#released.clear();
    return out;
  }

  /** Every policy in the cluster, sorted by key: O(policies), for `weir render` and tests. */
  policyReports(): PolicyReport[] {
    return this.#reports(this.#cluster.policies.keys());
  }

  /** The policies that select a pod of this node, sorted by key: what a write reports. Its cost
   *  follows this node's policies, not the cluster's. */
  enforcedPolicyReports(): PolicyReport[] {
    return this.#reports(this.#policyRefs.keys());
  }

  /** Counts of the cluster's policies, kept as they change (a write reads them). */
  policyCounts(): { valid: number; invalid: number } {
    const all = this.#cluster.policies.size;
    return { valid: all - this.#invalidPolicies, invalid: this.#invalidPolicies };
  }

  #reports(keys: Iterable<string>): PolicyReport[] {
    const out: PolicyReport[] = [];
    for (const key of keys) {
      const p = this.#cluster.policies.get(key);
      if (!p) continue;
      out.push({
        key: p.key,
        uid: p.uid,
        generation: p.generation,
        errors: p.errors,
        localPods: this.#policyRefs.get(p.key) ?? 0,
        enforcement: p.enforcement,
        auditLevel: this.#levelOf(p),
      });
    }
    return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  get localPodCount(): number {
    return this.#workloads.size;
  }

  // ---- events -------------------------------------------------------------------------

  #apply(e: CalcEvent): void {
    switch (e.kind) {
      case 'Pod': {
        const old = e.op === 'upsert' ? this.#cluster.upsertPod(e.object) : this.#cluster.deletePod(e.uid);
        this.#onPod(old, e.op === 'upsert' ? e.object : undefined);
        return;
      }
      case 'Namespace': {
        const name = e.op === 'upsert' ? e.object.name : e.name;
        const old = e.op === 'upsert' ? this.#cluster.upsertNamespace(e.object) : this.#cluster.deleteNamespace(name);
        this.#onNamespaceLabels(name, old, this.#cluster.namespaceLabels(name));
        this.#onNamespaceAudit(name, e.op === 'upsert' ? namespaceAuditLevel(e.object.audit) : null);
        return;
      }
      case 'Node': {
        if (e.op === 'upsert') this.#cluster.nodes.set(e.object.name, e.object);
        else this.#cluster.nodes.delete(e.name);
        const name = e.op === 'upsert' ? e.object.name : e.name;
        if (name !== this.#cfg.nodeName) return;
        // Without its Node the pod bridge alone closes this node's unknown addresses.
        const cidrs = e.op === 'upsert' ? [...e.object.podCIDRs].sort() : [];
        if (cidrs.join() === this.#podCIDRs.join()) return;
        this.#podCIDRs = cidrs;
        this.#rebuildTopDispatch(new Set(this.#cfg.families));
        return;
      }
      case 'PodInterface': {
        const ip = e.op === 'upsert' ? e.object.ip : e.ip;
        const before = this.#ports.get(ip);
        if (e.op === 'upsert') this.#ports.set(ip, e.object.port);
        else this.#ports.delete(ip);
        if (before !== this.#ports.get(ip) && this.#cfg.sourceBinding) this.#dirtyBlocks.add(dispatchBlock(ip));
        return;
      }
      case 'NetworkPolicy': {
        const ns = e.op === 'upsert' ? e.object.namespace : e.namespace;
        const key = e.op === 'upsert' ? `${ns}/${e.object.name}` : `${ns}/${e.name}`;
        const invalid = (p: CompiledPolicy | undefined) => (p !== undefined && p.errors.length > 0 ? 1 : 0);
        if (e.op === 'upsert') {
          const compiled = this.#policyParts.share(compilePolicy(e.object));
          this.#invalidPolicies += invalid(compiled) - invalid(this.#cluster.upsertPolicy(compiled));
          this.#policyChanges.push({ key, policy: compiled });
        } else {
          this.#invalidPolicies -= invalid(this.#cluster.deletePolicy(key));
          this.#policyChanges.push({ key, policy: null });
        }
        this.#touchedPolicies.add(key);
        for (const uid of [...(this.#workloadsByNs.get(ns) ?? [])]) this.#refreshWorkload(uid, this.#workloads.get(uid)!.pod);
        return;
      }
    }
  }

  #onPod(old: Pod | undefined, pod: Pod | undefined): void {
    // Peer sets: only those the old or new labels (or the namespace's labels) may satisfy.
    const candidates = this.#candidates;
    candidates.clear();
    for (let i = 0; i < 2; i++) {
      const p = i === 0 ? old : pod;
      if (!p) continue;
      const own = this.#setsByOwnNs.get(p.namespace);
      if (own) for (const s of own) candidates.add(s);
      this.#setsByPodLabels.collect(p.labels, candidates);
      this.#setsByNsLabelsForPods.collect(this.#cluster.namespaceLabels(p.namespace), candidates);
    }
    for (const set of candidates) {
      const peer = set.spec.peer as PodsPeer;
      const before = old && this.#cluster.peerMatchesPod(peer, old) ? podMembers(old, set) : [];
      const after = pod && this.#cluster.peerMatchesPod(peer, pod) ? podMembers(pod, set) : [];
      if (before.length === after.length && before.every((m, i) => m === after[i])) continue;
      for (const m of before) this.#removeMember(set, m);
      for (const m of after) this.#addMember(set, m);
    }
    const uid = (pod ?? old)!.uid;
    if (this.#workloads.has(uid) || (pod && this.#isLocal(pod))) this.#refreshWorkload(uid, pod);
  }

  #onNamespaceLabels(ns: string, before: Labels, after: Labels): void {
    const candidates = new Set<ActiveSet>();
    this.#setsByNsLabels.collect(before, candidates);
    this.#setsByNsLabels.collect(after, candidates);
    for (const set of candidates) {
      const peer = set.spec.peer as PodsPeer;
      const was = selectorMatches(peer.namespaceSelector!, before);
      const is = selectorMatches(peer.namespaceSelector!, after);
      if (was === is) continue;
      for (const pod of this.#cluster.podsIn(ns)) {
        if (!selectorMatches(peer.podSelector, pod.labels)) continue;
        for (const m of podMembers(pod, set)) is ? this.#addMember(set, m) : this.#removeMember(set, m);
      }
    }
  }

  /** A namespace's audit level changes what its policies' and pods' chains log. */
  #onNamespaceAudit(ns: string, level: AuditLevel | null): void {
    if ((this.#nsAudit.get(ns) ?? null) === level) return;
    if (level === null) this.#nsAudit.delete(ns);
    else this.#nsAudit.set(ns, level);
    if (!this.#cfg.audit) return;
    for (const p of this.#cluster.policiesIn(ns)) this.#touchedPolicies.add(p.key);
    for (const uid of [...(this.#workloadsByNs.get(ns) ?? [])]) this.#refreshWorkload(uid, this.#workloads.get(uid)!.pod);
  }

  /** What a policy's rules log: its own annotation, else its namespace's, else the default. */
  #levelOf(p: CompiledPolicy): AuditLevel {
    return p.audit ?? this.#nsAudit.get(p.namespace) ?? this.#cfg.audit?.defaultLevel ?? 'off';
  }

  /** The NFLOG action of an audit rule, its tag recorded under its prefix (into `owned`). */
  #auditLog(code: string, identity: string, tag: AuditTag, owned: string[]): Action {
    const prefix = `weir:${code}:${sha256Base64Url(identity).slice(0, 20)}`;
    this.#tags.set(prefix, tag);
    this.#retiredTags.delete(prefix);
    owned.push(prefix);
    return { kind: 'nflog', group: this.#cfg.audit!.group, prefix, size: AUDIT_COPY_BYTES };
  }

  /** Tags an owner no longer writes move to the bounded retired map. */
  #retireTags(before: readonly string[], after: readonly string[]): void {
    const keep = new Set(after);
    for (const prefix of before) {
      if (keep.has(prefix)) continue;
      const tag = this.#tags.get(prefix);
      if (!tag) continue;
      this.#tags.delete(prefix);
      this.#retiredTags.set(prefix, tag);
      if (this.#retiredTags.size > RETIRED_TAGS) this.#retiredTags.delete(this.#retiredTags.keys().next().value!);
    }
  }

  // ---- local workloads ------------------------------------------------------------------

  #isLocal(pod: Pod): boolean {
    return pod.nodeName === this.#cfg.nodeName && isPoliced(pod);
  }

  /** Recomputes which policies select a pod of this node and rewrites its chains. */
  #refreshWorkload(uid: string, pod: Pod | undefined): void {
    const old = this.#workloads.get(uid);
    let next: Workload | undefined;
    const tags: string[] = [];
    const sets: ActiveSet[] = [];
    if (pod && this.#isLocal(pod)) {
      const lists = { ingress: [] as string[], egress: [] as string[], auditIngress: [] as string[], auditEgress: [] as string[] };
      for (const p of this.#cluster.policiesIn(pod.namespace)) {
        if (p.podSelector !== null && !selectorMatches(p.podSelector, pod.labels)) continue;
        const audit = p.enforcement === 'audit';
        if (p.ingress !== null) (audit ? lists.auditIngress : lists.ingress).push(p.key);
        if (p.egress !== null) (audit ? lists.auditEgress : lists.egress).push(p.key);
      }
      for (const l of Object.values(lists)) l.sort();
      next = { pod, ...lists, tags, sets };
    }
    // Reference counts decide which policies are active on this node.
    const keys = (w: Workload | undefined) => new Set(w ? [...w.ingress, ...w.egress, ...w.auditIngress, ...w.auditEgress] : []);
    const before = keys(old);
    const after = keys(next);
    for (const k of after) if (!before.has(k)) this.#refPolicy(k, +1);
    for (const k of before) if (!after.has(k)) this.#refPolicy(k, -1);

    const names = this.#cfg.names;
    if (old && (!next || old.pod.namespace !== next.pod.namespace)) this.#workloadsByNs.get(old.pod.namespace)?.delete(uid);
    if (next) {
      let s = this.#workloadsByNs.get(next.pod.namespace);
      if (!s) this.#workloadsByNs.set(next.pod.namespace, (s = new Set()));
      s.add(uid);
      this.#workloads.set(uid, next);
    } else this.#workloads.delete(uid);
    // A pod's addresses are in its dispatch bucket even when pods briefly share one.
    this.#indexDispatch(uid, old?.pod.ips ?? [], next?.pod.ips ?? []);

    for (const f of this.#cfg.families) {
      const ip = next?.pod.ips.find((a) => familyOf(a) === f);
      const tw = names.toWorkload(uid);
      const fw = names.fromWorkload(uid);
      if (!next || ip === undefined) {
        this.#deleteChain(f, tw);
        this.#deleteChain(f, fw);
        continue;
      }
      const podRef = `${next.pod.namespace}/${next.pod.name}`;
      const chainsOf = (dir: Direction, list: readonly string[], auditOnly: readonly string[]) => {
        const isolated = list.length > 0;
        const chainOf = (k: string) => (dir === 'ingress' ? names.policyIngress(k) : names.policyEgress(k));
        return workloadChainRules({
          direction: dir,
          podRef,
          podIp: ip,
          policyChains: isolated ? this.#consultOrder(f, dir, list, chainOf, sets) : null,
          auditOnlyChains: auditOnly.map(chainOf),
          marks: this.#cfg.marks,
          commonChain: names.workloadCommon,
          allowAction: this.#allow,
          acceptChain: names.accept,
          audit: this.#workloadAudit(uid, dir, list, auditOnly, tags),
        });
      };
      this.#setChain(f, tw, chainsOf('ingress', next.ingress, next.auditIngress));
      this.#setChain(f, fw, chainsOf('egress', next.egress, next.auditEgress));
    }
    this.#retireTags(old?.tags ?? [], tags);
    // Released at the end of the batch: a set this workload stops using may be taken up by a
    // policy chain in the same batch (its audit level changed), and is then never rebuilt.
    this.#releaseLater.push(...(old?.sets ?? []));
  }

  /**
   * What an isolated workload consults, in order: policies audited at level all (their own
   * chains, so each allow is logged under its rule), then one rule per port signature whose
   * set is the union of every other enforced policy's peers with that signature (one lookup
   * however many policies), then the chains of policies with rules that cannot merge. The
   * per-packet cost follows the distinct port signatures, not the number of policies.
   */
  #consultOrder(f: Family, dir: Direction, keys: readonly string[], chainOf: (k: string) => string, sets: ActiveSet[]): (string | readonly Rule[])[] {
    const policies = keys.map((k) => this.#cluster.policies.get(k)!);
    const first = policies.filter((p) => this.#ownChain(p)).map((p) => chainOf(p.key));
    const groups = new Map<string, { rest: readonly Match[]; any: boolean; parts: Map<string, SetSpec>; dir: string }>();
    const remainder: string[] = [];
    for (const p of policies) {
      if (this.#ownChain(p)) continue;
      let rest = false;
      for (const alt of this.#alternativesOf(p, dir, f)) {
        const m = mergeable(alt);
        if (!m) {
          rest = true;
          continue;
        }
        const sig = JSON.stringify([m.peer?.dir ?? '', m.rest]);
        let g = groups.get(sig);
        if (!g) groups.set(sig, (g = { rest: m.rest, any: false, parts: new Map(), dir: m.peer?.dir ?? '' }));
        if (m.peer === null) g.any = true;
        else g.parts.set(setKey(m.peer.spec), m.peer.spec);
      }
      if (rest) remainder.push(chainOf(p.key));
    }
    const merged: Rule[] = [];
    const allow = { kind: 'setMark', value: this.#cfg.marks.accept, mask: this.#cfg.marks.accept } as const;
    for (const sig of [...groups.keys()].sort(compareStrings)) {
      const g = groups.get(sig)!;
      const comment = `merged peers of ${dir} policies`;
      if (g.any) {
        merged.push({ matches: g.rest, action: allow, comment });
        continue;
      }
      const parts = [...g.parts.keys()].sort(compareStrings).map((k) => g.parts.get(k)!);
      const spec: SetSpec = parts.length === 1 ? parts[0] : { family: f, peer: { kind: 'union', key: `union|${parts.map(setKey).join('\n')}`, parts } };
      const set = this.#acquireSet(spec);
      sets.push(set);
      merged.push({ matches: [{ kind: 'set', set: set.name, dir: g.dir as 'src' | 'dst' }, ...g.rest], action: allow, comment });
    }
    return [...first, ...(merged.length > 0 ? [merged] : []), ...remainder];
  }

  /** Audit-only policies and policies audited at level all keep every rule in their own chain
   *  (audit-only ones are consulted only for would-deny, level-all ones log per rule). */
  #ownChain(p: CompiledPolicy): boolean {
    return p.enforcement === 'audit' || this.#levelOf(p) === 'all';
  }

  #alternativesOf(p: CompiledPolicy, dir: Direction, f: Family): AllowAlternative[] {
    let byKey = this.#alternatives.get(p);
    if (!byKey) this.#alternatives.set(p, (byKey = new Map()));
    const key = `${dir}${f}`;
    let alts = byKey.get(key);
    if (!alts) byKey.set(key, (alts = allowAlternatives(p, dir, f)));
    return alts;
  }

  /** The default drop is logged when an isolating policy is audited; what audit-only policies
   *  would drop always is (that is what they are for). */
  #workloadAudit(uid: string, dir: Direction, enforced: readonly string[], auditOnly: readonly string[], tags: string[]): WorkloadAudit | undefined {
    if (!this.#auditRules) return undefined;
    const refs = (keys: readonly string[]) => keys.map((k) => this.#cluster.policies.get(k)!).map((p) => ({ namespace: p.namespace, name: p.name }));
    const tag = (verdict: AuditVerdict, keys: readonly string[]): AuditTag => ({ verdict, direction: dir, policy: null, reason: 'default-deny', isolatedBy: refs(keys) });
    const d = dir === 'ingress' ? 'I' : 'E';
    if (enforced.length > 0) {
      if (!enforced.some((k) => this.#levelOf(this.#cluster.policies.get(k)!) !== 'off')) return undefined;
      return { ...this.#auditRules, logDeny: this.#auditLog(`D${d}`, `${uid}\n${dir}`, tag('deny', enforced), tags) };
    }
    if (auditOnly.length === 0) return undefined;
    return { ...this.#auditRules, logWouldDeny: this.#auditLog(`W${d}`, `${uid}\n${dir}`, tag('would-deny', auditOnly), tags) };
  }

  #refPolicy(key: string, delta: number): void {
    const n = (this.#policyRefs.get(key) ?? 0) + delta;
    if (n === 0) this.#policyRefs.delete(key);
    else this.#policyRefs.set(key, n);
    this.#touchedPolicies.add(key);
  }

  // ---- active policies ------------------------------------------------------------------

  /** Makes the active record of a policy match (refs > 0 ? current compiled policy : none). */
  #syncPolicy(key: string): void {
    const current = this.#active.get(key);
    const policy = (this.#policyRefs.get(key) ?? 0) > 0 ? this.#cluster.policies.get(key) : undefined;
    const level = policy ? this.#levelOf(policy) : 'off';
    if (current?.policy === policy && (policy === undefined || current?.level === level)) return;
    const names = this.#cfg.names;
    const acquired: ActiveSet[] = [];
    const tags: string[] = [];
    if (policy) {
      const useSet = (spec: SetSpec) => {
        const s = this.#acquireSet(spec);
        acquired.push(s);
        return s.name;
      };
      for (const f of this.#cfg.families) {
        for (const dir of ['ingress', 'egress'] as const) {
          const chain = dir === 'ingress' ? names.policyIngress(key) : names.policyEgress(key);
          // Merged policies keep only the rules that cannot merge; workloads jump to the chain
          // only when it holds some (see #consultOrder).
          const all = this.#alternativesOf(policy, dir, f);
          const own = this.#ownChain(policy) ? all : all.filter((a) => mergeable(a) === null);
          const isolates = (dir === 'ingress' ? policy.ingress : policy.egress) !== null;
          if (!isolates || (own.length === 0 && !this.#ownChain(policy))) this.#deleteChain(f, chain);
          else this.#setChain(f, chain, policyChainRules(policy, dir, own, this.#cfg.marks, useSet, this.#policyAudit(policy, dir, level, tags)));
        }
      }
      this.#active.set(key, { policy, level, sets: acquired, tags });
    } else {
      for (const f of this.#cfg.families) {
        this.#deleteChain(f, names.policyIngress(key));
        this.#deleteChain(f, names.policyEgress(key));
      }
      this.#active.delete(key);
    }
    // Release after acquiring, so a set both versions use is never torn down and rebuilt.
    for (const s of current?.sets ?? []) this.#releaseSet(s);
    this.#retireTags(current?.tags ?? [], tags);
  }

  /** Level `all`: every allowing rule logs the connections it allows first. */
  #policyAudit(policy: CompiledPolicy, dir: Direction, level: AuditLevel, tags: string[]) {
    if (!this.#auditRules || level !== 'all') return undefined;
    const d = dir === 'ingress' ? 'I' : 'E';
    const logAllow = (rule: number) =>
      this.#auditLog(`A${d}`, `${policy.key}\n${dir}\n${rule}`, { verdict: 'allow', direction: dir, policy: { namespace: policy.namespace, name: policy.name, rule } }, tags);
    return { ...this.#auditRules, logAllow };
  }

  // ---- sets -----------------------------------------------------------------------------

  /** Takes a reference for a rule, or for a union (`forUnion`) which keeps it out of the kernel. */
  #acquireSet(spec: SetSpec, forUnion = false): ActiveSet {
    const name = this.#cfg.names.peerSet(spec.family, setKey(spec));
    let set = this.#sets.get(name);
    if (!set) {
      set = new ActiveSet(name, spec.family, spec.namedPort ? 'hash:ip,port' : 'hash:net', spec);
      this.#sets.set(name, set);
      const peer = spec.peer;
      if (peer.kind === 'prefixes') {
        // ipBlock prefixes, aggregated by the model: never a /0, which hash:net cannot hold.
        // As the kernel prints them: a union holding an address from a /32 block and from a pod
        // counts it twice, so the pod leaving does not delete what the block still needs.
        for (const m of peer.cidrs) this.#addMember(set, netMember(m));
      } else if (peer.kind === 'union') {
        // A member's count in a union is the number of its parts that hold it.
        for (const partSpec of peer.parts) {
          const part = this.#acquireSet(partSpec, true);
          set.parts.push(part);
          part.unions.add(set);
          for (const m of part.counts.keys()) this.#addMember(set, m);
        }
      } else {
        if (spec.namedPort) for (const pod of this.#cluster.podsMatching(peer)) for (const m of podMembers(pod, set)) this.#addMember(set, m);
        else for (const m of this.#cluster.peerAddresses(peer, spec.family)) this.#addMember(set, m);
        this.#indexSet(set, peer, true);
      }
    }
    if (forUnion) set.unionRefs++;
    else if (set.refs++ === 0) {
      // Entering the kernel: its members were not dirtied while out, so it goes whole.
      this.#kernelSets.set(name, set);
      this.#dirty.sets.set(name, 'all');
    }
    return set;
  }

  #releaseSet(set: ActiveSet, forUnion = false): void {
    if (forUnion) set.unionRefs--;
    else if (--set.refs === 0) {
      this.#kernelSets.delete(set.name);
      this.#dirty.sets.set(set.name, 'all');
    }
    if (set.refs + set.unionRefs > 0) return;
    this.#sets.delete(set.name);
    if (set.spec.peer.kind === 'pods') this.#indexSet(set, set.spec.peer, false);
    for (const part of set.parts.splice(0)) {
      part.unions.delete(set);
      this.#releaseSet(part, true);
    }
  }

  #indexSet(set: ActiveSet, peer: PodsPeer, add: boolean): void {
    if (peer.namespace !== null) {
      let s = this.#setsByOwnNs.get(peer.namespace);
      if (add) {
        if (!s) this.#setsByOwnNs.set(peer.namespace, (s = new Set()));
        s.add(set);
      } else if (s) {
        s.delete(set);
        if (s.size === 0) this.#setsByOwnNs.delete(peer.namespace);
      }
      return;
    }
    const op = add ? 'add' : 'remove';
    // For pod changes: by the pod selector when it narrows, else by the namespace selector.
    if (narrowing(peer.podSelector)) this.#setsByPodLabels[op](set, peer.podSelector);
    else this.#setsByNsLabelsForPods[op](set, peer.namespaceSelector);
    this.#setsByNsLabels[op](set, peer.namespaceSelector);
  }

  #addMember(set: ActiveSet, m: string): void {
    const n = set.counts.get(m) ?? 0;
    set.counts.set(m, n + 1);
    if (n > 0) return;
    this.#dirtyMember(set, m);
    for (const u of set.unions) this.#addMember(u, m);
  }

  #removeMember(set: ActiveSet, m: string): void {
    const n = set.counts.get(m) ?? 0;
    if (n > 1) set.counts.set(m, n - 1);
    else if (set.counts.delete(m)) {
      this.#dirtyMember(set, m);
      for (const u of set.unions) this.#removeMember(u, m);
    }
  }

  #dirtyMember(set: ActiveSet, m: string): void {
    // A set the kernel does not hold gets all its members when it enters ('all').
    if (set.refs === 0) return;
    const cur = this.#dirty.sets.get(set.name);
    if (cur === 'all') return;
    if (cur) cur.add(m);
    else this.#dirty.sets.set(set.name, new Set([m]));
  }

  // ---- chains ---------------------------------------------------------------------------

  #setChain(f: Family, name: string, rules: readonly Rule[]): void {
    const cur = this.#chains[f].get(name);
    if (cur && sameRules(cur, rules)) return;
    this.#chains[f].set(name, rules);
    this.#dirty.chains[f].add(name);
  }

  #deleteChain(f: Family, name: string): void {
    if (this.#chains[f].delete(name)) this.#dirty.chains[f].add(name);
  }

  #finishBatch(): Dirty {
    for (const key of this.#touchedPolicies) this.#syncPolicy(key);
    this.#touchedPolicies.clear();
    for (const set of this.#releaseLater.splice(0)) this.#releaseSet(set);
    if (this.#dirtyBlocks.size > 0) this.#rebuildDispatch();
    return this.takeDirty();
  }

  /**
   * Dispatch is a two-level tree: the top chains jump on the /28 (IPv4) or /124 (IPv6) block
   * of the address to a bucket chain of at most 16 pods, which jumps to the pod's chain. A pod
   * coming or going rewrites its bucket only (and the top chains when a block appears or goes).
   */
  #rebuildDispatch(): void {
    const names = this.#cfg.names;
    const topChanged = new Set<Family>();
    for (const block of this.#dirtyBlocks) {
      const f = familyOf(block);
      if (!this.#cfg.families.includes(f)) continue;
      const from = names.dispatchBucket('from', block);
      const to = names.dispatchBucket('to', block);
      const members = this.#blockPods.get(block);
      if (!members) {
        if (this.#chains[f].has(from)) topChanged.add(f);
        this.#deleteChain(f, from);
        this.#deleteChain(f, to);
        continue;
      }
      if (!this.#chains[f].has(from)) topChanged.add(f);
      const ordered = [...members].map(([uid, ip]) => ({ uid, ip, pod: this.#workloads.get(uid)!.pod }));
      ordered.sort((a, b) => compareStrings(`${a.pod.namespace}/${a.pod.name}/${a.uid}`, `${b.pod.namespace}/${b.pod.name}/${b.uid}`));
      const fromRules: Rule[] = [];
      for (const { uid, ip } of ordered) {
        const port = this.#ports.get(ip);
        // Bound: only from its own port. Not bound yet: it may not send at all (tail drop).
        if (this.#cfg.sourceBinding && port === undefined) continue;
        const matches: Match[] = [{ kind: 'addr', dir: 'src', cidr: hostCidr(ip) }];
        if (this.#cfg.sourceBinding) matches.push({ kind: 'bridgePortIn', port: port! });
        fromRules.push({ matches, action: { kind: 'goto', chain: names.fromWorkload(uid) } });
      }
      const toRules = ordered.map(
        ({ uid, ip }): Rule => ({
          matches: [{ kind: 'addr', dir: 'dst', cidr: hostCidr(ip) }],
          action: { kind: 'goto', chain: names.toWorkload(uid) },
        }),
      );
      this.#setChain(f, from, [...fromRules, bucketTailRule('from')]);
      this.#setChain(f, to, [...toRules, bucketTailRule('to')]);
    }
    this.#dirtyBlocks.clear();
    this.#rebuildTopDispatch(topChanged);
  }

  /** The top dispatch chains of the families given: one rule per block, then the tails. */
  #rebuildTopDispatch(families: ReadonlySet<Family>): void {
    const names = this.#cfg.names;
    for (const f of families) {
      const blocks = [...this.#blockPods.keys()].filter((b) => familyOf(b) === f).sort(compareStrings);
      const failClosed = { podBridge: this.#cfg.podBridge ?? '', podCIDRs: this.#podCIDRs.filter((c) => familyOf(c) === f) };
      const top = (dir: 'from' | 'to'): Rule[] => [
        ...blocks.map(
          (block): Rule => ({
            matches: [{ kind: 'addr', dir: dir === 'from' ? 'src' : 'dst', cidr: block }],
            action: { kind: 'goto', chain: names.dispatchBucket(dir, block) },
          }),
        ),
        ...dispatchTailRules(dir, failClosed),
      ];
      this.#setChain(f, names.fromWorkloadDispatch, top('from'));
      this.#setChain(f, names.toWorkloadDispatch, top('to'));
    }
  }

  /** Moves a local workload's addresses between dispatch blocks. */
  #indexDispatch(uid: string, before: readonly string[], after: readonly string[]): void {
    for (const ip of before) {
      if (after.includes(ip)) continue;
      const block = dispatchBlock(ip);
      const m = this.#blockPods.get(block);
      if (m?.get(uid) === ip) {
        m.delete(uid);
        if (m.size === 0) this.#blockPods.delete(block);
      }
      this.#dirtyBlocks.add(block);
      if (this.#cfg.families.includes(familyOf(ip))) this.#released.set(ip, uid);
    }
    for (const ip of after) {
      if (before.includes(ip)) continue;
      if (this.#released.get(ip) === uid) this.#released.delete(ip);
      const block = dispatchBlock(ip);
      let m = this.#blockPods.get(block);
      if (!m) this.#blockPods.set(block, (m = new Map()));
      m.set(uid, ip);
      this.#dirtyBlocks.add(block);
    }
  }
}

type WorkloadAudit = NonNullable<Parameters<typeof workloadChainRules>[0]['audit']>;

/** The /28 or /124 block holding an address: the dispatch bucket it belongs to. */
function dispatchBlock(ip: string): string {
  const a = parseIp(ip);
  if ('error' in a) throw new RangeError(`local pod address ${ip}: ${a.error}`);
  const prefix = a.family === 4 ? 28 : 124;
  return formatCidr({ family: a.family, base: a.value & ~0xfn, prefix });
}

/** Members a pod gives a set: its addresses of the set's family, with the resolved port
 *  for a named-port set (pods lacking that name and protocol give none). */
function podMembers(pod: Pod, set: ActiveSet): string[] {
  if (!isPeerEligible(pod)) return [];
  const ips = pod.ips.filter((ip) => familyOf(ip) === set.family);
  const np = set.spec.namedPort;
  if (!np) return ips;
  const proto = np.protocol.toLowerCase();
  const out: string[] = [];
  for (const cp of pod.ports) {
    if (cp.name === np.name && cp.protocol === np.protocol) for (const ip of ips) out.push(`${ip},${proto}:${cp.port}`);
  }
  return out;
}

function sameRules(a: readonly Rule[], b: readonly Rule[]): boolean {
  return a.length === b.length && JSON.stringify(a) === JSON.stringify(b);
}
