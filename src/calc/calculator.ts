// The incremental compiler: model events in, desired dataplane and exactly-what-changed out.
// This front routes each event to the parts it touches and settles each batch; the work lives
// in its parts (docs/design/calc.md):
// - set-registry.ts: peer sets, reference counted, with reverse selector indexes, so a pod
//   or namespace change visits only the sets it may affect;
// - workloads.ts: the chains of this node's pods and which policies are active here;
// - policy-chains.ts: an active policy's own chains and the sets they hold;
// - dispatch.ts: the dispatch tree and the addresses pods gave up;
// - tag-catalog.ts and audit-levels.ts: what audit rules mean and what each policy logs.

import { namespaceAuditLevel } from '../model/annotations.ts';
import { ClusterState } from '../model/cluster.ts';
import { compareStrings } from '../model/order.ts';
import { compilePolicy, PolicyParts } from '../model/policy.ts';
import { compileClusterNetworkPolicy } from '../model/cluster-network-policy.ts';
import { ClusterPolicies } from './cluster-policies.ts';
import { CutOptIn } from './cut-opt-in.ts';
import { tierAcceptRules } from './tier-rules.ts';
import type { AuditLevel, CalcEvent, CompiledClusterNetworkPolicy, CompiledPolicy, Pod } from '../model/types.ts';
import type { AuditCatalog } from './audit-tags.ts';
import { AuditLevels } from './audit-levels.ts';
import { auditLimit, type CalcConfig, type PolicyReport } from './config.ts';
import { ChainStore } from './chain-store.ts';
import { Changes } from './changes.ts';
import type { DesiredDataplane, DesiredSet, Dirty } from './desired.ts';
import { DispatchTree } from './dispatch.ts';
import { PolicyChains } from './policy-chains.ts';
import { acceptChainRules, type SetSpec, topChainRules, workloadCommonRules } from './rules.ts';
import { SetRegistry } from './set-registry.ts';
import { TagCatalog } from './tag-catalog.ts';
import type { AuditWriting } from './tag-catalog.ts';
import { WorkloadChains, type WorkloadSelection } from './workloads.ts';

export { AUDIT_COPY_BYTES } from './tag-catalog.ts';
export type { AuditConfig, CalcConfig, PolicyReport } from './config.ts';

export class Calculator {
  readonly #cfg: CalcConfig;
  readonly #cluster = new ClusterState();
  readonly #changes = new Changes();
  readonly #chains = new ChainStore(this.#changes);
  readonly #sets: SetRegistry;
  readonly #dispatch: DispatchTree;
  readonly #levels: AuditLevels;
  readonly #audit: AuditWriting | undefined;
  readonly #policies: PolicyChains;
  readonly #workloads: WorkloadChains;
  readonly #clusterPolicies = new ClusterPolicies(this.#cluster);
  readonly #cut = new CutOptIn();
  /** Equal selectors and rule lists of different policies, held once. */
  readonly #policyParts = new PolicyParts();
  #policyChanges: { key: string; policy: CompiledPolicy | null }[] = [];
  #clusterPolicyChanges: { name: string; policy: CompiledClusterNetworkPolicy | null }[] = [];
  /** Policies whose chains may need a change at the end of the batch. */
  readonly #touchedPolicies = new Set<string>();
  /** How many of the cluster's policies are invalid. */
  #invalidPolicies = 0;

