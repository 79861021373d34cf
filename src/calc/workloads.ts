// Local workloads: pods of this node that policy applies to. Each gets a to- and a from-chain
// per family it has an address in, consulting the policies that select it; the reference
// counts kept here decide which policies are active on this node.

import type { ClusterState } from '../model/cluster.ts';
import { isPoliced } from '../model/cluster.ts';
import { compareStrings } from '../model/order.ts';
import { selectorMatches } from '../model/selector.ts';
import type { CompiledPolicy, Family, Pod } from '../model/types.ts';
import { familyOf } from '../model/types.ts';
import type { AuditTag, AuditVerdict } from './audit-tags.ts';
import type { AuditLevels } from './audit-levels.ts';
import type { ChainStore } from './chain-store.ts';
import type { Rule } from './desired.ts';
import type { DispatchTree } from './dispatch.ts';
import type { Names } from './names.ts';
import type { PolicyChains } from './policy-chains.ts';
import type { AllowAction, Direction, MarkBits, SetSpec } from './rules.ts';
import { mergeable, workloadChainRules } from './rules.ts';
import { mergedRules } from './merge.ts';
import type { ClusterPolicies, TierChanges, TierReselect, TierSelection } from './cluster-policies.ts';
import type { CutCandidate } from './cut-opt-in.ts';
import { type TierBuild, TierBuilds } from './tier-builds.ts';
import type { Tier } from './tier-rules.ts';
import type { ActiveSet, SetRegistry } from './set-registry.ts';
import type { AuditWriting } from './tag-catalog.ts';

export interface WorkloadChainsDeps {
  readonly nodeName: string;
  readonly names: Names;
  readonly families: readonly Family[];
  readonly marks: MarkBits;
  readonly allowAction: AllowAction;
  readonly cluster: ClusterState;
  readonly sets: SetRegistry;
  readonly chains: ChainStore;
  readonly dispatch: DispatchTree;
  readonly policies: PolicyChains;
  readonly clusterPolicies: ClusterPolicies;
  readonly levels: AuditLevels;
  readonly audit: AuditWriting | undefined;
  /** A policy's count of local workloads changed (it may become active or inactive). */
  readonly policyRefsChanged: (key: string) => void;
}

/** The policies selecting a local workload in one direction, as its chains consult them. */
export interface DirectionSelection {
  /** Enforced: they isolate the pod. Sorted by key. */
  readonly enforced: readonly CompiledPolicy[];
  /** Audit-only: they never isolate, only log what they would drop. Sorted by key. */
  readonly auditOnly: readonly CompiledPolicy[];
  /** The enforced policies without a chain of their own: the merged rules stand for their
   *  mergeable alternatives. */
  readonly merged: readonly CompiledPolicy[];
}

/** Which policies select a local workload: what its chains were built from. */
export interface WorkloadSelection {
  readonly ingress: DirectionSelection;
  readonly egress: DirectionSelection;
  /** The ClusterNetworkPolicies selecting it, by tier, in evaluation order. */
  readonly tiers: TierSelection;
}

interface Workload {
  readonly pod: Pod;
  /** The enforced policies selecting the pod that isolate each direction, sorted by key. */
  readonly ingress: readonly CompiledPolicy[];
  readonly egress: readonly CompiledPolicy[];
  /** The same for audit-only policies: they never isolate. */
  readonly auditIngress: readonly CompiledPolicy[];
  readonly auditEgress: readonly CompiledPolicy[];
  /** The ClusterNetworkPolicies selecting the pod, by tier (held: see ClusterPolicies.release). */
  readonly tiers: TierSelection;
  /** The count of ClusterNetworkPolicy changes its tiers reflect (ClusterPolicies.version). */
  readonly tiersAt: number;
  /** NFLOG prefixes of its chains' audit rules. */
  readonly tags: readonly string[];
  /** Sets its chains use directly (merged peers), one reference each. */
  readonly sets: readonly ActiveSet[];
  /** The tier chain builds its chains use, one use each. */
  readonly builds: readonly TierBuild[];
}

type Fresh = Workload & { tags: string[]; sets: ActiveSet[]; builds: TierBuild[] };

type WorkloadAudit = NonNullable<Parameters<typeof workloadChainRules>[0]['audit']>;

