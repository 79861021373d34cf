// The reconcile loop. Source batches queue up; the loop feeds them to calc only while no
// write is running (so the desired state is stable during an apply), then writes what they
// dirtied. One apply at a time; bursts coalesce; failures back off; a timer resyncs.

import type { Calculator, DesiredDataplane, Dirty } from '../calc/index.ts';
import type { CompiledPolicy } from '../model/types.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import type { CalcEvent } from '../model/types.ts';
import type { SourceBatch } from '../sources/types.ts';

/** What the loop needs from the dataplane (dataplane/ provides it). */
export interface DataplanePort {
  markDirty(d: Dirty): void;
  /** Writes what is dirty. */
  apply(desired: DesiredDataplane): Promise<unknown>;
  /** Reads the kernel back, removes own stale objects and repairs drift, then applies. */
  resync(desired: DesiredDataplane): Promise<unknown>;
  status(): { sets: number; chains: number; rules: number };
}

export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

export interface ReconcilerOptions {
  readonly calc: Calculator;
  readonly dataplane: DataplanePort;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly debounceMs: number;
  readonly retryMinMs: number;
  readonly retryMaxMs: number;
  readonly resyncIntervalMs: number;
  readonly clock?: Clock;
  /** Called after every write attempt (status reporting hangs here; it must not block). */
  readonly onPass?: (outcome: PassOutcome) => void;
}

export interface PassOutcome {
  readonly ok: boolean;
  readonly error?: string;
  /** Policies changed since the previous attempt (compiled, or null when deleted). */
  readonly policyChanges: readonly { key: string; policy: CompiledPolicy | null }[];
}

export class Reconciler {
  readonly #o: ReconcilerOptions;
  readonly #clock: Clock;
  #queue: SourceBatch<CalcEvent>[] = [];
  /** Arrival times of batches taken into calc but not yet in the kernel. */
  #unapplied: number[] = [];
  #arrivals: number[] = [];
  /** Policy changes taken into calc since the last write attempt, for onPass. */
  #policyChanges: { key: string; policy: CompiledPolicy | null }[] = [];
  #synced = false;
  #latestRevision = '';
  #appliedRevision = '';
  #lastError: string | null = null;
  #needResync = true;
  #failures = 0;
  #timer: unknown = null;
  #resyncTimer: unknown = null;
  #running: Promise<void> | null = null;
  #stopped = false;
  #idleWaiters: (() => void)[] = [];

  constructor(o: ReconcilerOptions) {
    this.#o = o;
    this.#clock = o.clock ?? systemClock;
  }

