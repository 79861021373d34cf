// The reconcile loop. Source batches queue up; the loop feeds them to calc only while no
// write is running (so the desired state is stable during an apply), then writes what they
// dirtied. Every pass runs through one pacer, the loop's only timer: bursts coalesce, failures
// back off however many batches arrive, and the periodic resync and hook check are requests to
// that same pacer, so stop() cancels everything at once.

import { backoffMs } from '../backoff.ts';
import type { Calculator, DesiredDataplane, Dirty } from '../calc/index.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { formatPolicyErrors, INVALID_POLICY_EFFECT } from '../model/policy-errors.ts';
import type { CalcEvent, CompiledPolicy } from '../model/types.ts';
import { type Clock, monotonicClock } from '../clock.ts';
import { createPacer, type Pacer } from '../pacer.ts';
import type { SourceBatch } from '../sources/types.ts';

export type { Clock } from '../clock.ts';

/** What the loop needs from the dataplane (dataplane/ provides it). */
export interface DataplanePort {
  markDirty(d: Dirty): void;
  /** Writes what is dirty; with `tidy`, also what earlier layered writes left (tidyPending). */
  apply(desired: DesiredDataplane, opts?: { tidy?: boolean }): Promise<unknown>;
  /** Reads the kernel back, removes own stale objects and repairs drift, then applies; with
   *  members 'counts', set members only of sets whose size differs from the record. */
  resync(desired: DesiredDataplane, opts?: { members?: 'all' | 'counts' }): Promise<unknown>;
  status(): { sets: number; chains: number; rules: number; tidyPending?: number };
  /** A cheap drift check (one iptables-save per family, no ipset read): false when Weir's hook
   *  is missing or misplaced, or any of its chains was flushed, edited or removed. */
  hookIntact(): Promise<boolean>;
  /** On a node that holds no Weir hook at all (a fresh boot), writes the fail-closed skeleton
   *  (the hook, the top and dispatch chains: traffic of pods Weir does not know yet is dropped);
   *  true if it wrote. */
  guard(desired: DesiredDataplane): Promise<boolean>;
  /** Deletes the tracked connections of these addresses; resolves with how many went. */
  forgetFlows(addresses: readonly string[]): Promise<number>;
}

const threadCpuMs = () => {
  const u = process.threadCpuUsage();
  return (u.user + u.system) / 1000;
};

/** /healthz fails after this many resync intervals without a successful write. */
export const UNHEALTHY_AFTER_RESYNC_INTERVALS = 3;
/** The same bound when the periodic resync is off. */
export const DEFAULT_UNHEALTHY_AFTER_MS = 90_000;
/** How long the node must be quiet before the loop tidies what layered writes left: the tidy
 *  deletes rules, which costs a grace period that a change arriving meanwhile would wait for. */
export const DEFAULT_TIDY_DELAY_MS = 1_000;
/** Every this many periodic resyncs, one reads every set member back; the others read set
 *  sizes only (at 100k pods a full read takes about a second, and the loop waits for it). */
export const FULL_READ_EVERY = 10;
/** Tries at deleting a released address's tracked connections, each after a write. */
export const FORGET_ATTEMPTS = 3;
/** Arrival times kept for the event-to-enforced histogram while writes fail: the oldest ones
 *  (the longest waits); later batches of the same write are not observed. */
export const MAX_UNAPPLIED = 1_000;