export class WorkloadChains {
  readonly #d: WorkloadChainsDeps;
  readonly #workloads = new Map<string, Workload>();
  readonly #byNs = new Map<string, Set<string>>();
  /** Local workloads selected by each policy key (in any direction it isolates or audits). */
  readonly #policyRefs = new Map<string, number>();
  /** Set references to drop at the end of the batch (see releaseDeferred). */
  #releaseLater: ActiveSet[] = [];
  readonly #tiers: TierBuilds;

  constructor(deps: WorkloadChainsDeps) {
    this.#d = deps;
    this.#tiers = new TierBuilds(deps);
  }

  get size(): number {
    return this.#workloads.size;
  }

  has(uid: string): boolean {
    return this.#workloads.has(uid);
  }

  isLocal(pod: Pod): boolean {
    return pod.nodeName === this.#d.nodeName && isPoliced(pod);
  }

  /** Local workloads a policy selects (0: not active on this node). */
  refsOf(key: string): number {
    return this.#policyRefs.get(key) ?? 0;
  }

  /** Keys of the policies active on this node, in no order. */
  activeKeys(): Iterable<string> {
    return this.#policyRefs.keys();
  }

  /** Names of the ClusterNetworkPolicies whose subject holds a local workload, in no order. */
  clusterPolicyNames(): Iterable<string> {
    return this.#d.clusterPolicies.heldNames();
  }

  /** Every local workload: its pod and the policies selecting it. */
  workloads(): Iterable<CutCandidate> {
    return this.#workloads.values();
  }

