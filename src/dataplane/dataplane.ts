// Makes the kernel hold the desired dataplane. Writes only what is dirty, in three steps that
// keep every reference valid: sets first, then one iptables-restore per family, then set
// destroys. The record of what was applied changes only after a step succeeds. On nf_tables a
// change is written as additions only (planLayeredChains); what it leaves behind (shadowed old
// rules, chains and sets no longer used) is owed to a later write, the tidy.

import { emptyDirty, mergeDirty, type DesiredDataplane, type Dirty, type Rule } from '../calc/desired.ts';
import { PreconditionError } from '../errors.ts';
import type { Names } from '../calc/names.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import { forgetFlows } from './conntrack.ts';
import { createIpset, parseIpsetTerse, type Ipset } from './ipset.ts';
import { createIptables, detectBackend, type Backend, type BackendChoice, type Iptables, type RetryInfo, type RetryPolicy } from './iptables.ts';
import { ipvsInterfacePresent, type IpvsChoice } from './ipvs.ts';
import { acceptMarkOf, commitChains, commitSetChanges, planChains, planLayeredChains, planSets, SPLIT_SETS_AT_MEMBERS, type ChainsPlan, type LayeredPlan } from './plan.ts';
import { declareChain, deleteChain, deleteRule, HOOK_CHAINS, hooksFor, insertAcceptHook, insertHook, renderChain, restorePayload, setDestroy, TABLE } from './render.ts';
import type { CommandRunner } from '../exec/runner.ts';
import {
  acceptHookIn,
  emptyFamilyState,
  emptyState,
  familyStateFromSave,
  hookIsRight,
  ownHookIn,
  ownSets,
  sameHook,
  setsStateFromSave,
  type AppliedSet,
  type AppliedState,
  type FamilyState,
} from './state.ts';

/** Felix's default; large enough for every pod IP of a big cluster in one set. */
export const DEFAULT_MAX_SET_SIZE = 1_048_576;

export type ApplyStep = 'read' | 'sets' | 'chains' | 'destroy';

export interface DataplaneMetricHooks {
  /** A step finished; `ok` is false when it threw. */
  readonly step?: (step: ApplyStep, seconds: number, ok: boolean) => void;
  /** A transient xtables-lock failure is being retried. */
  readonly retry?: (info: RetryInfo) => void;
}

export interface DataplaneConfig {
  readonly runner: CommandRunner;
  readonly names: Names;
  readonly families: readonly Family[];
  readonly backend: BackendChoice;
  /** Hook OUTPUT too, for kube-proxy's IPVS mode (see ipvsHookSpec). Default off. */
  readonly ipvs?: IpvsChoice;
  readonly log: Logger;
  readonly maxSetSize?: number;
  /** See DEFAULT_MAX_SHADOWED_RULES. */
  readonly maxShadowedRules?: number;
  /** Retries of a restore that met the xtables lock; see DEFAULT_LOCK_RETRY. */
  readonly lockRetry?: RetryPolicy;
  readonly sleep?: (ms: number) => Promise<void>;
  /** Monotonic milliseconds, for step durations. */
  readonly now?: () => number;
  readonly onMetric?: DataplaneMetricHooks;
}

export interface ApplyStats {
  /** True when this apply first read the kernel back (start, resync, or after a failure). */
  resynced: boolean;
  setsCreated: number;
  setsDeleted: number;
  membersAdded: number;
  membersRemoved: number;
  chainsWritten: number;
  chainsDeleted: number;
  rulesWritten: number;
  hooksWritten: number;
  /** Seconds per step; 0 for steps that had nothing to do. */
  durations: Record<ApplyStep | 'total', number>;
}

export interface ApplyOptions {
  /** Write in full, including what is owed from layered writes (DataplaneStatus.tidyPending). */
  readonly tidy?: boolean;
}

/** How a read takes set members: all of them, or only for sets whose size changed. */
export type MemberRead = 'all' | 'counts';

export interface ResyncOptions {
  readonly members?: MemberRead;
}

export interface CleanupStats {
  chainsDeleted: number;
  hooksDeleted: number;
  setsDeleted: number;
}