  constructor(cfg: CalcConfig) {
    this.#cfg = cfg;
    const { names, families, marks } = cfg;
    const allowAction = cfg.allowAction ?? 'ACCEPT';
    this.#sets = new SetRegistry(this.#cluster, names, this.#changes);
    this.#levels = new AuditLevels(cfg.audit?.defaultLevel ?? 'off');
    if (cfg.audit) {
      this.#audit = { rules: { limit: auditLimit(names.prefix, cfg.audit) }, tags: new TagCatalog(cfg.audit.group) };
    }
    for (const f of families) {
      this.#chains.set(f, names.forward, topChainRules({ family: f, fromDispatch: names.fromWorkloadDispatch, toDispatch: names.toWorkloadDispatch, marks, allowAction, acceptChain: names.accept }));
      this.#chains.set(f, names.workloadCommon, workloadCommonRules(marks, allowAction, names.accept));
      if (allowAction === 'ACCEPT') this.#chains.set(f, names.accept, acceptChainRules(marks));
      this.#chains.set(f, names.tierAccept, tierAcceptRules(marks.accept));
    }
    // Built before any event: the very first desired state already fails closed (agent/ may
    // write it before the source has synced).
    this.#dispatch = new DispatchTree({ names, families, podBridge: cfg.podBridge ?? '', sourceBinding: cfg.sourceBinding ?? false }, this.#chains);
    const parts = { names, families, marks, sets: this.#sets, chains: this.#chains, levels: this.#levels, audit: this.#audit };
    this.#policies = new PolicyChains(parts);
    this.#workloads = new WorkloadChains({
      ...parts,
      nodeName: cfg.nodeName,
      allowAction,
      cluster: this.#cluster,
      dispatch: this.#dispatch,
      policies: this.#policies,
      clusterPolicies: this.#clusterPolicies,
      policyRefsChanged: (key) => this.#touchedPolicies.add(key),
    });
  }

  /** The whole desired dataplane (live view; read it between calls to applyEvents). */
  get desired(): DesiredDataplane {
    return { sets: this.#sets.kernelSets, chains: this.#chains.byFamily, topChain: this.#cfg.names.forward };
  }

  get cluster(): ClusterState {
    return this.#cluster;
  }

  /** What each NFLOG prefix of the audit rules means (removed ones stay for a while). */
  get auditCatalog(): AuditCatalog {
    return this.#audit?.tags ?? { lookup: () => undefined };
  }

  /** Applies a batch of events; returns exactly the sets, members and chains they changed. */
  applyEvents(events: Iterable<CalcEvent>): Dirty {
    for (const e of events) this.#apply(e);
    const tierChanges = this.#clusterPolicies.takeChanges();
    if (tierChanges) this.#workloads.clusterPoliciesChanged(tierChanges);
    for (const key of this.#touchedPolicies) this.#policies.sync(key, this.#workloads.refsOf(key) > 0 ? this.#cluster.policies.get(key) : undefined);
    this.#touchedPolicies.clear();
    this.#workloads.releaseDeferred();
    this.#dispatch.flush();
    return this.#changes.take();
  }

  /** Dirty state accumulated since construction/last call (the cold-start payload). */
  takeDirty(): Dirty {
    return this.#changes.take();
  }

  /** Policies upserted (compiled, with their errors) or deleted (null) since the last call,
   *  in order, so the agent can report invalid ones once per change. */
  takePolicyChanges(): { key: string; policy: CompiledPolicy | null }[] {
    return this.#policyChanges.splice(0);
  }

  /** ClusterNetworkPolicies upserted (compiled, with their errors) or deleted (null) since the
   *  last call, in order. */
  takeClusterPolicyChanges(): { name: string; policy: CompiledClusterNetworkPolicy | null }[] {
    return this.#clusterPolicyChanges.splice(0);
  }

  /**
   * Addresses a local pod gave up since the last call (deleted, no longer policed, or given a
   * new address), sorted; one that went back to the same pod is not among them. The kernel
   * still tracks their connections, and would let a pod that gets the address next carry on
   * with them as established, past its own policies: the dataplane forgets those flows.
   */
  takeReleasedAddresses(): string[] {
    return this.#dispatch.takeReleased();
  }

  /** Every policy in the cluster, sorted by key: O(policies), for `weir render` and tests. */
  policyReports(): PolicyReport[] {
    return this.#reports(this.#cluster.policies.keys());
  }

  /** The policies that select a pod of this node, sorted by key: what a write reports. Its cost
   *  follows this node's policies, not the cluster's. */
  enforcedPolicyReports(): PolicyReport[] {
    return this.#reports(this.#workloads.activeKeys());
  }

  /** Counts of the cluster's policies, kept as they change (a write reads them). */
  policyCounts(): { valid: number; invalid: number } {
    const all = this.#cluster.policies.size;
    return { valid: all - this.#invalidPolicies, invalid: this.#invalidPolicies };
  }

  /** Addresses of the local pods whose connections their new rules deny are cut after a write
   *  (cut-opt-in.ts): every local pod's with `all`. */
  cutTargets(all: boolean): string[] {
    if (all) return this.localPodAddresses();
    if (!this.#cut.any()) return [];
    const out: string[] = [];
    for (const w of this.#workloads.workloads()) if (this.#cut.covers(w)) out.push(...w.pod.ips);
    return out;
  }

  /** Addresses of every pod of this node that calc polices (its workloads), both families. */
  localPodAddresses(): string[] {
    const out: string[] = [];
    for (const w of this.#workloads.workloads()) out.push(...w.pod.ips);
    return out;
  }

  /** Which policies select a local pod, as its chains consult them (`weir explain` names
   *  them); undefined when no pod of this node has that uid. */
  selection(uid: string): WorkloadSelection | undefined {
    return this.#workloads.selection(uid);
  }

  /** The set a spec names, with calc's members: the live one, else as the registry fills it. */
  peekSet(spec: SetSpec): DesiredSet {
    return this.#sets.peek(spec);
  }

  /** The bridge port a local pod's address is bound to, when known (source binding). */
  bridgePortOf(ip: string): string | undefined {
    return this.#dispatch.portOf(ip);
  }

  get localPodCount(): number {
    return this.#workloads.size;
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
        localPods: this.#workloads.refsOf(p.key),
        enforcement: p.enforcement,
        auditLevel: this.#levels.of(p),
      });
    }
    return out.sort((a, b) => compareStrings(a.key, b.key));
  }

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
        this.#sets.namespaceLabelsChanged(name, old, this.#cluster.namespaceLabels(name));
        // Its pods may enter or leave the subjects of the ClusterNetworkPolicies whose namespace
        // selector reads a label that changed: only those are matched against them.
        const moved = this.#clusterPolicies.namespaceChanged(old, this.#cluster.namespaceLabels(name));
        if (moved) this.#workloads.namespaceLabelsChanged(name, moved);
        this.#onNamespaceAudit(name, e.op === 'upsert' ? namespaceAuditLevel(e.object.audit) : null);
        this.#cut.setNamespace(name, e.op === 'upsert' ? e.object.cutExisting : undefined);
        return;
      }
      case 'Node': {
        if (e.op === 'upsert') this.#cluster.nodes.set(e.object.name, e.object);
        else this.#cluster.nodes.delete(e.name);
        const name = e.op === 'upsert' ? e.object.name : e.name;
        if (name === this.#cfg.nodeName) this.#dispatch.setPodCIDRs(e.op === 'upsert' ? e.object.podCIDRs : []);
        return;
      }
      case 'PodInterface':
        if (e.op === 'upsert') this.#dispatch.setPort(e.object.ip, e.object.port);
        else this.#dispatch.setPort(e.ip, undefined);
        return;
      case 'NetworkPolicy': {
        const ns = e.op === 'upsert' ? e.object.namespace : e.namespace;
        const key = `${ns}/${e.op === 'upsert' ? e.object.name : e.name}`;
        const invalid = (p: CompiledPolicy | undefined) => (p !== undefined && p.errors.length > 0 ? 1 : 0);
        if (e.op === 'upsert') {
          const compiled = this.#policyParts.share(compilePolicy(e.object));
          this.#invalidPolicies += invalid(compiled) - invalid(this.#cluster.upsertPolicy(compiled));
          this.#policyChanges.push({ key, policy: compiled });
          this.#cut.setPolicy(key, compiled);
        } else {
          this.#cut.setPolicy(key, undefined);
          this.#invalidPolicies -= invalid(this.#cluster.deletePolicy(key));
          this.#policyChanges.push({ key, policy: null });
        }
        this.#touchedPolicies.add(key);
        this.#workloads.refreshNamespace(ns);
        return;
      }
      case 'ClusterNetworkPolicy': {
        if (e.op === 'upsert') {
          const compiled = compileClusterNetworkPolicy(e.object);
          this.#clusterPolicies.upsert(compiled);
          this.#cut.setClusterPolicy(compiled.name, compiled);
          this.#clusterPolicyChanges.push({ name: compiled.name, policy: compiled });
        } else if (this.#clusterPolicies.delete(e.name)) {
          this.#cut.setClusterPolicy(e.name, undefined);
          this.#clusterPolicyChanges.push({ name: e.name, policy: null });
        }
        // The workloads it may select or have selected are refreshed once, when the batch's
        // events are in (applyEvents).
        return;
      }
    }
  }

  #onPod(old: Pod | undefined, pod: Pod | undefined): void {
    this.#sets.podChanged(old, pod);
    const uid = pod?.uid ?? old?.uid;
    if (uid === undefined) return;
    if (this.#workloads.has(uid) || (pod && this.#workloads.isLocal(pod))) this.#workloads.refresh(uid, pod);
  }

  /** A namespace's audit level changes what its policies' and pods' chains log. */
  #onNamespaceAudit(ns: string, level: AuditLevel | null): void {
    if (!this.#levels.setNamespace(ns, level) || !this.#audit) return;
    for (const p of this.#cluster.policiesIn(ns)) this.#touchedPolicies.add(p.key);
    this.#workloads.refreshNamespace(ns);
  }

  /** The ClusterNetworkPolicies whose subject holds a pod of this node (either tier, valid or
   *  not), sorted by name: what a write reports beside enforcedPolicyReports. */
  enforcedClusterPolicyReports(): Pick<CompiledClusterNetworkPolicy, 'name' | 'uid' | 'generation' | 'errors'>[] {
    const out: CompiledClusterNetworkPolicy[] = [];
    for (const name of this.#workloads.clusterPolicyNames()) {
      const p = this.#clusterPolicies.get(name);
      if (p) out.push(p);
    }
    return out.sort((a, b) => compareStrings(a.name, b.name));
  }
}