  start(): void {
    this.#armResync();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) this.#clock.clearTimeout(this.#timer);
    if (this.#resyncTimer !== null) this.#clock.clearTimeout(this.#resyncTimer);
    this.#timer = this.#resyncTimer = null;
    await this.#running;
  }

  onBatch(batch: SourceBatch<CalcEvent>): void {
    this.#queue.push(batch);
    this.#arrivals.push(this.#clock.now());
    this.#latestRevision = batch.revision;
    this.#schedule(this.#o.debounceMs);
  }

  /** The source has delivered its first complete view. */
  get synced(): boolean {
    return this.#synced;
  }

  readiness(): { ready: boolean; revision: string; reason: string } {
    const revision = this.#appliedRevision;
    if (!this.#synced) return { ready: false, revision, reason: 'waiting for the first full state from the source' };
    if (this.#lastError) return { ready: false, revision, reason: `last apply failed: ${this.#lastError}` };
    if (this.#queue.length > 0 || revision !== this.#latestRevision) return { ready: false, revision, reason: 'changes pending' };
    return { ready: true, revision, reason: 'kernel holds the latest state' };
  }

  /** Resolves when nothing is queued, scheduled or running (tests, render, shutdown). */
  whenIdle(): Promise<void> {
    if (this.#isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  #isIdle(): boolean {
    return this.#timer === null && this.#running === null && (this.#queue.length === 0 || !this.#synced);
  }

  #schedule(delayMs: number): void {
    if (this.#stopped || this.#timer !== null) return;
    this.#timer = this.#clock.setTimeout(() => {
      this.#timer = null;
      if (this.#running) return; // the running pass reschedules when it ends
      this.#running = this.#pass().finally(() => {
        this.#running = null;
        if (this.#queue.length > 0 && this.#synced) this.#schedule(0);
        if (this.#isIdle()) for (const w of this.#idleWaiters.splice(0)) w();
      });
    }, delayMs);
  }

  #armResync(): void {
    if (this.#stopped || this.#o.resyncIntervalMs <= 0) return;
    this.#resyncTimer = this.#clock.setTimeout(() => {
      this.#needResync = true;
      this.#schedule(0);
      this.#armResync();
    }, this.#o.resyncIntervalMs);
  }

  async #pass(): Promise<void> {
    const { calc, dataplane, log, metrics } = this.#o;
    const batches = this.#queue.splice(0);
    this.#unapplied.push(...this.#arrivals.splice(0));
    if (batches.length > 0) {
      const t0 = this.#clock.now();
      let events = 0;
      for (const b of batches) {
        const dirty = calc.applyEvents(b.events);
        dataplane.markDirty(dirty);
        events += b.events.length;
        for (const e of b.events) metrics.sourceEvents.inc({ kind: e.kind });
        if (b.synced) this.#synced = true;
      }
      const changes = calc.takePolicyChanges();
      this.#policyChanges.push(...changes);
      for (const { key, policy } of changes) {
        if (policy && policy.errors.length > 0) {
          metrics.errors.inc({ reason: 'WEIR_POLICY_INVALID' });
          log.warn(
            { code: 'WEIR_POLICY_INVALID', policy: key, generation: policy.generation, errors: policy.errors },
            `policy ${key} is invalid and adds no allowance; the pods it selects stay isolated: ${policy.errors.map((e) => `${e.path}: ${e.message}`).join('; ')}`,
          );
        }
      }
      metrics.calcDuration.observe((this.#clock.now() - t0) / 1000);
      log.debug({ events, batches: batches.length, ms: round(this.#clock.now() - t0) }, 'model updated');
    }
    // Nothing is written before the source has delivered its first full view of the world.
    if (!this.#synced) return;
    const revision = batches.length > 0 ? batches[batches.length - 1].revision : this.#latestRevision;
    const resync = this.#needResync;
    const t0 = this.#clock.now();
    try {
      const stats = resync ? await dataplane.resync(calc.desired) : await dataplane.apply(calc.desired);
      this.#needResync = false;
      this.#failures = 0;
      this.#lastError = null;
      this.#appliedRevision = revision;
      const ms = this.#clock.now() - t0;
      for (const at of this.#unapplied.splice(0)) metrics.enforceLatency.observe((this.#clock.now() - at) / 1000);
      metrics.applyDuration.observe({ step: resync ? 'resync' : 'total' }, ms / 1000);
      metrics.applies.inc({ result: 'ok' });
      const st = dataplane.status();
      metrics.sets.set(st.sets);
      metrics.chains.set(st.chains);
      metrics.rules.set(st.rules);
      metrics.localPods.set(calc.localPodCount);
      const reports = calc.policyReports();
      const invalid = reports.filter((r) => r.errors.length > 0).length;
      metrics.policies.set({ state: 'valid' }, reports.length - invalid);
      metrics.policies.set({ state: 'invalid' }, invalid);
      log.info({ resync, ms: round(ms), revision, stats, ...st }, resync ? 'resynced dataplane' : 'applied changes');
      this.#o.onPass?.({ ok: true, policyChanges: this.#policyChanges.splice(0) });
    } catch (err) {
      this.#failures++;
      this.#needResync = true; // after a failure, trust only what the kernel says it holds
      this.#lastError = err instanceof Error ? err.message : String(err);
      const code = (err as { code?: string }).code ?? 'UNKNOWN';
      metrics.errors.inc({ reason: code });
      metrics.applies.inc({ result: 'error' });
      const delay = Math.min(this.#o.retryMaxMs, this.#o.retryMinMs * 2 ** (this.#failures - 1));
      log.error({ err, code, attempt: this.#failures, retryInMs: delay }, 'dataplane apply failed; will retry');
      this.#o.onPass?.({ ok: false, error: this.#lastError, policyChanges: this.#policyChanges.splice(0) });
      this.#scheduleRetry(delay);
    }
  }

  #scheduleRetry(delayMs: number): void {
    if (this.#stopped) return;
    this.#timer = this.#clock.setTimeout(() => {
      this.#timer = null;
      this.#schedule(0);
    }, delayMs);
  }
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