  /** Which policies select a local workload (undefined: none is local by that uid). */
  selection(uid: string): WorkloadSelection | undefined {
    const w = this.#workloads.get(uid);
    if (!w) return undefined;
    const merged = (enforced: readonly CompiledPolicy[]) => enforced.filter((p) => !this.#d.policies.ownChain(p));
    return {
      ingress: { enforced: w.ingress, auditOnly: w.auditIngress, merged: merged(w.ingress) },
      egress: { enforced: w.egress, auditOnly: w.auditEgress, merged: merged(w.egress) },
      tiers: w.tiers,
    };
  }

  /** Brings every workload's tier lists up to date with the batch's ClusterNetworkPolicy
   *  changes, and rewrites the chains of those whose lists changed: the pods the old or new
   *  version of a changed policy holds. A workload costs a subject match per changed policy. */
  clusterPoliciesChanged(changes: TierChanges): void {
    for (const [uid, w] of [...this.#workloads]) {
      // Refreshed in this batch after the last change: its lists already reflect them all.
      if (w.tiersAt === changes.version) continue;
      const tiers = changes.reselect(w.tiers, w.pod);
      if (tiers) this.#install(uid, w, { ...w, tiers, tiersAt: changes.version, tags: [], sets: [], builds: [] });
    }
  }

  /** Applies to the workloads of a namespace the ClusterNetworkPolicies its label change moves
   *  (ClusterPolicies.namespaceChanged), and rewrites the chains of those whose lists changed.
   *  Their tiersAt stays: the batch's policy changes are still to apply. */
  namespaceLabelsChanged(ns: string, changes: TierReselect): void {
    for (const uid of [...(this.#byNs.get(ns) ?? [])]) {
      const w = this.#workloads.get(uid);
      const tiers = w && changes.reselect(w.tiers, w.pod);
      if (w && tiers) this.#install(uid, w, { ...w, tiers, tags: [], sets: [], builds: [] });
    }
  }

  /** Recomputes the chains of every workload of a namespace (its policies or audit level
   *  changed). Neither changes which ClusterNetworkPolicies hold a pod: its lists are kept, and
   *  any change of them in this batch still comes at its end (tiersAt is kept too). */
  refreshNamespace(ns: string): void {
    for (const uid of [...(this.#byNs.get(ns) ?? [])]) {
      const w = this.#workloads.get(uid);
      if (w) this.#install(uid, w, { ...w, ...this.#select(w.pod), tiers: this.#d.clusterPolicies.hold(w.tiers), tags: [], sets: [], builds: [] });
    }
  }

  /** Recomputes which policies select a pod and rewrites its chains (none if it is not local). */
  refresh(uid: string, pod: Pod | undefined): void {
    const cp = this.#d.clusterPolicies;
    const next = pod && this.isLocal(pod) ? { pod, ...this.#select(pod), tiers: cp.selecting(pod), tiersAt: cp.version, tags: [], sets: [], builds: [] } : undefined;
    this.#install(uid, this.#workloads.get(uid), next);
  }

  /** Replaces a workload (`next`, with empty tags, sets and builds to fill; undefined: none)
   *  and rewrites its chains. */
  #install(uid: string, old: Workload | undefined, next: Fresh | undefined): void {
    if (!old || !next || old.ingress !== next.ingress || old.egress !== next.egress || old.auditIngress !== next.auditIngress || old.auditEgress !== next.auditEgress) {
      const keys = (w: Workload | undefined) => new Set(w ? [...w.ingress, ...w.egress, ...w.auditIngress, ...w.auditEgress].map((p) => p.key) : []);
      const before = keys(old);
      const after = keys(next);
      for (const k of after) if (!before.has(k)) this.#refPolicy(k, +1);
      for (const k of before) if (!after.has(k)) this.#refPolicy(k, -1);
    }
    // After next took its lists, so a list both hold is never forgotten in between.
    if (old) this.#d.clusterPolicies.release(old.tiers);

    if (old && (!next || old.pod.namespace !== next.pod.namespace)) this.#byNs.get(old.pod.namespace)?.delete(uid);
    if (next) {
      let s = this.#byNs.get(next.pod.namespace);
      if (!s) this.#byNs.set(next.pod.namespace, (s = new Set()));
      s.add(uid);
      this.#workloads.set(uid, next);
    } else this.#workloads.delete(uid);
    // A pod's addresses are in its dispatch bucket even when pods briefly share one.
    const who = (next ?? old)?.pod;
    if (who) this.#d.dispatch.moveWorkload(uid, `${who.namespace}/${who.name}/${uid}`, old?.pod.ips ?? [], next?.pod.ips ?? []);
    this.#writeChains(uid, next, next ?? { tags: [], sets: [], builds: [] });
    this.#d.audit?.tags.release(old?.tags ?? []);
    for (const b of old?.builds ?? []) this.#releaseLater.push(...this.#tiers.drop(b));
    // Released at the end of the batch: a set this workload stops using may be taken up by a
    // policy chain in the same batch (its audit level changed), and is then never rebuilt.
    this.#releaseLater.push(...(old?.sets ?? []));
  }

  /** Drops the set references workloads gave up this batch (after policies synced). */
  releaseDeferred(): void {
    for (const set of this.#releaseLater.splice(0)) this.#d.sets.release(set);
  }

  #select(pod: Pod): Pick<Workload, 'ingress' | 'egress' | 'auditIngress' | 'auditEgress'> {
    const lists = { ingress: [] as CompiledPolicy[], egress: [] as CompiledPolicy[], auditIngress: [] as CompiledPolicy[], auditEgress: [] as CompiledPolicy[] };
    for (const p of this.#d.cluster.policiesIn(pod.namespace)) {
      if (p.podSelector !== null && !selectorMatches(p.podSelector, pod.labels)) continue;
      const audit = p.enforcement === 'audit';
      if (p.ingress !== null) (audit ? lists.auditIngress : lists.ingress).push(p);
      if (p.egress !== null) (audit ? lists.auditEgress : lists.egress).push(p);
    }
    for (const l of Object.values(lists)) l.sort((a, b) => compareStrings(a.key, b.key));
    return lists;
  }

  /** Its chains per family; `w` undefined (or no address of a family): none. The NFLOG
   *  prefixes, sets and tier builds the chains use go into `uses`. */
  #writeChains(uid: string, w: Workload | undefined, uses: Pick<Fresh, 'tags' | 'sets' | 'builds'>): void {
    const { tags, sets } = uses;
    const { names, chains } = this.#d;
    const tw = names.toWorkload(uid);
    const fw = names.fromWorkload(uid);
    const useSet = (spec: SetSpec) => {
      const set = this.#d.sets.acquire(spec);
      sets.push(set);
      return set.name;
    };
    for (const f of this.#d.families) {
      const ip = w?.pod.ips.find((a) => familyOf(a) === f);
      // A tier chain exists only while it holds rules: the workload chain jumps to it then.
      // Baseline is consulted only when no NetworkPolicy isolates the pod in that direction.
      const tierChain = (tier: Tier, dir: Direction): string | null => {
        const name = names.tierChain(tier, dir, uid);
        const consulted = w && ip !== undefined && (tier === 'admin' || w[dir].length === 0);
        const policies = consulted ? w.tiers[tier] : [];
        const rules = policies.length > 0 ? this.#tiers.use(tier, dir, f, policies, uses.builds) : [];
        if (rules.length === 0) chains.delete(f, name);
        else this.#tiers.setChain(f, name, rules);
        return rules.length > 0 ? name : null;
      };
      const tiers = {
        ingress: { admin: tierChain('admin', 'ingress'), baseline: tierChain('baseline', 'ingress') },
        egress: { admin: tierChain('admin', 'egress'), baseline: tierChain('baseline', 'egress') },
      };
      if (!w || ip === undefined) {
        chains.delete(f, tw);
        chains.delete(f, fw);
        continue;
      }
      const podRef = `${w.pod.namespace}/${w.pod.name}`;
      const chainOf = (dir: Direction) => (p: CompiledPolicy) => (dir === 'ingress' ? names.policyIngress(p.key) : names.policyEgress(p.key));
      const rulesOf = (dir: Direction, enforced: readonly CompiledPolicy[], auditOnly: readonly CompiledPolicy[]) =>
        workloadChainRules({
          direction: dir,
          podRef,
          podIp: ip,
          policyChains: enforced.length > 0 ? this.#consultOrder(f, dir, enforced, chainOf(dir), useSet) : null,
          auditOnlyChains: auditOnly.map(chainOf(dir)),
          marks: this.#d.marks,
          commonChain: names.workloadCommon,
          allowAction: this.#d.allowAction,
          acceptChain: names.accept,
          adminChain: tiers[dir].admin,
          baselineChain: tiers[dir].baseline,
          audit: this.#audit(uid, dir, enforced, auditOnly, tags),
        });
      chains.set(f, tw, rulesOf('ingress', w.ingress, w.auditIngress));
      chains.set(f, fw, rulesOf('egress', w.egress, w.auditEgress));
    }
  }

  /**
   * What an isolated workload consults, in order: policies audited at level all (their own
   * chains, so each allow is logged under its rule), then one rule per port signature whose
   * set is the union of every other enforced policy's peers with that signature (one lookup
   * however many policies), then the chains of policies with rules that cannot merge. The
   * per-packet cost follows the distinct port signatures, not the number of policies.
   */
  #consultOrder(f: Family, dir: Direction, enforced: readonly CompiledPolicy[], chainOf: (p: CompiledPolicy) => string, useSet: (spec: SetSpec) => string): (string | readonly Rule[])[] {
    const shapes = this.#d.policies;
    const first = enforced.filter((p) => shapes.ownChain(p)).map(chainOf);
    const merging = enforced.filter((p) => !shapes.ownChain(p));
    const remainder = merging.filter((p) => shapes.alternativesOf(p, dir, f).some((a) => mergeable(a) === null)).map(chainOf);
    const allow = { kind: 'setMark', value: this.#d.marks.accept, mask: this.#d.marks.accept } as const;
    const merged = mergedRules(
      merging.flatMap((p) => shapes.alternativesOf(p, dir, f)),
      f,
      allow,
      `merged peers of ${dir} policies`,
      useSet,
    );
    return [...first, ...(merged.length > 0 ? [merged] : []), ...remainder];
  }

  /** The default drop is logged when an isolating policy is audited; what audit-only policies
   *  would drop always is (that is what they are for). */
  #audit(uid: string, dir: Direction, enforced: readonly CompiledPolicy[], auditOnly: readonly CompiledPolicy[], tags: string[]): WorkloadAudit | undefined {
    const audit = this.#d.audit;
    if (!audit) return undefined;
    const tag = (verdict: AuditVerdict, policies: readonly CompiledPolicy[]): AuditTag => ({
      verdict,
      direction: dir,
      policy: null,
      reason: 'default-deny',
      isolatedBy: policies.map((p) => ({ namespace: p.namespace, name: p.name })),
    });
    const d = dir === 'ingress' ? 'I' : 'E';
    if (enforced.length > 0) {
      if (!enforced.some((p) => this.#d.levels.of(p) !== 'off')) return undefined;
      return { ...audit.rules, logDeny: audit.tags.log(`D${d}`, `${uid}\n${dir}`, tag('deny', enforced), tags) };
    }
    if (auditOnly.length === 0) return undefined;
    return { ...audit.rules, logWouldDeny: audit.tags.log(`W${d}`, `${uid}\n${dir}`, tag('would-deny', auditOnly), tags) };
  }

  #refPolicy(key: string, delta: number): void {
    count(this.#policyRefs, key, delta);
    this.#d.policyRefsChanged(key);
  }
}

function count(refs: Map<string, number>, key: string, delta: number): void {
  const n = (refs.get(key) ?? 0) + delta;
  if (n === 0) refs.delete(key);
  else refs.set(key, n);
}
