// The reconcile loop. Source batches queue up; the loop feeds them to calc only while no
// write is running (so the desired state is stable during an apply), then writes what they
// dirtied. Every pass runs through one pacer, the loop's only timer: bursts coalesce, failures
// back off however many batches arrive, and the periodic resync and hook check are requests to
// that same pacer, so stop() cancels everything at once. The side jobs have modules of their
// own: health.ts (the probes), hook-watch.ts, flow-cleanup.ts, connection-cut.ts,
// first-compute-collections.ts and loop-metrics.ts.

import { backoffMs } from '../backoff.ts';
import type { Calculator, DesiredDataplane, Dirty } from '../calc/index.ts';
import { type Clock, monotonicClock } from '../clock.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { formatPolicyErrors, INVALID_CLUSTER_POLICY_EFFECT, INVALID_POLICY_EFFECT } from '../model/policy-errors.ts';
import type { CalcEvent, CompiledPolicy } from '../model/types.ts';
import { createPacer, type Pacer } from '../pacer.ts';
import type { SourceBatch } from '../sources/types.ts';
import { ConnectionCut, type ConnectionCutOptions } from './connection-cut.ts';
import { FirstComputeCollections } from './first-compute-collections.ts';
import { FlowCleanup, type FlowForgetter } from './flow-cleanup.ts';
import { type Health, type Readiness, unhealthyAfterMs, WriteHealth } from './health.ts';
import { type HookReader, HookWatch } from './hook-watch.ts';
import { codeOf, round } from './log-fields.ts';
import { LoopMetrics } from './loop-metrics.ts';

export type { Clock } from '../clock.ts';
export { FORGET_ATTEMPTS } from './flow-cleanup.ts';
export { DEFAULT_UNHEALTHY_AFTER_MS, type Health, type HealthReason, type Readiness, type ReadyReason, UNHEALTHY_AFTER_RESYNC_INTERVALS } from './health.ts';
export { MAX_UNAPPLIED } from './loop-metrics.ts';

/** What the loop needs from the dataplane (dataplane/ provides it). */
export interface DataplanePort extends HookReader, FlowForgetter {
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

/** How long the node must be quiet before the loop tidies what layered writes left: the tidy
 *  deletes rules, which costs a grace period that a change arriving meanwhile would wait for. */
export const DEFAULT_TIDY_DELAY_MS = 1_000;
/** Every this many periodic resyncs, one reads every set member back; the others read set
 *  sizes only, since on a large node a full read holds up the loop (docs/design/agent.md). */
export const FULL_READ_EVERY = 10;

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
   *  first full state is computed, between its slices, and after it is written, compacting:
   *  a lower peak and less memory at rest (first-compute-collections.ts). */
  readonly collectGarbage?: (compact: boolean) => void;
  /** Events per compute of the first full state when collectGarbage is given (absent: one
   *  compute): the collections between slices keep the compute's garbage from piling up. */
  readonly firstComputeSlice?: number;
  /** Events a first full state needs for those collections to run, unless it is computed in
   *  slices (default COLLECT_GARBAGE_FROM). */
  readonly collectGarbageFrom?: number;
  /** The opt-in cut of connections the rules written deny (connection-cut.ts); absent: none. */
  readonly cut?: Pick<ConnectionCutOptions, 'dataplane' | 'targets' | 'judge'>;
}

export interface PassOutcome {
  readonly ok: boolean;
  readonly error?: string;
  /** Policies changed since the previous attempt (compiled, or null when deleted). */
  readonly policyChanges: readonly { key: string; policy: CompiledPolicy | null }[];
  /** Whether any source event reached calc since the previous attempt (a periodic resync or a
   *  retry carries none), so reporters can skip work that depends only on the model. */
  readonly modelChanged: boolean;
}

