// Pure diffing: desired dataplane + dirty names + applied record -> the restore lines to run
// and the record changes to commit once they succeed. No I/O here, so ordering and diffs are
// unit-tested directly.

import type { DesiredDataplane, DesiredSet, Rule } from '../calc/desired.ts';
import type { Family } from '../model/types.ts';
import { memberKey } from './ipset.ts';
import {
  declareChain,
  deleteChain,
  deleteRule,
  HOOK_CHAINS,
  type Hook,
  type HookChain,
  acceptHookSpec,
  insertAcceptHook,
  insertHook,
  renderChain,
  renderLayerEnd,
  restorePayload,
  setCreate,
  setDestroy,
  setMemberLines,
  setSwap,
  type SetLine,
} from './render.ts';
import { acceptHookIsRight, hasLeftovers, hookIsRight, noLeftovers, type AppliedSet, type FamilyState, type HookState, type SetHeader } from './state.ts';

// ---- Sets ---------------------------------------------------------------------------------

export interface SetChange {
  readonly name: string;
  /** Drop the record entry (the set was destroyed). */
  readonly drop?: boolean;
  /** Start the record entry afresh with this header (created or rebuilt). */
  readonly header?: SetHeader;
  /** Entries the set holds once the lines ran. */
  readonly size?: number;
}

export interface SetsPlan {
  /** Step 1, one `ipset restore` batch: creates, rebuilds, member adds and deletes. A set's
   *  adds (or deletes) are one entry, its members turned into text only as it is written
   *  (render.ts MemberLines). */
  readonly lines: SetLine[];
  /** The same lines by the family of the sets they name, each in its order. */
  readonly byFamily: Readonly<Record<Family, readonly SetLine[]>>;
  /** Step 3, after the chains stopped referencing them. */
  readonly destroyLines: string[];
  readonly changes: SetChange[];
  readonly destroyed: string[];
  readonly created: number;
  readonly added: number;
  readonly removed: number;
}

export interface SetsPlanOptions {
  readonly maxElem: number;
  /** A scratch set per family used to rebuild a set in place with `swap`. */
  readonly tmpName: (family: Family) => string;
}

const sameHeader = (have: SetHeader, want: SetHeader) => have.type === want.type && have.family === want.family && (have.maxElem === undefined || have.maxElem === want.maxElem);

/**
 * The lines that make each dirty set what calc wants. A set read back from the kernel (its
 * record has members) is diffed whole; otherwise the record holds its size only, and a dirty
 * member is added when wanted and deleted when not (both with -exist); a set dirty as a whole
 * without members read is rebuilt through the scratch set and swapped in.
 */