export interface DataplaneStatus {
  readonly backend: Backend | undefined;
  /** Whether the OUTPUT hook for kube-proxy's IPVS mode is wanted (as of the last kernel read). */
  readonly ipvs: boolean;
  /** False until the first apply read the kernel back, and again after a failure. */
  readonly inSync: boolean;
  readonly sets: number;
  readonly members: number;
  readonly chains: number;
  readonly rules: number;
  /** Chains and sets layered writes left for a tidy write to rewrite or remove. */
  readonly tidyPending: number;
}

export interface Dataplane {
  /** Records what a batch of model changes dirtied; no I/O. */
  markDirty(d: Dirty): void;
  /** Writes what is dirty; throws (and keeps it dirty) on failure so the caller can retry.
   *  With `tidy`, writes in full and removes whatever earlier layered writes left behind. */
  apply(desired: DesiredDataplane, opts?: ApplyOptions): Promise<ApplyStats>;
  /** Reads the kernel back, repairs drift and removes stale own objects, then applies. With
   *  `members: 'counts'` a set's members are read only when its size differs from the record:
   *  cheap at 100k pods, but blind to a member swapped for another. */
  resync(desired: DesiredDataplane, opts?: ResyncOptions): Promise<ApplyStats>;
  /** Removes every chain, hook rule and set Weir owns, and nothing else. */
  cleanup(): Promise<CleanupStats>;
  /** Throws a PreconditionError when chains or sets with Weir's prefix exist that Weir did not
   *  write (Calico's Felix uses the same names): Weir must not run beside them. */
  checkOwnership(): Promise<void>;
  /**
   * Before the first sync: in each family whose FORWARD holds no Weir hook (a fresh boot), writes
   * the hook and the chains of `desired` that name no set (the top and dispatch chains, which
   * then drop all traffic of the pod bridge). A node that already holds Weir's rules keeps them
   * until the real state replaces them. Returns whether it wrote anything.
   */
  guard(desired: DesiredDataplane): Promise<boolean>;
  /** Cheap drift check: false when a family's hooks differ from the record (own chains are the
   *  resync's to compare), or (--ipvs auto) kube-ipvs0 came or went. It reads beside a running write; a difference
   *  is read again once no write runs before it counts. */
  hookIntact(): Promise<boolean>;
  /** Deletes the tracked connections of addresses local pods gave up (conntrack.ts), once no
   *  rule dispatches them; resolves with how many entries went. */
  forgetFlows(addresses: readonly string[]): Promise<number>;
  status(): DataplaneStatus;
}

interface Tools {
  readonly iptables: Iptables;
  readonly ipset: Ipset;
}