export class Reconciler {
  readonly #o: ReconcilerOptions;
  readonly #clock: Clock;
  readonly #threadCpuMs: () => number;
  readonly #pacer: Pacer;
  readonly #health: WriteHealth;
  readonly #hooks: HookWatch;
  readonly #flows: FlowCleanup;
  readonly #cut: ConnectionCut | undefined;
  readonly #collections: FirstComputeCollections;
  readonly #metrics: LoopMetrics;
  #queue: SourceBatch<CalcEvent>[] = [];
  /** Policy changes taken into calc since the last write attempt, for onPass. */
  #policyChanges: { key: string; policy: CompiledPolicy | null }[] = [];
  /** Whether a source event reached calc since the last report, for onPass. */
  #modelChanged = false;
  #synced = false;
  /** Model changes computed and not yet followed by a successful write: the cut judges again
   *  after that write (a resync or tidy alone changes no rule). */
  #cutOwed = false;
  #latestRevision = '';
  #appliedRevision = '';
  /** A resync is owed: 'full' reads every set member back, 'counts' only sizes (periodic). */
  #needResync: false | 'full' | 'counts' = 'full';
  #periodicResyncs = 0;
  #nextResyncAt: number | null = null;
  /** When the tidy is due (null: nothing owed). */
  #nextTidyAt: number | null = null;
  /** When the last source batch arrived (null: none yet). */
  #lastBatchAt: number | null = null;
  #idleWaiters: (() => void)[] = [];
  #stopped = false;

  constructor(o: ReconcilerOptions) {
    this.#o = o;
    const clock = o.clock ?? monotonicClock;
    this.#clock = clock;
    this.#threadCpuMs = o.threadCpuMs ?? threadCpuMs;
    this.#health = new WriteHealth(unhealthyAfterMs(o.resyncIntervalMs, o.unhealthyAfterMs));
    this.#metrics = new LoopMetrics(o.metrics);
    const { dataplane, log, metrics } = o;
    this.#hooks = new HookWatch({
      dataplane,
      log,
      metrics,
      clock,
      intervalMs: o.hookCheckIntervalMs ?? 0,
      onDamage: (now) => {
        // The resync of this same pass repairs it.
        this.#needResync = 'full';
        this.#health.owe(now);
      },
      onEnded: () => {
        if (this.#stopped) return;
        // A missing hook owes a resync now; an intact one is due again an interval later.
        if (this.#needResync) this.#pacer.poke(0);
        else this.#askForPeriodic();
        this.#wakeIdleWaiters();
      },
    });
    this.#flows = new FlowCleanup({ dataplane, log, metrics, clock, onEnded: () => this.#wakeIdleWaiters() });
    this.#cut = o.cut && new ConnectionCut({ ...o.cut, log, metrics, clock, onEnded: () => this.#wakeIdleWaiters() });
    this.#collections = new FirstComputeCollections({ collectGarbage: o.collectGarbage, firstComputeSlice: o.firstComputeSlice, collectGarbageFrom: o.collectGarbageFrom, log, clock });
    this.#pacer = createPacer({
      clock,
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
    this.#flows.stop();
    this.#cut?.stop();
    await this.#pacer.stop();
    await this.#hooks.whenDone();
    await this.#flows.whenDone();
    await this.#cut?.whenDone();
  }