export function planSets(desired: DesiredDataplane, dirty: ReadonlyMap<string, ReadonlySet<string> | 'all'>, applied: ReadonlyMap<string, AppliedSet>, opts: SetsPlanOptions): SetsPlan {
  const byFamily: Record<Family, SetLine[]> = { 4: [], 6: [] };
  const destroyLines: string[] = [];
  const changes: SetChange[] = [];
  const destroyed: string[] = [];
  let created = 0;
  let added = 0;
  let removed = 0;
  const tmps = new Set([opts.tmpName(4), opts.tmpName(6)]);
  // A scratch set left by an interrupted rebuild is referenced by no rule: drop it first.
  for (const f of [4, 6] as const) {
    const tmp = opts.tmpName(f);
    if (applied.has(tmp)) {
      byFamily[f].push(setDestroy(tmp));
      changes.push({ name: tmp, drop: true });
    }
  }
  const fill = (lines: SetLine[], name: string, want: DesiredSet) => {
    const texts = [...want.members];
    if (texts.length > 0) lines.push(setMemberLines('add', name, texts));
    added += texts.length;
  };

  for (const [name, which] of dirty) {
    if (tmps.has(name)) continue;
    const want = desired.sets.get(name);
    const have = applied.get(name);
    if (want === undefined) {
      if (have !== undefined) {
        destroyLines.push(setDestroy(name));
        destroyed.push(name);
      }
      continue;
    }
    const header: SetHeader = { type: want.type, family: want.family, maxElem: opts.maxElem };
    const lines = byFamily[want.family];
    // Sizes as calc counts members: its texts are in the kernel's form, one entry each.
    const size = want.members.size;
    if (have === undefined) {
      lines.push(setCreate(name, want.type, want.family, opts.maxElem));
      fill(lines, name, want);
      changes.push({ name, header, size });
      created++;
      continue;
    }
    const sameKind = have.type === want.type && have.family === want.family;
    if (!sameHeader(have, header) || (which === 'all' && have.members === undefined && sameKind)) {
      // Rules may reference the set, so it cannot be destroyed; build a new one and swap it in.
      // swap needs the same type and family; otherwise recreate (fails while referenced).
      if (sameKind) {
        const tmp = opts.tmpName(want.family);
        lines.push(setCreate(tmp, want.type, want.family, opts.maxElem));
        fill(lines, tmp, want);
        lines.push(setSwap(tmp, name), setDestroy(tmp));
      } else {
        lines.push(setDestroy(name), setCreate(name, want.type, want.family, opts.maxElem));
        fill(lines, name, want);
        created++;
      }
      changes.push({ name, header, size });
      continue;
    }
    // Member text as calc wrote it for adds, as the kernel holds it for deletes.
    const adds: string[] = [];
    const dels: string[] = [];
    if (which === 'all' && have.members !== undefined) {
      const wantKeys = new Set<string>();
      for (const m of want.members) {
        const k = memberKey(want.type, m);
        wantKeys.add(k);
        if (!have.members.has(k)) adds.push(m);
      }
      for (const k of have.members) if (!wantKeys.has(k)) dels.push(k);
    } else if (which !== 'all') {
      for (const m of which) (want.members.has(m) ? adds : dels).push(m);
    }
    // Deletes first: should calc's text of a member differ from the kernel's (an IPv6 address
    // not in canonical form), the member is deleted and added back, never left deleted.
    if (dels.length > 0) lines.push(setMemberLines('del', name, dels));
    if (adds.length > 0) lines.push(setMemberLines('add', name, adds));
    if (adds.length > 0 || dels.length > 0 || have.members !== undefined || have.size !== size) changes.push({ name, size });
    added += adds.length;
    removed += dels.length;
  }
  return { lines: [...byFamily[4], ...byFamily[6]], byFamily, destroyLines, changes, destroyed, created, added, removed };
}

/** Below this many members added and deleted one `ipset restore` is cheapest; above, each
 *  family's lines (no line names sets of both) go to a restore of its own, side by side
 *  (measured: docs/design/dataplane.md, "Figures behind the choices"). */
export const SPLIT_SETS_AT_MEMBERS = 10_000;

/** Applies a successful step-1 plan to the set record: headers and sizes, no members. */
export function commitSetChanges(applied: Map<string, AppliedSet>, changes: readonly SetChange[]): void {
  for (const c of changes) {
    const header = c.header ?? applied.get(c.name);
    if (c.drop || header === undefined) {
      applied.delete(c.name);
      continue;
    }
    applied.set(c.name, { type: header.type, family: header.family, maxElem: header.maxElem, size: c.size ?? 0 });
  }
}

// ---- Chains -------------------------------------------------------------------------------

export interface ChainsPlan {
  /** The iptables-restore payload for this family, or undefined when nothing changes. */
  readonly payload: string | undefined;
  /** Chains (re)written, with their new hashes. */
  readonly written: ReadonlyMap<string, string[]>;
  readonly deleted: readonly string[];
  /** The record of each hook the payload touched, after it. */
  readonly hooks: ReadonlyMap<HookChain, HookState>;
  /** The filter accept hook's record after the payload, when it touched it. */
  readonly acceptHook: HookState | undefined;
  /** The payload removes an older Weir's objects from filter. */
  readonly leftoversRemoved: boolean;
  readonly rules: number;
}

