// One write of the desired dataplane: only what is dirty, in three steps that keep every
// reference valid: sets first, then one iptables-restore per family, then set destroys. The
// record of what was applied changes only after a step succeeds. On nf_tables a change is
// written as additions only (planLayeredChains) where it can be; what that leaves behind is owed
// to a later full write (ledger.ts).

import { emptyDirty, mergeDirty, type DesiredDataplane, type Dirty } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import type { IpvsMode } from './ipvs.ts';
import type { Ledger } from './ledger.ts';
import { acceptMarkOf, commitChains, commitSetChanges, planChains, planLayeredChains, planSets, SPLIT_SETS_AT_MEMBERS, type ChainsPlan, type LayeredPlan } from './plan.ts';
import { dirtyAfterRead, readOwn, type MemberRead } from './read-back.ts';
import { hooksFor } from './render.ts';
import type { AppliedState } from './state.ts';
import type { Toolbox, Tools } from './tools.ts';

export type ApplyStep = 'read' | 'sets' | 'chains' | 'destroy';

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

/** What one dataplane keeps between its writes. */
export interface DataplaneState {
  /** What the kernel holds, as far as the writes know. */
  applied: AppliedState;
  /** The record is trusted only after a kernel read: a failed write may have half-applied ipset. */
  needRead: boolean;
  /** Marked work no write has taken yet. */
  dirty: Dirty;
}

export interface ApplyContext {
  readonly tools: Toolbox;
  readonly names: Names;
  readonly families: readonly Family[];
  /** maxelem of the sets created. */
  readonly maxElem: number;
  readonly ledger: Ledger;
  readonly ipvs: IpvsMode;
  readonly state: DataplaneState;
  readonly log: Logger;
  /** Monotonic milliseconds, for step durations. */
  readonly now: () => number;
  /** A step finished; `ok` is false when it threw. */
  readonly onStep?: (step: ApplyStep, seconds: number, ok: boolean) => void;
}

export interface ApplyRequest {
  /** Write in full, including what layered writes left (ledger.ts). */
  readonly tidy: boolean;
  /** How a kernel read, if this write makes one, takes set members. */
  readonly members?: MemberRead;
}

