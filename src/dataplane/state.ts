// The record of what Weir believes the kernel holds: per family, each own chain's rule hashes
// and the copies of each hook (FORWARD, and OUTPUT in IPVS mode); per own set, its header and
// size (and its members, from a kernel read until the write after it). Built from the kernel at
// start and on resync, then updated after each successful write.

import type { SetType } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import type { Family } from '../model/types.ts';
import { commentOf, parseSave, targetOf } from './iptables.ts';
import { memberKey, parseIpsetSave, type SavedSet } from './ipset.ts';
import { acceptHookSpec, HOOK_CHAINS, HOOK_COMMENT, ownRuleHash, TABLE, type HookChain } from './render.ts';

/** Stands for a rule in an own chain that carries no Weir hash: never equal to a real hash. */
export const UNKNOWN_HASH = '?';

export interface SetHeader {
  readonly type: SetType | string;
  readonly family: Family | undefined;
  readonly maxElem: number | undefined;
}

export interface AppliedSet extends SetHeader {
  /** Entries the kernel holds (a counts resync compares it with the kernel's number). */
  readonly size: number;
  /** Members in kernel form (see memberKey), only as read back from the kernel: the write that
   *  follows a read diffs every set against them, and the record then keeps the size alone.
   *  Between reads calc's dirty marks name the members that changed, and `-exist` makes each
   *  add or delete right whatever the kernel held, so no copy of calc's members is kept. */
  readonly members?: ReadonlySet<string>;
}

export interface HookState {
  /** Every copy of our hook rule in one builtin chain, as specs that `-D <chain> <spec>` deletes. */
  readonly specs: readonly string[];
  /** True when the first copy is the chain's first rule. */
  readonly atTop: boolean;
}

/** Weir's objects in the filter table other than the accept hook: what an older Weir, which
 *  policed from filter, left. Removed by the next write. */
export interface FilterLeftovers {
  readonly chains: readonly string[];
  /** `-D` arguments: builtin chain and spec. */
  readonly hooks: readonly { readonly chain: HookChain; readonly spec: string }[];
}

export interface FamilyState {
  /** Own chain (mangle) -> rule hashes in kernel order. */
  readonly chains: Map<string, readonly string[]>;
  /** Hooks in mangle. */
  readonly hooks: Record<HookChain, HookState>;
  /** Copies of the accept hook in filter FORWARD (acceptHookSpec). */
  acceptHook: HookState;
  leftovers: FilterLeftovers;
}

export interface AppliedState {
  sets: Map<string, AppliedSet>;
  readonly families: { readonly 4: FamilyState; readonly 6: FamilyState };
}

const noHook = (): HookState => ({ specs: [], atTop: false });
export const noLeftovers = (): FilterLeftovers => ({ chains: [], hooks: [] });
export const emptyFamilyState = (): FamilyState => ({ chains: new Map(), hooks: { FORWARD: noHook(), OUTPUT: noHook() }, acceptHook: noHook(), leftovers: noLeftovers() });

export function emptyState(): AppliedState {
  return { sets: new Map(), families: { 4: emptyFamilyState(), 6: emptyFamilyState() } };
}

/** A hook is right when there is exactly one copy, it is first, and it jumps to `target`. */
export function hookIsRight(hook: HookState, target: string): boolean {
  return hook.specs.length === 1 && hook.atTop && targetOf(hook.specs[0]) === target;
}

/** The accept hook is right when there is exactly one copy, it is first, and it tests `mark`. */
export function acceptHookIsRight(hook: HookState, mark: number): boolean {
  return hook.specs.length === 1 && hook.atTop && sameSpec(hook.specs[0], acceptHookSpec(mark));
}

/** `found` is one copy, first, of the hook `want` records. */
export function sameHook(found: HookState, want: HookState): boolean {
  return found.specs.length === 1 && found.atTop && want.specs.length === 1 && sameSpec(found.specs[0], want.specs[0]);
}