/**
 * One family's payload: mangle, then filter. Order inside mangle's transaction: declare
 * (create or flush) every chain written or deleted, so no rule still jumps to a chain about to
 * go; drop misplaced hooks; write rules; insert the hooks; delete the chains. `hooks` are the
 * hooks the node needs (hooksFor); one whose target is not desired is not wanted, and a hooked
 * builtin chain with no wanted hook loses Weir's copies. In filter: an older Weir's chains and
 * hooks go (after mangle polices), and the accept hook is put first when `acceptMark` is given
 * (ACCEPT mode), removed otherwise.
 */
export function planChains(chains: ReadonlyMap<string, readonly Rule[]>, hooks: readonly Hook[], dirty: ReadonlySet<string>, state: FamilyState, acceptMark?: number): ChainsPlan {
  const declares: string[] = [];
  const rules: string[] = [];
  const deletes: string[] = [];
  const written = new Map<string, string[]>();
  const deleted: string[] = [];
  for (const name of dirty) {
    const want = chains.get(name);
    const have = state.chains.get(name);
    if (want === undefined) {
      if (have !== undefined) {
        declares.push(declareChain(name));
        deletes.push(deleteChain(name));
        deleted.push(name);
      }
      continue;
    }
    const r = renderChain(name, want);
    if (have !== undefined && sameList(have, r.hashes)) continue;
    declares.push(declareChain(name));
    rules.push(...r.lines);
    written.set(name, r.hashes);
  }

  const { hookLines, inserts, hookChanges } = planHooks(chains, hooks, state);
  const body = [...declares, ...hookLines, ...rules, ...inserts, ...deletes];

  const old = state.leftovers;
  const filter = [...old.chains.map(declareChain), ...old.hooks.map((h) => deleteRule(h.chain, h.spec)), ...old.chains.map(deleteChain)];
  const accept = planAcceptHook(state, acceptMark);
  filter.push(...accept.lines);
  return {
    payload: body.length > 0 || filter.length > 0 ? restorePayload(body, filter) : undefined,
    written,
    deleted,
    hooks: hookChanges,
    acceptHook: accept.hook,
    leftoversRemoved: old.chains.length > 0 || old.hooks.length > 0,
    rules: rules.length,
  };
}

/** The mangle hooks to fix: every copy of a wrong one goes, the wanted one goes in at the top. */
function planHooks(chains: ReadonlyMap<string, readonly Rule[]>, hooks: readonly Hook[], state: FamilyState) {
  const hookLines: string[] = [];
  const inserts: string[] = [];
  const hookChanges = new Map<HookChain, HookState>();
  for (const builtin of HOOK_CHAINS) {
    const want = hooks.find((h) => h.chain === builtin && chains.has(h.target));
    const have = state.hooks[builtin];
    if (want ? hookIsRight(have, want.target) : have.specs.length === 0) continue;
    for (const spec of have.specs) hookLines.push(deleteRule(builtin, spec));
    if (want) inserts.push(insertHook(want));
    hookChanges.set(builtin, want ? { specs: [want.spec], atTop: true } : { specs: [], atTop: false });
  }
  return { hookLines, inserts, hookChanges };
}

/** The filter accept hook: first when `acceptMark` is given (ACCEPT mode), absent otherwise. */
function planAcceptHook(state: FamilyState, acceptMark: number | undefined): { lines: string[]; hook: HookState | undefined } {
  const have = state.acceptHook;
  if (acceptMark === undefined ? have.specs.length === 0 : acceptHookIsRight(have, acceptMark)) return { lines: [], hook: undefined };
  const lines = have.specs.map((spec) => deleteRule('FORWARD', spec));
  if (acceptMark !== undefined) lines.push(insertAcceptHook(acceptMark));
  return { lines, hook: acceptMark !== undefined ? { specs: [acceptHookSpec(acceptMark)], atTop: true } : { specs: [], atTop: false } };
}

export interface LayeredPlan extends ChainsPlan {
  /** Chains left to the tidy, each with how many of its rules no packet reaches any more: the
   *  old rules of a layered chain, every rule of a chain no longer desired. */
  readonly pending: ReadonlyMap<string, number>;
}