export interface ReconcilerOptions {
  readonly calc: Calculator;
  readonly dataplane: DataplanePort;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly debounceMs: number;
  readonly retryMinMs: number;
  readonly retryMaxMs: number;
  /** Full read-back of the kernel; 0 turns it off. */
  readonly resyncIntervalMs: number;
  /** Quiet time before a tidy write (DataplanePort.apply); default DEFAULT_TIDY_DELAY_MS. */
  readonly tidyDelayMs?: number;
  /** How often the hook is checked once synced; 0 or absent turns it off. */
  readonly hookCheckIntervalMs?: number;
  /** /healthz fails when a write has been wanted this long without one succeeding; default
   *  UNHEALTHY_AFTER_RESYNC_INTERVALS resync intervals. */
  readonly unhealthyAfterMs?: number;
  readonly clock?: Clock;
  /** CPU milliseconds the loop's thread has used (logged beside a compute's wall time, which
   *  also counts time the thread waited for a core); default process.threadCpuUsage. */
  readonly threadCpuMs?: () => number;
  /** Called after every write attempt (status reporting hangs here; it must not block). */
  readonly onPass?: (outcome: PassOutcome) => void;
  /** A full garbage collection (the agent passes V8's, exposed by --expose-gc), run before the
   *  first full state is computed, between its slices, and after it is written. A cold start
   *  leaves the lists' and the first compute's garbage for V8 to collect only as its heap grows
   *  further: at 100k pods the start's peak RSS was 301-304 MB, 278-282 MB with the first and
   *  the last, for about 0.1 s more before enforcement. The last one is asked to compact
   *  (`compact`): a plain one left V8 holding 143 MB of pages for 110 MB in use, since V8
   *  never shrinks its heap by itself at rest; compacted (then collected plainly, agent/gc.ts),
   *  112-118 MB, and RSS at rest 202-205 MB instead of 233-236, for 0.42-0.49 s of collection
   *  instead of 0.12-0.15 (bench:agent). */
  readonly collectGarbage?: (compact: boolean) => void;
  /** Events per compute of the first full state when collectGarbage is given (absent: one
   *  compute): the compute promotes garbage as it goes, and whether V8 collects any of it
   *  before the compute ends decided a peak of 282-289 or 311-317 MB at 100k pods; in slices
   *  of 50,000, 252-257 MB (284-290 in two starts of sixteen), for about 0.2 s more of compute. */
  readonly firstComputeSlice?: number;
  /** Events a first full state needs for those collections to run, unless it is computed in
   *  slices (default COLLECT_GARBAGE_FROM): each costs 25-50 ms even on a small heap, which a
   *  small cluster's start-up would wait for to free a few MB. */
  readonly collectGarbageFrom?: number;
}

/** At 10k objects the lists leave tens of MB; with 15, the collection before the first compute
 *  made the bundled agent's start about 25 ms longer (median of 12) for nothing. */
const COLLECT_GARBAGE_FROM = 10_000;

export interface PassOutcome {
  readonly ok: boolean;
  readonly error?: string;
  /** Policies changed since the previous attempt (compiled, or null when deleted). */
  readonly policyChanges: readonly { key: string; policy: CompiledPolicy | null }[];
  /** Whether any source event reached calc since the previous attempt (a periodic resync or a
   *  retry carries none), so reporters can skip work that depends only on the model. */
  readonly modelChanged: boolean;
}

/** Why the loop is or is not ready. Codes only: the details (payload lines, policy names,
 *  addresses in stderr) stay in the logs, never in an HTTP body. */
export type ReadyReason = 'Ready' | 'NotSynced' | 'ApplyFailed' | 'ChangesPending';

export interface Readiness {
  readonly ready: boolean;
  /** The source revision the kernel holds. */
  readonly revision: string;
  readonly reason: ReadyReason;
  /** The error code of the last failed write (ApplyFailed only). */
  readonly error?: string;
}

export type HealthReason = 'Ok' | 'NoWriteSucceeded' | 'WriteHung';

export interface Health {
  readonly healthy: boolean;
  readonly reason: HealthReason;
  /** The error code of the last failed write, if any. */
  readonly error?: string;
}

export class Reconciler {
  readonly #o: ReconcilerOptions;
  readonly #clock: Clock;
  readonly #threadCpuMs: () => number;
  readonly #pacer: Pacer;
  readonly #unhealthyAfterMs: number;
  #queue: SourceBatch<CalcEvent>[] = [];
  /** Arrival times of queued batches, then of batches taken into calc but not yet in the
   *  kernel; both bounded by MAX_UNAPPLIED. */
  #arrivals: number[] = [];
  #unapplied: number[] = [];
  /** Policy changes taken into calc since the last write attempt, for onPass. */
  #policyChanges: { key: string; policy: CompiledPolicy | null }[] = [];
  /** Whether a source event reached calc since the last report, for onPass. */
  #modelChanged = false;
  #synced = false;
  /** The first full state was large enough to collect after: once its write succeeds. */
  #collectAfterWrite = false;
  #latestRevision = '';
  #appliedRevision = '';
  #lastError: { code: string; message: string } | null = null;
  /** A resync is owed: 'full' reads every set member back, 'counts' only sizes (periodic). */
  #needResync: false | 'full' | 'counts' = 'full';
  #periodicResyncs = 0;
  #nextResyncAt: number | null = null;
  #nextHookCheckAt: number | null = null;
  /** The hook check under way: it runs beside the loop, so a change never waits for it. */
  #hookCheck: Promise<void> | null = null;
  /** When the tidy is due (null: nothing owed). */
  #nextTidyAt: number | null = null;
  /** Since when a write has been wanted without one succeeding (null: nothing owed). */
  #owedSince: number | null = null;
  #writeStartedAt: number | null = null;
  /** Addresses written out of dispatch whose tracked connections are still to be deleted,
   *  with the failed tries so far; and the deletion running beside the loop, if any. */
  readonly #toForget = new Map<string, number>();
  #forgetting: Promise<void> | null = null;
  /** When the last source batch arrived (null: none yet). */
  #lastBatchAt: number | null = null;
  #idleWaiters: (() => void)[] = [];
  #stopped = false;

