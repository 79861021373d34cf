// The loop's test bench, shared by the reconciler's tests and its side jobs' (health, hook
// watch, flow cleanup, first-compute collections, loop metrics): a fake clock, a fake dataplane
// and a Reconciler wired to them. The clock is test/support/fake-clock.ts's.

import type { DesiredDataplane, Dirty } from '../../../src/calc/index.ts';
import { type DataplanePort, Reconciler, type ReconcilerOptions } from '../../../src/agent/reconciler.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics, type Metrics } from '../../../src/metrics/index.ts';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { newCalc, policy } from '../calc/fixtures.ts';

export type Call = { kind: 'apply' | 'tidy' | 'resync' | 'hookIntact' | 'guard'; at: number };

/** The dataplane seen by the loop: writes take `writeMs` of fake time and fail, hang or
 *  succeed as the test says; the hook is intact until the test removes it, and a resync puts
 *  it back. */
export class FakeDataplane implements DataplanePort {
  calls: Call[] = [];
  failWrites = 0;
  failWith: () => Error = () => new Error('iptables-restore: line 3 failed');
  writeMs = 0;
  hang = false;
  hook: boolean | 'throw' = true;
  /** Fake time a hook check takes (the real one reads the kernel, beside the loop). */
  hookMs = 0;
  hookChecksDone: number[] = [];
  guardDoes: boolean | 'throw' = false;
  /** Each plain apply leaves work for a tidy, as a layered write on nf_tables does. */
  layers = false;
  tidyPending = 0;
  readonly #clock: FakeClock;
  constructor(clock: FakeClock) {
    this.#clock = clock;
  }
  markDirty(_d: Dirty) {}
  apply(_d: DesiredDataplane, opts?: { tidy?: boolean }) {
    return this.#write(opts?.tidy ? 'tidy' : 'apply');
  }
  /** The members option of each resync, in order. */
  resyncReads: string[] = [];
  resync(_d: DesiredDataplane, opts?: { members?: string }) {
    this.resyncReads.push(opts?.members ?? 'all');
    return this.#write('resync');
  }
  status() {
    return { sets: 0, chains: 0, rules: 0, tidyPending: this.tidyPending };
  }
  async hookIntact() {
    this.calls.push({ kind: 'hookIntact', at: this.#clock.t });
    if (this.hookMs > 0) await new Promise<void>((resolve) => this.#clock.setTimeout(resolve, this.hookMs));
    this.hookChecksDone.push(this.#clock.t);
    if (this.hook === 'throw') throw new Error('iptables-save: boom');
    return this.hook;
  }
  async guard(_d: DesiredDataplane) {
    this.calls.push({ kind: 'guard', at: this.#clock.t });
    if (this.guardDoes === 'throw') throw new Error('iptables-restore: cannot write the skeleton');
    return this.guardDoes;
  }
  /** The addresses of each forgetFlows call, and how many calls fail first. */
  forgotten: string[][] = [];
  failForgets = 0;
  /** Fake time a deletion takes (the real one walks the kernel's table twice per address). */
  forgetMs = 0;
  async forgetFlows(addresses: readonly string[]) {
    if (this.forgetMs > 0) await new Promise<void>((resolve) => this.#clock.setTimeout(resolve, this.forgetMs));
    if (this.failForgets > 0) {
      this.failForgets--;
      throw new Error('conntrack: Operation not permitted');
    }
    this.forgotten.push([...addresses]);
    return addresses.length;
  }
  writes(kind?: 'apply' | 'tidy' | 'resync') {
    return this.calls.filter((c) => (kind ? c.kind === kind : c.kind === 'apply' || c.kind === 'tidy' || c.kind === 'resync'));
  }
  async #write(kind: 'apply' | 'tidy' | 'resync') {
    this.calls.push({ kind, at: this.#clock.t });
    if (this.hang) return new Promise<never>(() => {});
    if (this.writeMs > 0) await new Promise<void>((resolve) => this.#clock.setTimeout(resolve, this.writeMs));
    if (this.failWrites > 0) {
      this.failWrites--;
      throw this.failWith();
    }
    if (kind === 'resync' && this.hook === false) this.hook = true;
    this.tidyPending = kind === 'apply' && this.layers ? this.tidyPending + 1 : 0;
    return {};
  }
}

export function setup(o: Partial<ReconcilerOptions> = {}) {
  const clock = new FakeClock();
  const dataplane = new FakeDataplane(clock);
  const metrics = createMetrics({ defaultMetrics: false });
  const r = new Reconciler({
    calc: newCalc(),
    dataplane,
    log: silentLogger(),
    metrics,
    debounceMs: 20,
    retryMinMs: 100,
    retryMaxMs: 400,
    resyncIntervalMs: 0,
    clock,
    ...o,
  });
  return { clock, dataplane, metrics, r };
}

export const batch = (revision: string, synced = true, name = revision): SourceBatch => ({
  events: [{ kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', name, { podSelector: {} }) }],
  synced,
  revision,
});

/** A calc that notes each compute in `order`, beside what else a test notes there. */
export function recordingComputes(order: string[]) {
  const calc = newCalc();
  const applyEvents = calc.applyEvents.bind(calc);
  calc.applyEvents = (events) => {
    order.push('compute');
    return applyEvents(events);
  };
  return calc;
}

/** Notes each resync (every first write is one) of the dataplane in `order`. */
export function recordResyncs(dataplane: FakeDataplane, order: string[]): void {
  const resync = dataplane.resync.bind(dataplane);
  dataplane.resync = (d, o) => {
    order.push('write');
    return resync(d, o);
  };
}

export async function counterValue(m: Metrics, name: 'driftRepairs' | 'errors' | 'connectionsCut', labels: Record<string, string>): Promise<number> {
  const got = await m[name].get();
  return got.values.find((v) => Object.entries(labels).every(([k, x]) => (v.labels as Record<string, unknown>)[k] === x))?.value ?? 0;
}

/** stop() waits for a running write, which in these tests waits for fake time. */
export async function stopWhileAdvancing(clock: FakeClock, r: Reconciler): Promise<void> {
  let stopped = false;
  const p = r.stop().then(() => (stopped = true));
  for (let i = 0; i < 100 && !stopped; i++) await clock.advanceAsync(10);
  await p;
}