/**
 * The change planChains would write, as additions only, for nf_tables: a transaction that
 * deletes a rule makes iptables-nft-restore wait an RCU grace period before it can exit
 * (docs/design/dataplane.md); one that only adds does not. A new chain is created and filled.
 * A changed chain gets its new rules inserted above the old ones, then an unconditional RETURN
 * between them: falling off the end of a user chain is a RETURN too, so the chain acts exactly
 * as the new rules say. A chain no longer desired stays, reached only through shadowed rules.
 * All of those are `pending`: a later planChains write (the tidy) rewrites or deletes them.
 *
 * Undefined when the change cannot be written that way: a hook or the accept hook must move, an
 * older Weir's leftovers must go, or the rules it would leave shadowed, beyond those already
 * (`shadowed`, per chain), would exceed `budget`: the full write is the tidy that was owed.
 */
export function planLayeredChains(
  chains: ReadonlyMap<string, readonly Rule[]>,
  hooks: readonly Hook[],
  dirty: ReadonlySet<string>,
  state: FamilyState,
  acceptMark: number | undefined,
  shadowed: ReadonlyMap<string, number>,
  budget: number,
): LayeredPlan | undefined {
  if (planHooks(chains, hooks, state).hookChanges.size > 0 || planAcceptHook(state, acceptMark).hook !== undefined || hasLeftovers(state)) return undefined;
  const declares: string[] = [];
  const appends: string[] = [];
  const inserts: string[] = [];
  const written = new Map<string, string[]>();
  const pending = new Map<string, number>();
  let spent = 0;
  // Everything the chain held stays below the new rules (or alone, unreachable).
  const shadow = (name: string, rules: number) => {
    pending.set(name, rules);
    spent += rules - (shadowed.get(name) ?? 0);
  };
  for (const name of dirty) {
    const want = chains.get(name);
    const have = state.chains.get(name);
    if (want === undefined) {
      if (have !== undefined) shadow(name, have.length);
      continue;
    }
    const r = renderChain(name, want);
    if (have !== undefined && sameList(have, r.hashes)) continue;
    if (have === undefined) {
      declares.push(declareChain(name));
      appends.push(...r.lines);
      written.set(name, r.hashes);
      continue;
    }
    const end = renderLayerEnd(name, r.hashes[r.hashes.length - 1]);
    // Each goes in at position 1, so the last inserted is first: RETURN, then the rules backwards.
    inserts.push(insertAtTop(name, end.line));
    for (let i = r.lines.length - 1; i >= 0; i--) inserts.push(insertAtTop(name, r.lines[i]));
    written.set(name, [...r.hashes, end.hash, ...have]);
    shadow(name, have.length);
  }
  if (spent > budget) return undefined;
  const body = [...declares, ...appends, ...inserts];
  return {
    payload: body.length > 0 ? restorePayload(body, []) : undefined,
    written,
    deleted: [],
    hooks: new Map(),
    acceptHook: undefined,
    leftoversRemoved: false,
    rules: appends.length + inserts.length,
    pending,
  };
}

/** `-A chain spec` as `-I chain 1 spec`. */
const insertAtTop = (chain: string, appendLine: string) => `-I ${chain} 1 ${appendLine.slice(`-A ${chain} `.length)}`;

/** Applies a successful payload to the family record. */
export function commitChains(state: FamilyState, plan: ChainsPlan): void {
  for (const [name, hashes] of plan.written) state.chains.set(name, hashes);
  for (const name of plan.deleted) state.chains.delete(name);
  for (const [builtin, hook] of plan.hooks) state.hooks[builtin] = hook;
  if (plan.acceptHook) state.acceptHook = plan.acceptHook;
  if (plan.leftoversRemoved) state.leftovers = noLeftovers();
}

function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** The accept bit the accept chain sets (ACCEPT mode), which the filter hook accepts by; none
 *  when the chain is not desired (RETURN mode: allowed traffic goes on through filter). */
export function acceptMarkOf(chains: ReadonlyMap<string, readonly Rule[]>, acceptChain: string): number | undefined {
  for (const rule of chains.get(acceptChain) ?? []) if (rule.action.kind === 'setMark' && rule.action.value !== 0) return rule.action.value;
  return undefined;
}