  constructor(o: ReconcilerOptions) {
    this.#o = o;
    this.#clock = o.clock ?? monotonicClock;
    this.#threadCpuMs = o.threadCpuMs ?? threadCpuMs;
    this.#unhealthyAfterMs = o.unhealthyAfterMs ?? (o.resyncIntervalMs > 0 ? UNHEALTHY_AFTER_RESYNC_INTERVALS * o.resyncIntervalMs : DEFAULT_UNHEALTHY_AFTER_MS);
    this.#pacer = createPacer({
      clock: this.#clock,
      minIntervalMs: 0,
      retryMinMs: o.retryMinMs,
      retryMaxMs: o.retryMaxMs,
      run: () => this.#pass(),
      onResult: () => this.#wakeIdleWaiters(),
    });
  }

  /** Writes the fail-closed skeleton on a fresh node; the only write before the source is
   *  synced. A failure is logged and does not stop the loop: the first resync writes it all. */
  async start(): Promise<void> {
    const { calc, dataplane, log, metrics } = this.#o;
    try {
      await dataplane.guard(calc.desired); // it says itself when it wrote
    } catch (err) {
      const code = codeOf(err);
      metrics.errors.inc({ reason: code });
      log.warn({ err, code }, 'could not write the fail-closed skeleton; the first resync after the source is synced will write everything');
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#pacer.stop();
    await this.#hookCheck;
    await this.#forgetting;
  }

  onBatch(batch: SourceBatch<CalcEvent>): void {
    const now = this.#clock.now();
    this.#queue.push(batch);
    if (this.#arrivals.length < MAX_UNAPPLIED) this.#arrivals.push(now);
    this.#latestRevision = batch.revision;
    if (this.#synced || batch.synced) this.#owedSince ??= now;
    // A batch after a quiet spell is written at once: waiting would only add latency. One that
    // follows another within the debounce, or finds a write running, waits so a burst coalesces.
    const quiet = !this.#pacer.busy() && (this.#lastBatchAt === null || now - this.#lastBatchAt >= this.#o.debounceMs);
    this.#lastBatchAt = now;
    this.#pacer.poke(quiet ? 0 : this.#o.debounceMs);
  }

  /** The source has delivered its first complete view. */
  get synced(): boolean {
    return this.#synced;
  }

  readiness(): Readiness {
    const revision = this.#appliedRevision;
    if (!this.#synced) return { ready: false, revision, reason: 'NotSynced' };
    if (this.#lastError) return { ready: false, revision, reason: 'ApplyFailed', error: this.#lastError.code };
    if (this.#queue.length > 0 || revision !== this.#latestRevision) return { ready: false, revision, reason: 'ChangesPending' };
    return { ready: true, revision, reason: 'Ready' };
  }

  /** Fails when writes are owed and none has succeeded for the bound: every try failed, or one
   *  hangs. A restart is then the remedy (kubelet's liveness probe). */
  health(): Health {
    const now = this.#clock.now();
    const error = this.#lastError ? { error: this.#lastError.code } : {};
    if (this.#writeStartedAt !== null && now - this.#writeStartedAt > this.#unhealthyAfterMs) return { healthy: false, reason: 'WriteHung', ...error };
    if (this.#owedSince !== null && now - this.#owedSince > this.#unhealthyAfterMs) return { healthy: false, reason: 'NoWriteSucceeded', ...error };
    return { healthy: true, reason: 'Ok' };
  }

  /** Resolves when nothing is queued, running or waiting for a retry (tests, shutdown). */
  whenIdle(): Promise<void> {
    if (this.#isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  #isIdle(): boolean {
    return !this.#pacer.busy() && this.#hookCheck === null && this.#forgetting === null && (!this.#synced ? true : this.#queue.length === 0 && !this.#needResync);
  }

  #wakeIdleWaiters(): void {
    if (this.#isIdle()) for (const w of this.#idleWaiters.splice(0)) w();
  }

  async #pass(): Promise<'ok' | 'skipped'> {
    const batches = this.#queue.splice(0);
    for (const at of this.#arrivals.splice(0)) if (this.#unapplied.length < MAX_UNAPPLIED) this.#unapplied.push(at);
    if (batches.length > 0) this.#compute(batches);
    // Nothing is written before the source has delivered its first full view of the world.
    if (!this.#synced) return 'skipped';
    const now = this.#clock.now();
    if (this.#nextResyncAt !== null && now >= this.#nextResyncAt && !this.#needResync) {
      this.#needResync = ++this.#periodicResyncs % FULL_READ_EVERY === 0 ? 'full' : 'counts';
    }
    // The hook check (5 commands, about 70 ms at 100k pods) runs beside the loop: a change that
    // arrives meanwhile is written without waiting for it. It starts in the pass right after a
    // change's write rather than with it, unless a steady stream of changes has put it off by a
    // whole interval, so the two do not share the cores.
    const checkAt = this.#nextHookCheckAt;
    if (!this.#needResync && this.#hookCheck === null && checkAt !== null && now >= checkAt && (batches.length === 0 || now >= checkAt + (this.#o.hookCheckIntervalMs ?? 0))) {
      this.#startHookCheck();
    }
    const tidy = this.#nextTidyAt !== null && now >= this.#nextTidyAt;
    if (batches.length === 0 && !this.#needResync && !tidy) {
      this.#askForPeriodic();
      return 'skipped';
    }
    const revision = batches.length > 0 ? batches[batches.length - 1].revision : this.#latestRevision;
    return this.#write(revision, tidy);
  }

  #compute(batches: readonly SourceBatch<CalcEvent>[]): void {
    const { calc, dataplane, log, metrics } = this.#o;
    const t0 = this.#clock.now();
    const cpu0 = this.#threadCpuMs();
    let events = 0;
    // A large first full state, or one in slices (whose point is the collections between
    // them): the lists' garbage is collected first, so the compute fills the space it leaves
    // instead of new pages, and then each slice's before the next.
    const first = !this.#synced && batches.some((b) => b.synced);
    const size = first ? batches.reduce((n, b) => n + b.events.length, 0) : 0;
    const sliceSize = Math.max(1, this.#o.firstComputeSlice ?? Number.POSITIVE_INFINITY);
    const collect = first && this.#o.collectGarbage !== undefined && (size >= (this.#o.collectGarbageFrom ?? COLLECT_GARBAGE_FROM) || size > sliceSize);
    if (collect) {
      this.#collectGarbage('before the first compute', false);
      this.#collectAfterWrite = true;
    }
    const slice = collect ? sliceSize : Number.POSITIVE_INFINITY;
    for (const b of batches) {
      const n = b.events.length;
      for (const e of b.events) metrics.sourceEvents.inc({ kind: e.kind });
      // One compute even for an empty batch, as before slices.
      for (let from = 0; from === 0 || from < n; from += slice) {
        if (from > 0) this.#collectGarbage('between slices of the first compute', false);
        dataplane.markDirty(calc.applyEvents(takeEach(b.events, from, Math.min(n, from + slice))));
      }
      b.events.length = 0;
      events += n;
      if (n > 0) this.#modelChanged = true;
      if (b.synced) this.#synced = true;
    }
    const changes = calc.takePolicyChanges();
    // One at a time: a first batch of more than about 120k policies passes the engine's limit
    // on a call's arguments.
    for (const c of changes) this.#policyChanges.push(c);
    for (const { key, policy } of changes) {
      if (policy && policy.errors.length > 0) {
        metrics.errors.inc({ reason: 'WEIR_POLICY_INVALID' });
        log.warn(
          { code: 'WEIR_POLICY_INVALID', policy: key, generation: policy.generation, errors: policy.errors },
          `policy ${key} is invalid and ${INVALID_POLICY_EFFECT}: ${formatPolicyErrors(policy.errors)}`,
        );
      }
    }
    const ms = this.#clock.now() - t0;
    metrics.calcDuration.observe(ms / 1000);
    log.debug({ events, batches: batches.length, ms: round(ms), cpuMs: round(this.#threadCpuMs() - cpu0) }, 'model updated');
  }

  #startHookCheck(): void {
    this.#nextHookCheckAt = null;
    this.#hookCheck = this.#checkHook().finally(() => {
      this.#hookCheck = null;
      if (this.#stopped) return;
      // A missing hook owes a resync now; an intact one is due again an interval later.
      if (this.#needResync) this.#pacer.poke(0);
      else this.#askForPeriodic();
      this.#wakeIdleWaiters();
    });
  }

  /** Another program may delete or move the hook at any time; a resync puts it back. */
  async #checkHook(): Promise<void> {
    const { dataplane, log, metrics } = this.#o;
    const t0 = this.#clock.now();
    let intact: boolean;
    try {
      intact = await dataplane.hookIntact();
      // What the check costs beside the writes (bench:agent lists it next to slow changes).
      log.debug({ intact, ms: round(this.#clock.now() - t0) }, 'hook checked');
      if (!intact) {
        metrics.driftRepairs.inc({ what: 'hook' });
        log.warn({ what: 'hook' }, "Weir's hook was removed or moved by another program; resyncing now");
      }
    } catch (err) {
      const code = codeOf(err);
      metrics.errors.inc({ reason: code });
      log.warn({ err, code }, "could not check Weir's FORWARD hook; resyncing to be sure");
      intact = false;
    }
    const now = this.#clock.now();
    if (intact) {
      this.#nextHookCheckAt = now + (this.#o.hookCheckIntervalMs ?? 0);
    } else {
      // The resync of this same pass repairs it; its success schedules the next check.
      this.#needResync = 'full';
      this.#owedSince ??= now;
    }
  }

  #collectGarbage(when: string, compact: boolean): void {
    const collect = this.#o.collectGarbage;
    if (collect === undefined) return;
    const t0 = this.#clock.now();
    collect(compact);
    this.#o.log.debug({ ms: round(this.#clock.now() - t0) }, `collected garbage ${when}`);
  }

  async #write(revision: string, tidy: boolean): Promise<'ok'> {
    const { calc, dataplane, log, metrics } = this.#o;
    const owed = this.#needResync;
    const resync = owed !== false;
    const t0 = this.#clock.now();
    this.#owedSince ??= t0;
    this.#writeStartedAt = t0;
    let stats: unknown;
    try {
      stats = owed ? await dataplane.resync(calc.desired, { members: owed === 'counts' ? 'counts' : 'all' }) : await dataplane.apply(calc.desired, tidy ? { tidy } : undefined);
    } catch (err) {
      this.#writeStartedAt = null;
      this.#needResync = 'full'; // after a failure, trust only what the kernel says it holds
      const code = codeOf(err);
      this.#lastError = { code, message: err instanceof Error ? err.message : String(err) };
      metrics.errors.inc({ reason: code });
      metrics.applies.inc({ result: 'error' });
      const attempt = this.#pacer.failures() + 1;
      const retryInMs = backoffMs(attempt, { initialMs: this.#o.retryMinMs, maxMs: this.#o.retryMaxMs });
      log.error({ err, code, attempt, retryInMs }, 'dataplane apply failed; will retry');
      this.#report({ ok: false, error: this.#lastError.message, policyChanges: this.#policyChanges.splice(0) });
      throw err; // the pacer retries after the backoff
    }
    const now = this.#clock.now();
    this.#writeStartedAt = null;
    // A hook check that found damage while this write ran still owes its resync.
    if (this.#needResync === owed) this.#needResync = false;
    this.#lastError = null;
    this.#appliedRevision = revision;
    this.#owedSince = null;
    const { resyncIntervalMs, hookCheckIntervalMs = 0 } = this.#o;
    // A resync has just put the hook back, so the next check is an interval away; a plain
    // apply must not push a due check back, or a steady stream of changes would starve it.
    if (resync) {
      this.#nextResyncAt = resyncIntervalMs > 0 ? now + resyncIntervalMs : null;
      this.#nextHookCheckAt = hookCheckIntervalMs > 0 ? now + hookCheckIntervalMs : null;
    }
    const st = dataplane.status();
    // Pushed back by every write: a tidy waits for a quiet node.
    this.#nextTidyAt = (st.tidyPending ?? 0) > 0 ? now + (this.#o.tidyDelayMs ?? DEFAULT_TIDY_DELAY_MS) : null;
    const ms = now - t0;
    for (const at of this.#unapplied.splice(0)) metrics.enforceLatency.observe((now - at) / 1000);
    metrics.applyDuration.observe({ step: resync ? 'resync' : tidy ? 'tidy' : 'total' }, ms / 1000);
    metrics.applies.inc({ result: 'ok' });
    metrics.sets.set(st.sets);
    metrics.chains.set(st.chains);
    metrics.rules.set(st.rules);
    metrics.localPods.set(calc.localPodCount);
    const counts = calc.policyCounts();
    metrics.policies.set({ state: 'valid' }, counts.valid);
    metrics.policies.set({ state: 'invalid' }, counts.invalid);
    log.info({ resync, tidy, ms: round(ms), revision, stats, ...st }, resync ? 'resynced dataplane' : tidy ? 'tidied dataplane' : 'applied changes');
    // calc keeps what local pods gave up until a write has stopped dispatching it: the loop
    // computes only while no write runs, so that is everything computed before this write.
    for (const a of calc.takeReleasedAddresses()) this.#toForget.set(a, 0);
    this.#startForgetting();
    this.#report({ ok: true, policyChanges: this.#policyChanges.splice(0) });
    if (this.#collectAfterWrite) {
      this.#collectAfterWrite = false;
      this.#collectGarbage('after the first write', true);
    }
    this.#askForPeriodic();
    return 'ok';
  }

  /**
   * Deletes the tracked connections of addresses no rule dispatches any more, beside the loop:
   * each address costs two walks of the kernel's whole table (about 60 ms at 10k tracked flows,
   * 250-350 ms at 50k), which must not hold up the next change's write. Addresses written out
   * meanwhile go in the next round. A failure waits for the next write, FORGET_ATTEMPTS tries
   * in all, so that a broken conntrack cannot make every write retry more.
   */
  #startForgetting(): void {
    if (this.#forgetting !== null || this.#toForget.size === 0 || this.#stopped) return;
    const { dataplane, log, metrics } = this.#o;
    const addresses = [...this.#toForget.keys()];
    const t0 = this.#clock.now();
    let again = false;
    this.#forgetting = dataplane
      .forgetFlows(addresses)
      .then(
        (entries) => {
          for (const a of addresses) this.#toForget.delete(a);
          log.debug({ addresses, entries, ms: round(this.#clock.now() - t0) }, 'forgot the tracked connections of released pod addresses');
          again = true;
        },
        (err: unknown) => {
          const code = codeOf(err);
          metrics.errors.inc({ reason: code });
          const abandoned: string[] = [];
          for (const a of addresses) {
            const tries = (this.#toForget.get(a) ?? 0) + 1;
            if (tries < FORGET_ATTEMPTS) this.#toForget.set(a, tries);
            else {
              this.#toForget.delete(a);
              abandoned.push(a);
            }
          }
          if (abandoned.length > 0)
            log.error(
              { err, code, addresses: abandoned },
              `could not delete the tracked connections of released pod addresses in ${FORGET_ATTEMPTS} tries; a pod given one of them may carry on its flows`,
            );
          else log.warn({ err, code, addresses }, 'could not delete the tracked connections of released pod addresses; will retry after the next write');
        },
      )
      .finally(() => {
        this.#forgetting = null;
        if (again) this.#startForgetting();
        this.#wakeIdleWaiters();
      });
  }

  /** Asks the pacer for the next periodic pass: the resync or the hook check, whichever is due first. */
  #askForPeriodic(): void {
    const due = [this.#nextResyncAt, this.#nextHookCheckAt, this.#nextTidyAt].filter((t): t is number => t !== null);
    if (due.length > 0) this.#pacer.poke(Math.min(...due) - this.#clock.now());
  }

  #report(outcome: Omit<PassOutcome, 'modelChanged'>): void {
    const modelChanged = this.#modelChanged;
    this.#modelChanged = false;
    try {
      this.#o.onPass?.({ ...outcome, modelChanged });
    } catch (err) {
      // Reporting is a side channel: it must never turn a write into a failure.
      this.#o.log.warn({ err }, 'status reporting failed');
    }
  }
}

/** Each event of a batch, its slot emptied as calc takes it (SourceBatch hands the array over):
 *  a raw policy is garbage once compiled, and a first batch at 100k pods holds 20k of them
 *  (about 1 KB each), which need not outlive the compute. */
function* takeEach(events: CalcEvent[], from: number, to: number): Generator<CalcEvent> {
  const slots: (CalcEvent | undefined)[] = events;
  for (let i = from; i < to; i++) {
    const e = slots[i] as CalcEvent;
    slots[i] = undefined;
    yield e;
  }
}

function codeOf(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : 'UNKNOWN';
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
