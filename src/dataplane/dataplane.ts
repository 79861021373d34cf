// Makes the kernel hold the desired dataplane: the composition of its jobs, which run one after
// the other (all but the hook check, which reads beside them). Tool detection: tools.ts; kernel
// read-back: read-back.ts; the write: apply.ts; what layered writes owe: ledger.ts; cleanup:
// cleanup.ts; the drift check: hook-check.ts; the fail-closed boot guard: guard.ts.

import { emptyDirty, mergeDirty, type DesiredDataplane, type Dirty } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import type { CommandRunner } from '../exec/runner.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import { applyDesired, type ApplyContext, type ApplyStats, type ApplyStep, type DataplaneState } from './apply.ts';
import { removeOwn, type CleanupStats } from './cleanup.ts';
import { type ConnectionFilter, deleteConnections, forgetFlows, listFlows, localAddresses, type TrackedFlow } from './conntrack.ts';
import { guardUnpoliced, skeletonOf } from './guard.ts';
import { hooksAsRecorded } from './hook-check.ts';
import type { Backend, BackendChoice, RetryInfo, RetryPolicy } from './iptables.ts';
import { ipvsMode, type IpvsChoice } from './ipvs.ts';
import { createLedger } from './ledger.ts';
import { readOwn, type MemberRead } from './read-back.ts';
import { emptyState } from './state.ts';
import { lazyTools } from './tools.ts';

export type { ApplyStats, ApplyStep } from './apply.ts';
export type { CleanupStats } from './cleanup.ts';
export { DEFAULT_MAX_SHADOWED_RULES } from './ledger.ts';
export type { MemberRead } from './read-back.ts';

/** Felix's default; large enough for every pod IP of a big cluster in one set. */
export const DEFAULT_MAX_SET_SIZE = 1_048_576;

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

export interface ApplyOptions {
  /** Write in full, including what is owed from layered writes (DataplaneStatus.tidyPending). */
  readonly tidy?: boolean;
}

export interface ResyncOptions {
  readonly members?: MemberRead;
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
   *  cheap at many pods, but blind to a member swapped for another. */
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
  /** The tracked connections of a family, those a filter takes deleted, the node's own addresses:
   *  what the opt-in cut of denied connections reads and does (agent/connection-cut.ts). */
  listFlows(family: Family): Promise<TrackedFlow[]>;
  deleteConnections(filter: ConnectionFilter): Promise<number>;
  localAddresses(): Promise<ReadonlySet<string>>;
  status(): DataplaneStatus;
}

export function createDataplane(config: DataplaneConfig): Dataplane {
  const { names, log } = config;
  const families = [...new Set(config.families)].sort();
  const tools = lazyTools({ runner: config.runner, backend: config.backend, log, retry: config.lockRetry, sleep: config.sleep, onRetry: config.onMetric?.retry });
  const ipvs = ipvsMode(config.ipvs ?? 'off', config.runner);
  const ledger = createLedger(config.maxShadowedRules);
  const state: DataplaneState = { applied: emptyState(), needRead: true, dirty: emptyDirty() };
  const ctx: ApplyContext = {
    tools,
    names,
    families,
    maxElem: config.maxSetSize ?? DEFAULT_MAX_SET_SIZE,
    ledger,
    ipvs,
    state,
    log,
    now: config.now ?? (() => performance.now()),
    onStep: (step, seconds, ok) => config.onMetric?.step?.(step, seconds, ok),
  };
  const serial = serialQueue();

  /** Whether the kernel's hooks are as recorded; a record not trusted yet is not compared. */
  async function hookMatches(): Promise<boolean> {
    if (state.needRead) return true; // the next write reads the kernel back anyway
    return hooksAsRecorded(await tools.get(), names, families, state.applied, ipvs);
  }

  return {
    markDirty(d) {
      mergeDirty(state.dirty, d);
    },
    apply(desired, opts) {
      return serial(() => applyDesired(ctx, desired, { tidy: opts?.tidy ?? false }));
    },
    resync(desired, opts) {
      return serial(() => {
        // A read already owed (after a failure) takes everything.
        const members = state.needRead ? 'all' : (opts?.members ?? 'all');
        state.needRead = true;
        return applyDesired(ctx, desired, { tidy: true, members });
      });
    },
    cleanup() {
      return serial(async () => {
        // Whatever happened, the record no longer describes the kernel.
        state.needRead = true;
        const stats = await removeOwn(await tools.get(), names, families, log);
        state.applied = emptyState();
        ledger.clear();
        return stats;
      });
    },
    checkOwnership() {
      return serial(async () => {
        await readOwn(await tools.get(), names, families);
      });
    },
    guard(desired) {
      const skeleton = skeletonOf(desired);
      return serial(async () => {
        const t = await tools.get();
        const wrote = await guardUnpoliced(t, names, families, skeleton, await ipvs.detect(), log);
        state.needRead = true;
        return wrote;
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
    listFlows: (family) => listFlows(config.runner, family),
    deleteConnections: (filter) => deleteConnections(config.runner, filter),
    localAddresses: () => localAddresses(config.runner),
    status() {
      let members = 0;
      for (const s of state.applied.sets.values()) members += s.size;
      let chains = 0;
      let rules = 0;
      for (const f of families) {
        chains += state.applied.families[f].chains.size;
        for (const h of state.applied.families[f].chains.values()) rules += h.length;
      }
      return { backend: tools.backend(), ipvs: ipvs.wanted, inSync: !state.needRead, sets: state.applied.sets.size, members, chains, rules, tidyPending: ledger.pending() };
    },
  };
}

/** Runs each job after the previous one has settled, whatever its outcome. */
function serialQueue(): <T>(fn: () => Promise<T>) => Promise<T> {
  let queue: Promise<unknown> = Promise.resolve();
  return <T>(fn: () => Promise<T>): Promise<T> => {
    const p = queue.then(fn, fn);
    queue = p.catch(() => undefined);
    return p;
  };
}