  onBatch(batch: SourceBatch<CalcEvent>): void {
    const now = this.#clock.now();
    this.#queue.push(batch);
    this.#metrics.arrived(now);
    this.#latestRevision = batch.revision;
    if (this.#synced || batch.synced) this.#health.owe(now);
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
    return this.#health.readiness({ synced: this.#synced, revision, pending: this.#queue.length > 0 || revision !== this.#latestRevision });
  }

  /** Fails when writes are owed and none has succeeded for the bound: every try failed, or one
   *  hangs. A restart is then the remedy (kubelet's liveness probe). */
  health(): Health {
    return this.#health.health(this.#clock.now());
  }

  /** Resolves when nothing is queued, running or waiting for a retry (tests, shutdown). */
  whenIdle(): Promise<void> {
    if (this.#isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  #isIdle(): boolean {
    return !this.#pacer.busy() && !this.#hooks.running && !this.#flows.running && !this.#cut?.running && (!this.#synced ? true : this.#queue.length === 0 && !this.#needResync);
  }

  #wakeIdleWaiters(): void {
    if (this.#isIdle()) for (const w of this.#idleWaiters.splice(0)) w();
  }

  async #pass(): Promise<'ok' | 'skipped'> {
    const batches = this.#queue.splice(0);
    this.#metrics.taken();
    if (batches.length > 0) this.#compute(batches);
    // Nothing is written before the source has delivered its first full view of the world.
    if (!this.#synced) return 'skipped';
    const now = this.#clock.now();
    if (this.#nextResyncAt !== null && now >= this.#nextResyncAt && !this.#needResync) {
      this.#needResync = ++this.#periodicResyncs % FULL_READ_EVERY === 0 ? 'full' : 'counts';
    }
    // An owed resync repairs the hook anyway; otherwise a due check starts beside this pass.
    if (!this.#needResync) this.#hooks.startIfDue(now, batches.length > 0);
    const tidy = this.#nextTidyAt !== null && now >= this.#nextTidyAt;
    if (batches.length === 0 && !this.#needResync && !tidy) {
      this.#askForPeriodic();
      return 'skipped';
    }
    const revision = batches.length > 0 ? batches[batches.length - 1].revision : this.#latestRevision;
    return this.#write(revision, tidy);
  }

  #compute(batches: readonly SourceBatch<CalcEvent>[]): void {
    const { calc, dataplane, log } = this.#o;
    const t0 = this.#clock.now();
    const cpu0 = this.#threadCpuMs();
    let events = 0;
    const first = !this.#synced && batches.some((b) => b.synced);
    const slice = first ? this.#collections.beforeFirstCompute(batches.reduce((n, b) => n + b.events.length, 0)) : Number.POSITIVE_INFINITY;
    for (const b of batches) {
      const n = b.events.length;
      this.#metrics.sourceEvents(b.events);
      // One compute even for an empty batch, as before slices.
      for (let from = 0; from === 0 || from < n; from += slice) {
        if (from > 0) this.#collections.betweenSlices();
        dataplane.markDirty(calc.applyEvents(takeEach(b.events, from, Math.min(n, from + slice))));
      }
      b.events.length = 0;
      events += n;
      if (n > 0) this.#modelChanged = this.#cutOwed = true;
      if (b.synced) this.#synced = true;
    }
    this.#takePolicyChanges();
    const ms = this.#clock.now() - t0;
    this.#metrics.computed(ms);
    log.debug({ events, batches: batches.length, ms: round(ms), cpuMs: round(this.#threadCpuMs() - cpu0) }, 'model updated');
  }

  /** Keeps calc's policy changes for the next report, and logs each invalid one. */
  #takePolicyChanges(): void {
    const { calc, log } = this.#o;
    const changes = calc.takePolicyChanges();
    // One at a time: spreading a very large first batch would pass the engine's limit on a
    // call's arguments.
    for (const c of changes) this.#policyChanges.push(c);
    for (const { key, policy } of changes) {
      if (policy && policy.errors.length > 0) {
        this.#metrics.invalidPolicy();
        log.warn(
          { code: 'WEIR_POLICY_INVALID', policy: key, generation: policy.generation, errors: policy.errors },
          `policy ${key} is invalid and ${INVALID_POLICY_EFFECT}: ${formatPolicyErrors(policy.errors)}`,
        );
      }
    }
    for (const { name, policy } of calc.takeClusterPolicyChanges()) {
      if (!policy || policy.errors.length === 0) continue;
      this.#metrics.invalidPolicy();
      log.warn(
        { code: 'WEIR_POLICY_INVALID', clusterNetworkPolicy: name, generation: policy.generation, errors: policy.errors },
        `ClusterNetworkPolicy ${name} is invalid and ${INVALID_CLUSTER_POLICY_EFFECT}: ${formatPolicyErrors(policy.errors)}`,
      );
    }
  }

  async #write(revision: string, tidy: boolean): Promise<'ok'> {
    const { calc, dataplane, log } = this.#o;
    const owed = this.#needResync;
    const resync = owed !== false;
    const t0 = this.#clock.now();
    this.#health.started(t0);
    let stats: unknown;
    try {
      stats = owed ? await dataplane.resync(calc.desired, { members: owed === 'counts' ? 'counts' : 'all' }) : await dataplane.apply(calc.desired, tidy ? { tidy } : undefined);
    } catch (err) {
      this.#needResync = 'full'; // after a failure, trust only what the kernel says it holds
      const code = codeOf(err);
      const message = err instanceof Error ? err.message : String(err);
      this.#health.failed({ code, message });
      this.#metrics.writeFailed(code);
      const attempt = this.#pacer.failures() + 1;
      const retryInMs = backoffMs(attempt, { initialMs: this.#o.retryMinMs, maxMs: this.#o.retryMaxMs });
      log.error({ err, code, attempt, retryInMs }, 'dataplane apply failed; will retry');
      this.#report({ ok: false, error: message, policyChanges: this.#policyChanges.splice(0) });
      throw err; // the pacer retries after the backoff
    }
    const now = this.#clock.now();
    // A hook check that found damage while this write ran still owes its resync.
    if (this.#needResync === owed) this.#needResync = false;
    this.#health.succeeded();
    this.#appliedRevision = revision;
    const { resyncIntervalMs } = this.#o;
    // A resync has just put the hook back, so the next check is an interval away; a plain
    // apply must not push a due check back, or a steady stream of changes would starve it.
    if (resync) {
      this.#nextResyncAt = resyncIntervalMs > 0 ? now + resyncIntervalMs : null;
      this.#hooks.rearm(now);
    }
    const st = dataplane.status();
    // Pushed back by every write: a tidy waits for a quiet node.
    this.#nextTidyAt = (st.tidyPending ?? 0) > 0 ? now + (this.#o.tidyDelayMs ?? DEFAULT_TIDY_DELAY_MS) : null;
    const ms = now - t0;
    this.#metrics.written(now, resync ? 'resync' : tidy ? 'tidy' : 'total', ms, { ...st, localPods: calc.localPodCount, policies: calc.policyCounts() });
    log.info({ resync, tidy, ms: round(ms), revision, stats, ...st }, resync ? 'resynced dataplane' : tidy ? 'tidied dataplane' : 'applied changes');
    // calc keeps what local pods gave up until a write has stopped dispatching it: the loop
    // computes only while no write runs, so that is everything computed before this write.
    this.#flows.add(calc.takeReleasedAddresses());
    this.#flows.start();
    if (this.#cutOwed) this.#cut?.request();
    this.#cutOwed = false;
    this.#report({ ok: true, policyChanges: this.#policyChanges.splice(0) });
    this.#collections.afterWrite();
    this.#askForPeriodic();
    return 'ok';
  }

  /** Asks the pacer for the next periodic pass: the resync, the hook check or the tidy, whichever is due first. */
  #askForPeriodic(): void {
    const due = [this.#nextResyncAt, this.#hooks.dueAt, this.#nextTidyAt].filter((t): t is number => t !== null);
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
 *  a raw policy is garbage once compiled, and need not outlive the compute. */
function* takeEach(events: CalcEvent[], from: number, to: number): Generator<CalcEvent> {
  const slots: (CalcEvent | undefined)[] = events;
  for (let i = from; i < to; i++) {
    const e = slots[i] as CalcEvent;
    slots[i] = undefined;
    yield e;
  }
}