export function createDataplane(config: DataplaneConfig): Dataplane {
  const { names, log } = config;
  const families = [...new Set(config.families)].sort();
  const now = config.now ?? (() => performance.now());
  const maxElem = config.maxSetSize ?? DEFAULT_MAX_SET_SIZE;
  const maxShadowed = config.maxShadowedRules ?? DEFAULT_MAX_SHADOWED_RULES;
  const tmpName = (f: Family) => names.peerSet(f, '\0weir swap scratch');

  let tools: Tools | undefined;
  let state: AppliedState = emptyState();
  const ipvsChoice = config.ipvs ?? 'off';
  // The OUTPUT hook is wanted; with auto, re-learned at every kernel read.
  let ipvs = ipvsChoice === 'on';
  const detectIpvs = async (): Promise<boolean> => (ipvsChoice === 'auto' ? ipvsInterfacePresent(config.runner) : ipvsChoice === 'on');
  let dirty = emptyDirty();
  // What layered writes left for the tidy: chains layered or no longer desired (with their
  // shadowed rules), and sets no longer desired.
  let owed = nothingOwed();
  // The record is trusted only after a kernel read; a failed write may have half-applied ipset.
  let needRead = true;
  // apply/resync/cleanup never overlap: each waits for the previous one.
  let queue: Promise<unknown> = Promise.resolve();
  const serial = <T>(fn: () => Promise<T>): Promise<T> => {
    const p = queue.then(fn, fn);
    queue = p.catch(() => undefined);
    return p;
  };

  async function getTools(): Promise<Tools> {
    if (tools === undefined) {
      const backend = await detectBackend(config.runner, config.backend, log);
      tools = {
        iptables: createIptables({
          runner: config.runner,
          backend,
          log,
          retry: config.lockRetry,
          sleep: config.sleep,
          onRetry: config.onMetric?.retry,
        }),
        ipset: createIpset(config.runner),
      };
    }
    return tools;
  }

  async function timed<T>(stats: ApplyStats, step: ApplyStep, fn: () => Promise<T>): Promise<T> {
    const t0 = now();
    let ok = false;
    try {
      const r = await fn();
      ok = true;
      return r;
    } finally {
      const seconds = (now() - t0) / 1000;
      stats.durations[step] = seconds;
      config.onMetric?.step?.(step, seconds, ok);
    }
  }

  /**
   * Reads Weir's own objects back; refuses when objects with its names are not its own. With
   * `members` 'counts', set members are read only where a set's header or number of entries
   * differs from the record (`reread` names them); elsewhere the size is taken as it is.
   */
  async function readOwn(t: Tools, members: MemberRead = 'all', reread?: Set<string>): Promise<AppliedState> {
    const read: { [F in Family]?: FamilyState } = {};
    const foreign: string[] = [];
    const saved = await Promise.all(families.map((f) => t.iptables.save(f)));
    families.forEach((f, i) => {
      read[f] = familyStateFromSave(saved[i], names, foreign);
    });
    let sets: Map<string, AppliedSet>;
    if (members === 'all') sets = setsStateFromSave(await t.ipset.save(), names, foreign);
    else {
      const headers = parseIpsetTerse(await t.ipset.listHeaders());
      sets = ownSets(headers, names, foreign);
      for (const [name, found] of sets) {
        const had = state.sets.get(name);
        const same = had !== undefined && had.type === found.type && had.family === found.family && had.maxElem === found.maxElem;
        if (same && had.size === found.size) continue;
        const full = setsStateFromSave(await t.ipset.save(name), names).get(name);
        if (full !== undefined) sets.set(name, full);
        reread?.add(name);
      }
    }
    if (foreign.length > 0) {
      throw new PreconditionError(
        `found ${foreign.length} chains or sets named like Weir's (prefix "${names.prefix}") that Weir did not write, such as ${foreign.slice(0, 5).join(', ')}: ` +
          `another program (Calico's Felix?) owns them. Weir never touches them; run it with another --chain-prefix, or remove that program.`,
      );
    }
    return { sets, families: { 4: read[4] ?? emptyFamilyState(), 6: read[6] ?? emptyFamilyState() } };
  }

  /** Rebuilds the record from the kernel and marks everything, desired or found, dirty; after
   *  a 'counts' read, the sets whose members were kept from the record are not marked. */
  async function readKernel(t: Tools, desired: DesiredDataplane, into: Dirty, members: MemberRead): Promise<void> {
    const reread = new Set<string>();
    const fresh = await readOwn(t, members, reread);
    const wasIpvs = ipvs;
    ipvs = await detectIpvs();
    if (ipvs !== wasIpvs) log.info({ ipvs }, ipvs ? 'kube-proxy runs in IPVS mode: hooking OUTPUT too' : 'kube-proxy no longer runs in IPVS mode: unhooking OUTPUT');
    state = fresh;
    const all = emptyDirty();
    const kept = (name: string) => members === 'counts' && !reread.has(name) && desired.sets.has(name) && fresh.sets.has(name);
    for (const name of [...desired.sets.keys(), ...fresh.sets.keys()]) if (!kept(name)) all.sets.set(name, 'all');
    for (const f of families) {
      for (const c of [...desired.chains[f].keys(), ...fresh.families[f].chains.keys()]) all.chains[f].add(c);
    }
    mergeDirty(into, all);
    log.debug({ sets: fresh.sets.size, chains: families.map((f) => fresh.families[f].chains.size) }, 'read kernel state');
  }

  function owe(f: Family, chains: ReadonlyMap<string, number>): void {
    for (const [name, rules] of chains) owed.shadowed[f].set(name, rules);
  }
  const shadowBudget = (f: Family) => maxShadowed - [...owed.shadowed[f].values()].reduce((a, b) => a + b, 0);

  async function applyNow(desired: DesiredDataplane, tidy: boolean, members: MemberRead = 'all'): Promise<ApplyStats> {
    const t0 = now();
    const stats: ApplyStats = {
      resynced: false,
      setsCreated: 0,
      setsDeleted: 0,
      membersAdded: 0,
      membersRemoved: 0,
      chainsWritten: 0,
      chainsDeleted: 0,
      rulesWritten: 0,
      hooksWritten: 0,
      durations: { read: 0, sets: 0, chains: 0, destroy: 0, total: 0 },
    };
    const readFirst = needRead;
    // Marks made until the plan below is taken are planned by this write; later ones wait for
    // the next. A failure before it leaves them in `dirty`.
    let work = emptyDirty();
    try {
      const t = await getTools();
      if (readFirst) {
        await timed(stats, 'read', () => readKernel(t, desired, dirty, members));
        needRead = false;
        owed = nothingOwed(); // every chain and set is in the work now
        stats.resynced = true;
      }
      // From here to planSets nothing awaits: calc's live sets are read as they are, and only
      // the chain maps, read again after the sets are written, are copied.
      work = dirty;
      dirty = emptyDirty();
      desired = { ...desired, chains: { 4: new Map(desired.chains[4]), 6: new Map(desired.chains[6]) } };
      const hooks = hooksFor(desired.topChain, ipvs);
      const acceptMark = (f: Family) => acceptMarkOf(desired.chains[f], names.accept);
      // Layered only where it saves a grace period: nf_tables, an incremental write, and every
      // family's change expressible as additions. Otherwise everything owed is written too.
      let layered: { f: Family; plan: LayeredPlan | undefined }[] | undefined;
      if (!readFirst && !tidy && t.iptables.backend === 'nft') {
        layered = families.map((f) => ({ f, plan: planLayeredChains(desired.chains[f], hooks, work.chains[f], state.families[f], acceptMark(f), owed.shadowed[f], shadowBudget(f)) }));
        if (layered.some(({ plan }) => plan === undefined)) layered = undefined;
      }
      if (layered === undefined) {
        mergeDirty(work, asDirty(owed));
        owed = nothingOwed();
      }
      // (1) Sets first, so every set a new rule names exists.
      const sets = planSets(desired, work.sets, state.sets, { maxElem, tmpName });
      if (sets.lines.length > 0) {
        const batches = sets.added + sets.removed < SPLIT_SETS_AT_MEMBERS ? [sets.lines] : [sets.byFamily[4], sets.byFamily[6]].filter((l) => l.length > 0);
        await timed(stats, 'sets', async () => {
          // Side by side when split; the record changes only once every batch succeeded (a
          // failure reads the kernel back before the next write).
          await settleAll(batches.map((lines) => t.ipset.restore(lines)));
        });
      }
      commitSetChanges(state.sets, sets.changes);
      stats.setsCreated = sets.created;
      stats.membersAdded = sets.added;
      stats.membersRemoved = sets.removed;

      // (2) One atomic payload per family.
      const plans = (layered ?? families.map((f) => ({ f, plan: planChains(desired.chains[f], hooks, work.chains[f], state.families[f], acceptMark(f)) }))).filter(
        (p): p is { f: Family; plan: ChainsPlan } => p.plan?.payload !== undefined,
      );
      if (plans.length > 0) {
        await timed(stats, 'chains', async () => {
          // The families are separate tables: write them side by side, record each success.
          await settleAll(
            plans.map(({ f, plan }) => t.iptables.restore(f, plan.payload!)),
            (i) => {
              const { f, plan } = plans[i];
              commitChains(state.families[f], plan);
              stats.chainsWritten += plan.written.size;
              stats.chainsDeleted += plan.deleted.length;
              stats.rulesWritten += plan.rules;
              stats.hooksWritten += plan.hooks.size + (plan.acceptHook ? 1 : 0);
            },
          );
        });
      }

      // What a layered write left, in every family (one with nothing to add too), is owed; a
      // failure above reads the kernel back instead. (3) Destroy sets no chain references any
      // more; after a layered write a shadowed rule may still name one: the tidy destroys it.
      for (const { f, plan } of layered ?? []) owe(f, plan!.pending);
      if (layered !== undefined) for (const name of sets.destroyed) owed.sets.set(name, 'all');
      else if (sets.destroyLines.length > 0) {
        await timed(stats, 'destroy', () => t.ipset.restore(sets.destroyLines));
        for (const name of sets.destroyed) state.sets.delete(name);
        stats.setsDeleted = sets.destroyed.length;
      }
    } catch (err) {
      mergeDirty(dirty, work);
      needRead = true;
      log.warn({ err }, 'dataplane apply failed; will read the kernel back on retry');
      throw err;
    }
    stats.durations.total = (now() - t0) / 1000;
    const changed = stats.setsCreated + stats.setsDeleted + stats.membersAdded + stats.membersRemoved + stats.chainsWritten + stats.chainsDeleted + stats.hooksWritten;
    if (changed > 0 || stats.resynced) log.info({ stats }, stats.resynced ? 'dataplane resynced' : 'dataplane applied');
    return stats;
  }

  async function cleanupNow(): Promise<CleanupStats> {
    const t = await getTools();
    const stats: CleanupStats = { chainsDeleted: 0, hooksDeleted: 0, setsDeleted: 0 };
    for (const f of families) {
      const text = await t.iptables.save(f);
      // Only what carries Weir's mark: a chain or set merely named like Weir's is not Weir's.
      // Mangle's chains and hooks; in filter the accept hook and an older Weir's objects.
      const mine = familyStateFromSave(text, names);
      const own = [...mine.chains.keys()];
      const hooks = HOOK_CHAINS.flatMap((builtin) => mine.hooks[builtin].specs.map((spec) => deleteRule(builtin, spec)));
      const old = mine.leftovers;
      const filterHooks = [...mine.acceptHook.specs.map((spec) => deleteRule('FORWARD', spec)), ...old.hooks.map((h) => deleteRule(h.chain, h.spec))];
      if (own.length + hooks.length + old.chains.length + filterHooks.length === 0) continue;
      const mangle = own.length + hooks.length > 0 ? [...own.map(declareChain), ...hooks, ...own.map(deleteChain)] : [];
      await t.iptables.restore(f, restorePayload(mangle, [...old.chains.map(declareChain), ...filterHooks, ...old.chains.map(deleteChain)]));
      stats.chainsDeleted += own.length + old.chains.length;
      stats.hooksDeleted += hooks.length + filterHooks.length;
    }
    const sets = [...setsStateFromSave(await t.ipset.save(), names).keys()];
    await t.ipset.restore(sets.map(setDestroy));
    stats.setsDeleted = sets.length;
    state = emptyState();
    owed = nothingOwed();
    log.info({ stats }, 'dataplane cleaned up');
    return stats;
  }

  /**
   * Whether the kernel holds Weir's hooks where the record has them: the mangle hooks first,
   * alone, and the filter accept hook as recorded (or none). These are what other programs
   * move in normal running (a rule inserted at the top of FORWARD); it reads just those builtin
   * chains, since `iptables-save` translates every rule of a table. Own chains' content is
   * compared by the periodic resync.
   */
  async function hookMatches(): Promise<boolean> {
    if (needRead) return true; // the next write reads the kernel back anyway
    const t = await getTools();
    const familyMatches = async (f: Family) => {
      const want = state.families[f];
      const hooked = HOOK_CHAINS.filter((builtin) => want.hooks[builtin].specs.length > 0);
      const [filterForward, ...builtins] = await Promise.all([t.iptables.listChain(f, 'filter', 'FORWARD'), ...hooked.map((builtin) => t.iptables.listChain(f, TABLE, builtin))]);
      if (builtins.some((rules) => !hookIsRight(ownHookIn(rules, names), names.forward))) return false;
      const accept = acceptHookIn(filterForward);
      return want.acceptHook.specs.length > 0 ? sameHook(accept, want.acceptHook) : accept.specs.length === 0;
    };
    const [nowIpvs, ...matches] = await Promise.all([detectIpvs(), ...families.map(familyMatches)]);
    return nowIpvs === ipvs && matches.every(Boolean);
  }

  return {
    markDirty(d) {
      mergeDirty(dirty, d);
    },
    apply(desired, opts) {
      return serial(() => applyNow(desired, opts?.tidy ?? false));
    },
    resync(desired, opts) {
      return serial(() => {
        // A read already owed (after a failure) takes everything.
        const members = needRead ? 'all' : (opts?.members ?? 'all');
        needRead = true;
        return applyNow(desired, true, members);
      });
    },
    cleanup() {
      return serial(async () => {
        // Whatever happened, the record no longer describes the kernel.
        needRead = true;
        return cleanupNow();
      });
    },
    checkOwnership() {
      return serial(async () => {
        await readOwn(await getTools());
      });
    },
    guard(desired) {
      // The skeleton references no set, so it is complete without any ipset write.
      const chainsOf = (f: Family) => [...desired.chains[f]].filter(([, rules]) => !rules.some(namesASet));
      const chains = { 4: chainsOf(4), 6: chainsOf(6) };
      return serial(async () => {
        const t = await getTools();
        const written: Family[] = [];
        const hooks = hooksFor(desired.topChain, await detectIpvs());
        for (const f of families) {
          const found = familyStateFromSave(await t.iptables.save(f), names);
          // Weir's hook in mangle, or an older Weir's in filter: that node is policed.
          if (found.hooks.FORWARD.specs.length > 0 || found.leftovers.hooks.some((h) => h.chain === 'FORWARD')) continue;
          const lines: string[] = [];
          for (const [name] of chains[f]) lines.push(declareChain(name));
          for (const [name, rules] of chains[f]) lines.push(...renderChain(name, rules).lines);
          lines.push(...hooks.map(insertHook));
          const mark = acceptMarkOf(new Map(chains[f]), names.accept);
          const filter = [...found.acceptHook.specs.map((spec) => deleteRule('FORWARD', spec)), ...(mark === undefined ? [] : [insertAcceptHook(mark)])];
          await t.iptables.restore(f, restorePayload(lines, filter));
          written.push(f);
        }
        needRead = true;
        if (written.length > 0) log.warn({ families: written }, 'no Weir rules on this node yet: pod traffic is dropped until the first full state is enforced');
        return written.length > 0;
      });
    },
    async hookIntact() {
      // Read beside any write, so a change never waits for the check; a write running
      // meanwhile can make the kernel and the record differ for a moment, so a difference is
      // confirmed by reading again with no write running before it is called drift.
      return (await hookMatches()) || serial(hookMatches);
    },
    async forgetFlows(addresses) {
      let deleted = 0;
      for (const a of addresses) deleted += await forgetFlows(config.runner, a);
      return deleted;
    },
    status() {
      let members = 0;
      for (const s of state.sets.values()) members += s.size;
      let chains = 0;
      let rules = 0;
      for (const f of families) {
        chains += state.families[f].chains.size;
        for (const h of state.families[f].chains.values()) rules += h.length;
      }
      const tidyPending = owed.shadowed[4].size + owed.shadowed[6].size + owed.sets.size;
      return { backend: tools?.iptables.backend, ipvs, inSync: !needRead, sets: state.sets.size, members, chains, rules, tidyPending };
    },
  };
}

/** Rules per family that layered writes may leave shadowed before a write is made in full: it
 *  bounds what the kernel holds beyond the desired state while changes leave no quiet second
 *  for a tidy (30 changes of a local pod at 110 pods a node shadow about 7,000). */
export const DEFAULT_MAX_SHADOWED_RULES = 10_000;

interface Owed {
  readonly shadowed: Record<Family, Map<string, number>>;
  readonly sets: Map<string, 'all'>;
}
const nothingOwed = (): Owed => ({ shadowed: { 4: new Map(), 6: new Map() }, sets: new Map() });
const asDirty = (o: Owed): Dirty => ({ sets: o.sets, chains: { 4: new Set(o.shadowed[4].keys()), 6: new Set(o.shadowed[6].keys()) } });

/** Waits for every write, so none is still running when one failed; calls `done` with the index
 *  of each that succeeded, then throws the first failure. */
async function settleAll(writes: readonly Promise<unknown>[], done: (i: number) => void = () => {}): Promise<void> {
  const results = await Promise.allSettled(writes);
  results.forEach((r, i) => {
    if (r.status === 'fulfilled') done(i);
  });
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}

const namesASet = (r: Rule) => r.matches.some((m) => m.kind === 'set');
