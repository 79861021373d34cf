// Policy lifecycle on this node: a policy selecting a local workload is active, owns its
// chains and holds references on its peer sets; one that stops being active gives them up.
// Also how each policy's rules are laid out: in its own chain, or merged into workloads.

import type { AuditLevel, CompiledPolicy, Family } from '../model/types.ts';
import type { AuditLevels } from './audit-levels.ts';
import type { ChainStore } from './chain-store.ts';
import type { Names } from './names.ts';
import type { AllowAlternative, Direction, MarkBits, SetSpec } from './rules.ts';
import { allowAlternatives, mergeable, policyChainRules } from './rules.ts';
import type { ActiveSet, SetRegistry } from './set-registry.ts';
import type { AuditWriting } from './tag-catalog.ts';

export interface PolicyChainsDeps {
  readonly names: Names;
  readonly families: readonly Family[];
  readonly marks: MarkBits;
  readonly sets: SetRegistry;
  readonly chains: ChainStore;
  readonly levels: AuditLevels;
  readonly audit: AuditWriting | undefined;
}

interface ActivePolicy {
  readonly policy: CompiledPolicy;
  readonly level: AuditLevel;
  readonly sets: readonly ActiveSet[];
  /** NFLOG prefixes of its audit rules. */
  readonly tags: readonly string[];
}

export class PolicyChains {
  readonly #d: PolicyChainsDeps;
  readonly #active = new Map<string, ActivePolicy>();
  /** A compiled policy's allow alternatives, by direction and family (computed once). */
  readonly #alternatives = new WeakMap<CompiledPolicy, Map<string, AllowAlternative[]>>();

  constructor(deps: PolicyChainsDeps) {
    this.#d = deps;
  }

  /** Audit-only policies and policies audited at level all keep every rule in their own chain
   *  (audit-only ones are consulted only for would-deny, level-all ones log per rule). */
  ownChain(p: CompiledPolicy): boolean {
    return p.enforcement === 'audit' || this.#d.levels.of(p) === 'all';
  }

  alternativesOf(p: CompiledPolicy, dir: Direction, f: Family): AllowAlternative[] {
    let byKey = this.#alternatives.get(p);
    if (!byKey) this.#alternatives.set(p, (byKey = new Map()));
    const key = `${dir}${f}`;
    let alts = byKey.get(key);
    if (!alts) byKey.set(key, (alts = allowAlternatives(p, dir, f)));
    return alts;
  }

  /** Makes the chains of `key` those of `policy` (undefined: not active on this node). */
  sync(key: string, policy: CompiledPolicy | undefined): void {
    const current = this.#active.get(key);
    const level = policy ? this.#d.levels.of(policy) : 'off';
    if (current?.policy === policy && (policy === undefined || current?.level === level)) return;
    const { names, families, chains } = this.#d;
    const acquired: ActiveSet[] = [];
    const tags: string[] = [];
    if (policy) {
      const useSet = (spec: SetSpec) => {
        const s = this.#d.sets.acquire(spec);
        acquired.push(s);
        return s.name;
      };
      for (const f of families) {
        for (const dir of ['ingress', 'egress'] as const) {
          const chain = dir === 'ingress' ? names.policyIngress(key) : names.policyEgress(key);
          // Merged policies keep only the rules that cannot merge; workloads jump to the chain
          // only when it holds some (see WorkloadChains' consult order).
          const all = this.alternativesOf(policy, dir, f);
          const own = this.ownChain(policy) ? all : all.filter((a) => mergeable(a) === null);
          const isolates = (dir === 'ingress' ? policy.ingress : policy.egress) !== null;
          if (!isolates || (own.length === 0 && !this.ownChain(policy))) chains.delete(f, chain);
          else chains.set(f, chain, policyChainRules(policy, dir, own, this.#d.marks, useSet, this.#audit(policy, dir, level, tags)));
        }
      }
      this.#active.set(key, { policy, level, sets: acquired, tags });
    } else {
      for (const f of families) {
        chains.delete(f, names.policyIngress(key));
        chains.delete(f, names.policyEgress(key));
      }
      this.#active.delete(key);
    }
    // Release after acquiring, so a set both versions use is never torn down and rebuilt.
    for (const s of current?.sets ?? []) this.#d.sets.release(s);
    this.#d.audit?.tags.release(current?.tags ?? []);
  }

  /** Level `all`: every allowing rule logs the connections it allows first. */
  #audit(policy: CompiledPolicy, dir: Direction, level: AuditLevel, tags: string[]) {
    const audit = this.#d.audit;
    if (!audit || level !== 'all') return undefined;
    const d = dir === 'ingress' ? 'I' : 'E';
    const logAllow = (rule: number) =>
      audit.tags.log(`A${d}`, `${policy.key}\n${dir}\n${rule}`, { verdict: 'allow', direction: dir, policy: { namespace: policy.namespace, name: policy.name, rule } }, tags);
    return { ...audit.rules, logAllow };
  }
}