/** Specs equal but for the comment's quotes (the backends print them differently). */
const sameSpec = (a: string, b: string) => a.replace(/"/g, '') === b.replace(/"/g, '');

export const hasLeftovers = (s: FamilyState) => s.leftovers.chains.length > 0 || s.leftovers.hooks.length > 0;

/**
 * Own chains of one table: a chain with Weir's prefix is Weir's only if some rule in it carries
 * the owner mark (Weir never leaves a chain empty) or a marked rule jumps to it; any other is
 * named in `foreign` and left out, so it is never written or deleted.
 */
function ownChains(saved: Map<string, string[]>, names: Names, foreign: string[]): Map<string, readonly string[]> {
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
  return chains;
}

/**
 * Rebuilds one family's record from `iptables-save` output of the mangle and filter tables
 * (see ownChains for what is Weir's). In filter, Weir's own chains and the hooks jumping to
 * its top chain are an older Weir's leftovers; the accept hook is the one rule it keeps there.
 */
export function familyStateFromSave(saveText: string, names: Names, foreign: string[] = []): FamilyState {
  const saved = parseSave(saveText, TABLE);
  const chains = ownChains(saved, names, foreign);
  const filter = parseSave(saveText, 'filter');
  return {
    chains,
    hooks: { FORWARD: ownHookIn(saved.get('FORWARD') ?? [], names), OUTPUT: ownHookIn(saved.get('OUTPUT') ?? [], names) },
    acceptHook: acceptHookIn(filter.get('FORWARD') ?? []),
    leftovers: {
      chains: [...ownChains(filter, names, foreign).keys()],
      hooks: HOOK_CHAINS.flatMap((chain) => (filter.get(chain) ?? []).filter((s) => isOwnHook(s, names)).map((spec) => ({ chain, spec }))),
    },
  };
}

const isOwnHook = (spec: string, names: Names) => commentOf(spec) === HOOK_COMMENT && targetOf(spec) === names.forward;
const isAcceptHook = (spec: string) => commentOf(spec) === HOOK_COMMENT && targetOf(spec) === 'ACCEPT';
const hookIn = (rules: readonly string[], is: (spec: string) => boolean): HookState => ({ specs: rules.filter(is), atTop: rules.length > 0 && is(rules[0]) });

/** The copies of Weir's hook among one builtin chain's rules (mangle FORWARD or OUTPUT). */
export const ownHookIn = (rules: readonly string[], names: Names): HookState => hookIn(rules, (s) => isOwnHook(s, names));

/** The copies of the accept hook among filter FORWARD's rules. */
export const acceptHookIn = (rules: readonly string[]): HookState => hookIn(rules, isAcceptHook);

/** Rebuilds the set record from `ipset save` output: sets with Weir's prefix and its mark;
 *  prefixed sets without the mark are named in `foreign`. */
export function setsStateFromSave(saveText: string, names: Names, foreign: string[] = []): Map<string, AppliedSet> {
  return ownSets(parseIpsetSave(saveText), names, foreign);
}

/** The sets of `saved` with Weir's prefix and mark; prefixed sets without it go to `foreign`.
 *  Headers of `ipset list -terse` (with `entries`) give sizes; `ipset save` gives members. */
export function ownSets(saved: ReadonlyMap<string, SavedSet & { readonly entries?: number }>, names: Names, foreign: string[] = []): Map<string, AppliedSet> {
  const sets = new Map<string, AppliedSet>();
  for (const s of saved.values()) {
    if (!names.isOwnSet(s.name)) continue;
    if (!s.commented) {
      foreign.push(s.name);
      continue;
    }
    const header = { type: s.type, family: s.family, maxElem: s.maxElem };
    if (s.entries !== undefined) {
      sets.set(s.name, { ...header, size: s.entries });
      continue;
    }
    const members = new Set(s.members.map((m) => memberKey(s.type, m)));
    sets.set(s.name, { ...header, size: members.size, members });
  }
  return sets;
}
