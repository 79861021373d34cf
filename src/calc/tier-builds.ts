// Tier chain rules built once per list of ClusterNetworkPolicies, direction and family, and
// shared by every local workload holding that list: one build holds one reference on its sets
// and audit tags while any workload uses it.

import type { CompiledClusterNetworkPolicy, Family } from '../model/types.ts';
import type { AuditTag } from './audit-tags.ts';
import type { AuditLevels } from './audit-levels.ts';
import type { ChainStore } from './chain-store.ts';
import type { Rule } from './desired.ts';
import type { Names } from './names.ts';
import type { Direction, SetSpec } from './rules.ts';
import type { ActiveSet, SetRegistry } from './set-registry.ts';
import type { AuditWriting } from './tag-catalog.ts';
import type { Tier, TierAudit, TierStep } from './tier-rules.ts';
import { tierChainRules, tierSteps } from './tier-rules.ts';

/** A tier chain's rules for one list of policies, direction and family. */
export interface TierBuild {
  readonly list: readonly CompiledClusterNetworkPolicy[];
  readonly key: string;
  readonly rules: readonly Rule[];
  readonly sets: readonly ActiveSet[];
  readonly prefixes: readonly string[];
  users: number;
}

export interface TierBuildsDeps {
  readonly names: Names;
  readonly sets: SetRegistry;
  readonly chains: ChainStore;
  readonly levels: AuditLevels;
  readonly audit: AuditWriting | undefined;
}

export class TierBuilds {
  readonly #d: TierBuildsDeps;
  /** Builds in use, by the (shared) policy list they were built from. */
  readonly #built = new WeakMap<readonly CompiledClusterNetworkPolicy[], Map<string, TierBuild>>();
  /** Rules found equal to the rules a chain holds, by the rules it holds: the pods sharing a
   *  list compare its new rules once, not each (see setChain). */
  readonly #equalRules = new WeakMap<readonly Rule[], WeakMap<readonly Rule[], boolean>>();

  constructor(deps: TierBuildsDeps) {
    this.#d = deps;
  }

  /** The rules of a tier chain for a list of policies, built on first use; the build is added
   *  to `builds`, the uses of the workload calling (give each back with drop). */
  use(tier: Tier, dir: Direction, f: Family, policies: readonly CompiledClusterNetworkPolicy[], builds: TierBuild[]): readonly Rule[] {
    let byKey = this.#built.get(policies);
    if (!byKey) this.#built.set(policies, (byKey = new Map()));
    const key = `${tier} ${dir} ${f}`;
    let build = byKey.get(key);
    if (!build) {
      const sets: ActiveSet[] = [];
      const prefixes: string[] = [];
      const useSet = (spec: SetSpec) => {
        const set = this.#d.sets.acquire(spec);
        sets.push(set);
        return set.name;
      };
      const rules = tierChainRules(tier, tierSteps(policies, dir, f), f, this.#d.names.tierAccept, useSet, this.#audit(dir, prefixes));
      build = { list: policies, key, rules, sets, prefixes, users: 0 };
      byKey.set(key, build);
    }
    build.users++;
    builds.push(build);
    return build.rules;
  }

  /** A workload gives up a build. When no workload uses it any more, its audit tags go and its
   *  sets are returned, for the caller to release at the end of the batch as a workload's; a
   *  workload that takes up its list again builds anew. */
  drop(b: TierBuild): readonly ActiveSet[] {
    if (--b.users > 0) return [];
    this.#built.get(b.list)?.delete(b.key);
    this.#d.audit?.tags.release(b.prefixes);
    return b.sets;
  }

  /** Writes a tier chain. Its rules are shared by the pods holding a list, and so is what their
   *  chains held before: equal rules are found equal once, and the chains keep what they hold. */
  setChain(f: Family, name: string, rules: readonly Rule[]): void {
    const held = this.#d.chains.byFamily[f].get(name);
    if (held === rules) return;
    if (held) {
      let known = this.#equalRules.get(held);
      if (!known) this.#equalRules.set(held, (known = new WeakMap()));
      let equal = known.get(rules);
      if (equal === undefined) known.set(rules, (equal = held.length === rules.length && JSON.stringify(held) === JSON.stringify(rules)));
      if (equal) return;
    }
    this.#d.chains.set(f, name, rules);
  }

  /** A ClusterNetworkPolicy rule logs what it denies at level deny, and what it accepts too at
   *  level all; Pass decides nothing and is never logged. */
  #audit(dir: Direction, tags: string[]): TierAudit | undefined {
    const audit = this.#d.audit;
    if (!audit) return undefined;
    const levels = this.#d.levels;
    const logOf = ({ action, policy: p, rule }: TierStep) => {
      const level = levels.ofCluster(p);
      if (action === 'Pass' || level === 'off' || (action === 'Accept' && level !== 'all')) return undefined;
      const verdict = action === 'Accept' ? 'allow' : 'deny';
      const code = `${p.tier === 'Admin' ? 'T' : 'B'}${action === 'Accept' ? 'A' : 'D'}${dir === 'ingress' ? 'I' : 'E'}`;
      const tag: AuditTag = { verdict, direction: dir, policy: { kind: 'ClusterNetworkPolicy', name: p.name, tier: p.tier, rule } };
      return audit.tags.log(code, `${p.name}\n${dir}\n${rule}`, tag, tags);
    };
    return { ...audit.rules, logOf };
  }
}