/** Writes what is dirty; on failure keeps it dirty, distrusts the record and throws. */
export async function applyDesired(ctx: ApplyContext, desired: DesiredDataplane, request: ApplyRequest): Promise<ApplyStats> {
  const { state, ledger, families, names, log } = ctx;
  const t0 = ctx.now();
  const stats = noStats();
  const readFirst = state.needRead;
  // Marks made until the plan below is taken are planned by this write; later ones wait for
  // the next. A failure before it leaves them in `state.dirty`.
  let work = emptyDirty();
  try {
    const t = await ctx.tools.get();
    if (readFirst) {
      await timed(ctx, stats, 'read', () => readKernel(ctx, t, desired, request.members ?? 'all'));
      state.needRead = false;
      ledger.clear(); // every chain and set is in the work now
      stats.resynced = true;
    }
    // From here to planSets nothing awaits: calc's live sets are read as they are, and only
    // the chain maps, read again after the sets are written, are copied.
    work = state.dirty;
    state.dirty = emptyDirty();
    desired = { ...desired, chains: { 4: new Map(desired.chains[4]), 6: new Map(desired.chains[6]) } };
    const hooks = hooksFor(desired.topChain, ctx.ipvs.wanted);
    const acceptMark = (f: Family) => acceptMarkOf(desired.chains[f], names.accept);
    // Layered only where it saves a grace period: nf_tables, an incremental write, and every
    // family's change expressible as additions. Otherwise everything owed is written too.
    let layered: { f: Family; plan: LayeredPlan }[] | undefined;
    if (!readFirst && !request.tidy && t.iptables.backend === 'nft') {
      const tried = families.map((f) => ({ f, plan: planLayeredChains(desired.chains[f], hooks, work.chains[f], state.applied.families[f], acceptMark(f), ledger.shadowed(f), ledger.budget(f)) }));
      if (tried.every((p): p is { f: Family; plan: LayeredPlan } => p.plan !== undefined)) layered = tried;
    }
    if (layered === undefined) mergeDirty(work, ledger.settle());

    // (1) Sets first, so every set a new rule names exists.
    const sets = planSets(desired, work.sets, state.applied.sets, { maxElem: ctx.maxElem, tmpName: (f) => names.peerSet(f, '\0weir swap scratch') });
    if (sets.lines.length > 0) {
      const batches = sets.added + sets.removed < SPLIT_SETS_AT_MEMBERS ? [sets.lines] : [sets.byFamily[4], sets.byFamily[6]].filter((l) => l.length > 0);
      await timed(ctx, stats, 'sets', async () => {
        // Side by side when split; the record changes only once every batch succeeded (a
        // failure reads the kernel back before the next write).
        await settleAll(batches.map((lines) => t.ipset.restore(lines)));
      });
    }
    commitSetChanges(state.applied.sets, sets.changes);
    stats.setsCreated = sets.created;
    stats.membersAdded = sets.added;
    stats.membersRemoved = sets.removed;

    // (2) One atomic payload per family.
    const plans: readonly { f: Family; plan: ChainsPlan }[] =
      layered ?? families.map((f) => ({ f, plan: planChains(desired.chains[f], hooks, work.chains[f], state.applied.families[f], acceptMark(f)) }));
    const writes = plans.flatMap(({ f, plan }) => (plan.payload === undefined ? [] : [{ f, plan, payload: plan.payload }]));
    if (writes.length > 0) {
      await timed(ctx, stats, 'chains', async () => {
        // The families are separate tables: write them side by side, record each success.
        await settleAll(
          writes.map(({ f, payload }) => t.iptables.restore(f, payload)),
          (i) => {
            const { f, plan } = writes[i];
            commitChains(state.applied.families[f], plan);
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
    if (layered !== undefined) {
      for (const { f, plan } of layered) ledger.oweChains(f, plan.pending);
      ledger.oweSets(sets.destroyed);
    } else if (sets.destroyLines.length > 0) {
      await timed(ctx, stats, 'destroy', () => t.ipset.restore(sets.destroyLines));
      for (const name of sets.destroyed) state.applied.sets.delete(name);
      stats.setsDeleted = sets.destroyed.length;
    }
  } catch (err) {
    mergeDirty(state.dirty, work);
    state.needRead = true;
    log.warn({ err }, 'dataplane apply failed; will read the kernel back on retry');
    throw err;
  }
  stats.durations.total = (ctx.now() - t0) / 1000;
  const changed = stats.setsCreated + stats.setsDeleted + stats.membersAdded + stats.membersRemoved + stats.chainsWritten + stats.chainsDeleted + stats.hooksWritten;
  if (changed > 0 || stats.resynced) log.info({ stats }, stats.resynced ? 'dataplane resynced' : 'dataplane applied');
  return stats;
}

/** Rebuilds the record from the kernel and marks everything, desired or found, dirty (read-back.ts). */
async function readKernel(ctx: ApplyContext, t: Tools, desired: DesiredDataplane, members: MemberRead): Promise<void> {
  const { state, families } = ctx;
  const read = await readOwn(t, ctx.names, families, { members, recorded: state.applied.sets });
  await ctx.ipvs.relearn(ctx.log);
  state.applied = read.state;
  mergeDirty(state.dirty, dirtyAfterRead(desired, read, families, members));
  ctx.log.debug({ sets: read.state.sets.size, chains: families.map((f) => read.state.families[f].chains.size) }, 'read kernel state');
}

const noStats = (): ApplyStats => ({
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
});

async function timed<T>(ctx: ApplyContext, stats: ApplyStats, step: ApplyStep, fn: () => Promise<T>): Promise<T> {
  const t0 = ctx.now();
  let ok = false;
  try {
    const r = await fn();
    ok = true;
    return r;
  } finally {
    const seconds = (ctx.now() - t0) / 1000;
    stats.durations[step] = seconds;
    ctx.onStep?.(step, seconds, ok);
  }
}

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
