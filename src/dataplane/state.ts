// The record of what Weir believes the kernel holds: per family, each own chain's rule hashes
// and the copies of each hook (FORWARD, and OUTPUT in IPVS mode); per own set, its header and
// members. Built from the
// kernel at start and on resync, then updated after each successful write.

import type { SetType } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import type { Family } from '../model/types.ts';
import { commentOf, parseSave, targetOf } from './iptables.ts';
import { memberKey, parseIpsetSave } from './ipset.ts';
import { HOOK_CHAINS, HOOK_COMMENT, ownRuleHash, type HookChain } from './render.ts';

/** Stands for a rule in an own chain that carries no Weir hash: never equal to a real hash. */
export const UNKNOWN_HASH = '?';

export interface SetHeader {
  readonly type: SetType | string;
  readonly family: Family | undefined;
  readonly maxElem: number | undefined;
}

export interface AppliedSet extends SetHeader {
  /** Members in kernel form (see memberKey). */
  readonly members: Set<string>;
}

export interface HookState {
  /** Every copy of our hook rule in one builtin chain, as specs that `-D <chain> <spec>` deletes. */
  readonly specs: readonly string[];
  /** True when the first copy is the chain's first rule. */
  readonly atTop: boolean;
}

export interface FamilyState {
  /** Own chain -> rule hashes in kernel order. */
  readonly chains: Map<string, readonly string[]>;
  readonly hooks: Record<HookChain, HookState>;
}

export interface AppliedState {
  sets: Map<string, AppliedSet>;
  readonly families: { readonly 4: FamilyState; readonly 6: FamilyState };
}

const noHook = (): HookState => ({ specs: [], atTop: false });
export const emptyFamilyState = (): FamilyState => ({ chains: new Map(), hooks: { FORWARD: noHook(), OUTPUT: noHook() } });

export function emptyState(): AppliedState {
  return { sets: new Map(), families: { 4: emptyFamilyState(), 6: emptyFamilyState() } };
}

/** A hook is right when there is exactly one copy, it is first, and it jumps to `target`. */
export function hookIsRight(hook: HookState, target: string): boolean {
  return hook.specs.length === 1 && hook.atTop && targetOf(hook.specs[0]) === target;
}

/**
 * Rebuilds one family's record from `iptables-save -t filter` output. A chain with Weir's
 * prefix is Weir's only if some rule in it carries the owner mark (Weir never leaves a chain
 * empty) or a marked rule jumps to it; any other is named in `foreign` and left out, so it is
 * never written or deleted.
 */
export function familyStateFromSave(saveText: string, names: Names, foreign: string[] = []): FamilyState {
  const saved = parseSave(saveText);
  const chains = new Map<string, readonly string[]>();
  const unmarked: string[] = [];
  for (const [name, specs] of saved) {
    if (!names.isOwnChain(name)) continue;
    const hashes = specs.map((s) => ownRuleHash(commentOf(s)) ?? UNKNOWN_HASH);
    if (hashes.every((h) => h === UNKNOWN_HASH)) unmarked.push(name);
    else chains.set(name, hashes);
  }
  // An unmarked chain that a marked rule jumps to is Weir's, flushed or edited by someone else.
  const targets = new Set<string>();
  for (const name of [...chains.keys(), ...HOOK_CHAINS]) {
    for (const spec of saved.get(name) ?? []) if (ownRuleHash(commentOf(spec))) targets.add(targetOf(spec) ?? '');
  }
  for (const name of unmarked) {
    if (targets.has(name))
      chains.set(
        name,
        saved.get(name)!.map(() => UNKNOWN_HASH),
      );
    else foreign.push(name);
  }
  const isOurHook = (s: string) => commentOf(s) === HOOK_COMMENT && targetOf(s) === names.forward;
  const hookIn = (chain: HookChain): HookState => {
    const rules = saved.get(chain) ?? [];
    return { specs: rules.filter(isOurHook), atTop: rules.length > 0 && isOurHook(rules[0]) };
  };
  return { chains, hooks: { FORWARD: hookIn('FORWARD'), OUTPUT: hookIn('OUTPUT') } };
}

/** Rebuilds the set record from `ipset save` output: sets with Weir's prefix and its mark;
 *  prefixed sets without the mark are named in `foreign`. */
export function setsStateFromSave(saveText: string, names: Names, foreign: string[] = []): Map<string, AppliedSet> {
  const sets = new Map<string, AppliedSet>();
  for (const s of parseIpsetSave(saveText).values()) {
    if (!names.isOwnSet(s.name)) continue;
    if (!s.commented) {
      foreign.push(s.name);
      continue;
    }
    sets.set(s.name, {
      type: s.type,
      family: s.family,
      maxElem: s.maxElem,
      members: new Set(s.members.map((m) => memberKey(s.type, m))),
    });
  }
  return sets;
}
