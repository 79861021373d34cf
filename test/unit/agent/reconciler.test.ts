import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { FORGET_ATTEMPTS, FULL_READ_EVERY, MAX_UNAPPLIED, Reconciler, type Clock, type DataplanePort, type ReconcilerOptions } from '../../../src/agent/reconciler.ts';
import type { DesiredDataplane, Dirty } from '../../../src/calc/index.ts';
import { RestoreError } from '../../../src/errors.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics, type Metrics } from '../../../src/metrics/index.ts';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { diff, EMPTY, Mirror, newCalc, pod, policy, snapshot, world } from '../calc/fixtures.ts';
import { pino } from 'pino';

/** A clock whose timers run only when the test advances time. */
class FakeClock implements Clock {
  t = 0;
  timers: { at: number; fn: () => void; id: number }[] = [];
  #id = 0;
  now() {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number) {
    const id = ++this.#id;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  }
  clearTimeout(h: unknown) {
    this.timers = this.timers.filter((x) => x.id !== h);
  }
  pending() {
    return this.timers.length;
  }
  /** Advances time, running due timers in order and letting the work they start settle. */
  async advance(ms: number) {
    const end = this.t + ms;
    await settle();
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at || a.id - b.id);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.timers.shift();
      this.t = next.at;
      next.fn();
      await settle();
    }
    this.t = end;
  }
}

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

type Call = { kind: 'apply' | 'tidy' | 'resync' | 'hookIntact' | 'guard'; at: number };

/** The dataplane seen by the loop: writes take `writeMs` of fake time and fail, hang or
 *  succeed as the test says; the hook is intact until the test removes it, and a resync puts
 *  it back. */
class FakeDataplane implements DataplanePort {
  calls: Call[] = [];
  failWrites = 0;
  failWith: () => Error = () => new Error('iptables-restore: line 3 failed');
  writeMs = 0;
  hang = false;
  hook: boolean | 'throw' = true;
  /** Fake time a hook check takes (the real one reads the kernel: about 70 ms at 100k pods). */
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

function setup(o: Partial<ReconcilerOptions> = {}) {
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

const batch = (revision: string, synced = true, name = revision): SourceBatch => ({
  events: [{ kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', name, { podSelector: {} }) }],
  synced,
  revision,
});

/** A calc that notes each compute in `order`, beside what else a test notes there. */
function recordingComputes(order: string[]) {
  const calc = newCalc();
  const applyEvents = calc.applyEvents.bind(calc);
  calc.applyEvents = (events) => {
    order.push('compute');
    return applyEvents(events);
  };
  return calc;
}

/** Notes each resync (every first write is one) of the dataplane in `order`. */
function recordResyncs(dataplane: FakeDataplane, order: string[]): void {
  const resync = dataplane.resync.bind(dataplane);
  dataplane.resync = (d, o) => {
    order.push('write');
    return resync(d, o);
  };
}

async function counterValue(m: Metrics, name: 'driftRepairs' | 'errors', labels: Record<string, string>): Promise<number> {
  const got = await m[name].get();
  return got.values.find((v) => Object.entries(labels).every(([k, x]) => (v.labels as Record<string, unknown>)[k] === x))?.value ?? 0;
}

describe('reconcile loop', () => {
  test("a compute is logged with the loop thread's CPU time beside its wall time", async () => {
    const lines: { msg: string; ms?: number; cpuMs?: number }[] = [];
    let cpu = 10;
    const { clock, r } = setup({
      log: pino({ level: 'debug' }, { write: (l: string) => void lines.push(JSON.parse(l)) }),
      // Each read moves 2.5 ms on: the compute reads it once before and once after.
      threadCpuMs: () => (cpu += 2.5),
    });
    r.onBatch(batch('r1'));
    await clock.advance(100);
    const computed = lines.filter((l) => l.msg === 'model updated');
    assert.equal(computed.length, 1);
    assert.equal(computed[0].cpuMs, 2.5);
    assert.equal(computed[0].ms, 0, 'the fake clock did not move');
  });

  test('a batch lets go of each event as calc takes it, so compiled raw policies need not stay alive through the compute', async () => {
    const calc = newCalc();
    const events = ['a', 'b', 'c'].map((name) => ({ kind: 'NetworkPolicy' as const, op: 'upsert' as const, object: policy('ns', name, { podSelector: {} }) }));
    const b: SourceBatch = { events: [...events], synced: true, revision: 'r1' };
    const held: number[] = [];
    const applyEvents = calc.applyEvents.bind(calc);
    calc.applyEvents = (taken) =>
      applyEvents(
        (function* () {
          for (const e of taken) {
            yield e;
            held.push(b.events.filter((x) => x !== undefined).length);
          }
        })(),
      );
    const { clock, metrics, r } = setup({ calc });
    r.onBatch(b);
    await clock.advance(100);
    assert.deepEqual(held, [2, 1, 0], 'events still held by the batch after each one was taken');
    assert.equal(b.events.length, 0);
    assert.equal(calc.cluster.policies.size, 3);
    assert.equal((await metrics.sourceEvents.get()).values.find((v) => v.labels.kind === 'NetworkPolicy')?.value, 3);
  });

  test('a first batch of 500k policies is computed and written (no call passes the engine limit on arguments)', async () => {
    const lines: { level: number; msg: string }[] = [];
    const calc = newCalc();
    // Compiling 500k policies takes seconds: the report calc gives after them is what matters.
    calc.takePolicyChanges = () => Array.from({ length: 500_000 }, (_, i) => ({ key: `ns/p${i}`, policy: null }));
    const { clock, dataplane, r } = setup({ calc, log: pino({ level: 'debug' }, { write: (l: string) => void lines.push(JSON.parse(l)) }) });
    r.onBatch(batch('r1'));
    await clock.advance(100);
    assert.deepEqual(
      lines.filter((l) => l.level >= 40).map((l) => l.msg),
      [],
    );
    assert.equal(lines.filter((l) => l.msg === 'model updated').length, 1);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync'],
    );
  });

  test('a full garbage collection runs before a large first full state is computed, a compacting one after its first successful write, never again', async () => {
    const order: string[] = [];
    const calc = recordingComputes(order);
    const { clock, dataplane, r } = setup({ calc, collectGarbage: (compact) => order.push(compact ? 'gc compact' : 'gc'), collectGarbageFrom: 1 });
    recordResyncs(dataplane, order);
    dataplane.failWrites = 1;
    r.onBatch(batch('r1', false));
    await clock.advance(100);
    r.onBatch(batch('r2'));
    await clock.advance(1000);
    r.onBatch(batch('r3'));
    await clock.advance(1000);
    assert.deepEqual(order, ['compute', 'gc', 'compute', 'write', 'write', 'gc compact', 'compute']);
  });

  test('a small first full state is computed and written without a collection', async () => {
    const order: string[] = [];
    const calc = recordingComputes(order);
    const { clock, dataplane, r } = setup({ calc, collectGarbage: () => order.push('gc') });
    recordResyncs(dataplane, order);
    r.onBatch(batch('r1'));
    await clock.advance(1000);
    assert.deepEqual(order, ['compute', 'write']);
  });

  test('the first full state is computed in slices with a full collection between them, to the dirty state one compute gives', async () => {
    const w = world(
      [pod('ns', 'a', { labels: { app: 'a' } }), pod('ns', 'b', { ip4: 2, labels: { app: 'b' } }), pod('ns', 'c', { ip4: 3, nodeName: 'node-b' })],
      [{ name: 'ns', labels: {} }],
      [policy('ns', 'p', { podSelector: { matchLabels: { app: 'a' } }, ingress: [{ from: [{ podSelector: {} }] }] })],
    );
    const events = diff(EMPTY, w);
    assert.equal(events.length, 5);
    const order: string[] = [];
    const calc = recordingComputes(order);
    const { clock, dataplane, r } = setup({ calc, collectGarbage: (compact) => order.push(compact ? 'gc compact' : 'gc'), firstComputeSlice: 2 });
    // What the real dataplane is told, kept only through dirty reports.
    const mirror = new Mirror();
    dataplane.markDirty = (d) => mirror.update(calc.desired, d);
    r.onBatch({ events: [...events], synced: true, revision: 'r1' });
    await clock.advance(1000);
    r.onBatch(batch('r2'));
    await clock.advance(1000);
    assert.deepEqual(order, ['gc', 'compute', 'gc', 'compute', 'gc', 'compute', 'gc compact', 'compute'], 'slices of 2, 2 and 1 events; later batches whole');
    const one = newCalc();
    one.applyEvents(events);
    one.applyEvents(batch('r2').events);
    assert.equal(snapshot(mirror.view(one.desired.topChain)), snapshot(one.desired));
  });

  test('writes nothing before the source has delivered its first full state', async () => {
    const { clock, dataplane, r } = setup();
    r.onBatch(batch('r1', false));
    await clock.advance(1000);
    assert.deepEqual(dataplane.writes(), []);
    assert.equal(r.readiness().ready, false);
    assert.equal(r.readiness().reason, 'NotSynced');
    r.onBatch(batch('r2', true));
    await clock.advance(1000);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync'],
      'the first write reads the kernel back',
    );
    assert.deepEqual(r.readiness(), { ready: true, revision: 'r2', reason: 'Ready' });
  });

  test('a burst inside the debounce window becomes one write', async () => {
    const { clock, dataplane, r } = setup();
    r.onBatch(batch('r1'));
    await clock.advance(100);
    for (let i = 0; i < 10; i++) r.onBatch(batch(`b${i}`));
    await clock.advance(100);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'apply'],
    );
    assert.equal(r.readiness().revision, 'b9');
  });

  test('a batch after a quiet spell is written at once; batches right after it, or during a write, wait and coalesce', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.writeMs = 30;
    r.onBatch(batch('r1'));
    await clock.advance(0);
    assert.deepEqual(
      dataplane.writes().map((c) => c.at),
      [0],
      'no debounce on the first batch',
    );
    for (const t of [5, 10, 15]) {
      await clock.advance(t - clock.t);
      r.onBatch(batch(`b${t}`));
    }
    await clock.advance(200);
    assert.deepEqual(
      dataplane.writes().map((c) => c.at),
      [0, 30],
      'the three batches during the first write are one write, when it ends (20 ms after the first of them had passed)',
    );
    assert.equal(r.readiness().revision, 'b15');
    await clock.advance(1000 - clock.t);
    r.onBatch(batch('late'));
    await clock.advance(0);
    assert.deepEqual(dataplane.writes().at(-1)?.at, 1000, 'quiet again: at once');
  });

  test('what a layered write left is tidied once the node has been quiet for tidyDelayMs; each change pushes the tidy back', async () => {
    const { clock, dataplane, metrics, r } = setup({ tidyDelayMs: 500 });
    dataplane.layers = true;
    r.onBatch(batch('r1'));
    await clock.advance(100);
    r.onBatch(batch('r2', true, 'p2'));
    await clock.advance(0);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'apply'],
    );
    await clock.advance(400);
    r.onBatch(batch('r3', true, 'p3'));
    await clock.advance(0);
    await clock.advance(499);
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'apply', 'apply'],
      'no tidy within 500 ms of a write',
    );
    await clock.advance(1);
    assert.deepEqual(
      dataplane.writes().map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['apply', 100],
        ['apply', 500],
        ['tidy', 1000],
      ],
    );
    assert.equal(dataplane.tidyPending, 0);
    const counts = (await metrics.applyDuration.get()).values.filter((v) => v.metricName === 'weir_dataplane_apply_duration_seconds_count');
    assert.deepEqual(Object.fromEntries(counts.map((v) => [v.labels.step, v.value])), { resync: 1, total: 2, tidy: 1 }, 'the tidy is timed apart from changes');
    await clock.advance(5000);
    assert.equal(dataplane.writes().length, 4, 'nothing owed: no more writes');
    assert.deepEqual(r.readiness(), { ready: true, revision: 'r3', reason: 'Ready' });
  });

  test(`periodic resyncs read set sizes only, but every ${FULL_READ_EVERY}th reads every member; a resync after a failure reads all`, async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advance(0);
    await clock.advance(FULL_READ_EVERY * 1000);
    assert.deepEqual(dataplane.resyncReads, ['all', ...Array(FULL_READ_EVERY - 1).fill('counts'), 'all']);
    dataplane.failWrites = 1;
    r.onBatch(batch('r2', true, 'p2'));
    await clock.advance(0);
    await clock.advance(100);
    assert.deepEqual(dataplane.resyncReads.slice(-1), ['all'], 'the retry after the failed write');
    await stopWhileAdvancing(clock, r);
  });

  test('a failed write is retried with doubling backoff, as a resync, and readiness says why', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.failWrites = 3;
    r.onBatch(batch('r1'));
    await clock.advance(0);
    assert.equal(dataplane.writes().length, 1, 'a batch after a quiet spell is written at once');
    assert.deepEqual(r.readiness(), { ready: false, revision: '', reason: 'ApplyFailed', error: 'UNKNOWN' });
    await clock.advance(99);
    assert.equal(dataplane.writes().length, 1, 'not before the first backoff of 100 ms');
    await clock.advance(1);
    assert.equal(dataplane.writes().length, 2);
    await clock.advance(200);
    assert.equal(dataplane.writes().length, 3, 'second backoff 200 ms');
    await clock.advance(400);
    assert.equal(dataplane.writes().length, 4, 'capped at 400 ms');
    assert.deepEqual(
      dataplane.writes().map((c) => c.kind),
      ['resync', 'resync', 'resync', 'resync'],
    );
    assert.equal(r.readiness().ready, true);
  });

  test('the periodic resync reads the kernel back', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advance(2000);
    assert.deepEqual(
      dataplane.writes().map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['resync', 1000],
        ['resync', 2000],
      ],
    );
    await r.stop();
  });

  test("a local pod's released addresses have their tracked flows deleted after the write that stops dispatching them; a failure retries after the next write", async () => {
    const { clock, dataplane, r } = setup();
    const gone = pod('ns', 'gone', { ip4: 5 });
    const podBatch = (revision: string, events: SourceBatch['events']): SourceBatch => ({ events, synced: true, revision });
    r.onBatch(podBatch('r1', [{ kind: 'Pod', op: 'upsert', object: gone }]));
    await clock.advance(100);
    assert.deepEqual(dataplane.forgotten, [], 'a new pod releases nothing');
    const order: string[] = [];
    for (const step of ['apply', 'forgetFlows'] as const) {
      const real = dataplane[step].bind(dataplane) as (...a: unknown[]) => Promise<unknown>;
      (dataplane as unknown as Record<string, unknown>)[step] = (...a: unknown[]) => {
        order.push(step);
        return real(...a);
      };
    }
    dataplane.failForgets = 1;
    r.onBatch(podBatch('r2', [{ kind: 'Pod', op: 'delete', uid: gone.uid }]));
    await clock.advance(100);
    assert.deepEqual(dataplane.forgotten, [], 'the first attempt failed');
    r.onBatch(batch('r3'));
    await clock.advance(100);
    assert.deepEqual(order, ['apply', 'forgetFlows', 'apply', 'forgetFlows'], 'each attempt follows a write');
    assert.deepEqual(dataplane.forgotten, [['10.244.1.5', 'fd00::5']]);
    // A conntrack that keeps failing is given up on after FORGET_ATTEMPTS writes.
    order.length = 0;
    dataplane.failForgets = FORGET_ATTEMPTS + 1;
    r.onBatch(podBatch('r4', [{ kind: 'Pod', op: 'upsert', object: gone }]));
    await clock.advance(100);
    r.onBatch(podBatch('r5', [{ kind: 'Pod', op: 'delete', uid: gone.uid }]));
    for (let i = 0; i < FORGET_ATTEMPTS + 1; i++) {
      await clock.advance(100);
      r.onBatch(batch(`r${6 + i}`, true, `p${i}`));
    }
    await clock.advance(100);
    assert.equal(order.filter((s) => s === 'forgetFlows').length, FORGET_ATTEMPTS);
  });

  test("deleting a released address's tracked connections runs beside the loop: the next change is written without waiting for it", async () => {
    const { clock, dataplane, r } = setup();
    const gone = pod('ns', 'gone', { ip4: 5, ip6: false });
    const later = pod('ns', 'later', { ip4: 6, ip6: false });
    r.onBatch({ events: [{ kind: 'Pod', op: 'upsert', object: gone }], synced: true, revision: 'r1' });
    await clock.advance(100);
    dataplane.forgetMs = 1_000;
    r.onBatch({ events: [{ kind: 'Pod', op: 'delete', uid: gone.uid }], synced: true, revision: 'r2' });
    await clock.advance(100);
    const writesBefore = dataplane.writes().length;
    r.onBatch({ events: [{ kind: 'Pod', op: 'upsert', object: later }], synced: true, revision: 'r3' });
    await clock.advance(100);
    assert.equal(dataplane.writes().length, writesBefore + 1, 'the change was written while the deletion ran');
    assert.deepEqual(dataplane.forgotten, [], 'the deletion is still running');
    await clock.advance(1_000);
    assert.deepEqual(dataplane.forgotten, [['10.244.1.5']]);
    await r.whenIdle();
  });
});

describe('what each pass tells the reporters', () => {
  test('onPass says whether the model changed: true after source events, false for a periodic resync that carried none', async () => {
    const passes: boolean[] = [];
    const { clock, r } = setup({ resyncIntervalMs: 1000, onPass: (o) => passes.push(o.modelChanged) });
    r.onBatch(batch('r1'));
    await clock.advance(20);
    await clock.advance(2000);
    r.onBatch(batch('r2'));
    await clock.advance(20);
    assert.deepEqual(passes, [true, false, false, true]);
    await r.stop();
  });

  test('the policy gauges come from counts calc keeps, valid and invalid', async () => {
    const { clock, metrics, r } = setup();
    r.onBatch({
      events: [
        { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'good', { podSelector: {} }) },
        { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'bad', { podSelector: {}, policyTypes: ['Sideways'] }) },
      ],
      synced: true,
      revision: 'r1',
    });
    await clock.advance(20);
    const got = (await metrics.policies.get()).values.map((v) => [v.labels.state, v.value]);
    assert.deepEqual(got.sort(), [
      ['invalid', 1],
      ['valid', 1],
    ]);
    await r.stop();
  });
});

describe('backoff while events keep arriving', () => {
  // The case of the issue: every write fails, and a batch arrives every 30 ms, also while a
  // write runs. Each batch asks for a pass; none may cut the backoff short.
  test('with every write failing and a batch every 30 ms for 3 s, writes are spaced by the backoff', async () => {
    const { clock, dataplane, r } = setup({ retryMinMs: 1000, retryMaxMs: 10_000 });
    dataplane.failWrites = Infinity;
    dataplane.writeMs = 25; // so that batches also arrive while a write runs
    for (let t = 0; t < 3000; t += 30) {
      r.onBatch(batch(`r${t}`, true, `p${t}`));
      await clock.advance(30);
    }
    const starts = dataplane.writes().map((c) => c.at);
    assert.deepEqual(starts, [0, 1025], 'the first write at once, the next one backoff (1 s) after its end');
    await clock.advance(100);
    assert.deepEqual(
      dataplane.writes().map((c) => c.at),
      [0, 1025, 3050],
      'then 2 s after the second',
    );
    await stopWhileAdvancing(clock, r);
  });

  test('stop() cancels every timer: no pass, retry, resync or hook check runs after it', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000, hookCheckIntervalMs: 500, retryMinMs: 1000 });
    await r.start();
    r.onBatch(batch('r1'));
    await clock.advance(100);
    dataplane.failWrites = Infinity;
    dataplane.writeMs = 50;
    r.onBatch(batch('r2'));
    await clock.advance(65); // the write runs from 120 to 170
    r.onBatch(batch('r3')); // asks for a pass at 185, while the write still runs
    await clock.advance(5); // the write has failed: a retry is due at 1170
    await stopWhileAdvancing(clock, r);
    assert.equal(clock.pending(), 0, 'no timer left');
    const calls = dataplane.calls.length;
    r.onBatch(batch('r4'));
    await clock.advance(60_000);
    assert.equal(dataplane.calls.length, calls, 'nothing ran after stop()');
    assert.equal(clock.pending(), 0);
  });

  test('while writes fail, the arrival times kept for the latency histogram stay bounded', async () => {
    const { clock, dataplane, metrics, r } = setup({ retryMinMs: 1000, retryMaxMs: 1000 });
    dataplane.failWrites = Infinity;
    r.onBatch(batch('r0', true, 'p'));
    await clock.advance(20);
    const n = 5 * MAX_UNAPPLIED;
    for (let i = 1; i <= n; i++) {
      r.onBatch(batch(`r${i}`, true, 'p'));
      if (i % 500 === 0) await clock.advance(1000);
    }
    dataplane.failWrites = 0;
    await clock.advance(2000);
    assert.equal(r.readiness().ready, true);
    const got = await metrics.enforceLatency.get();
    const count = got.values.find((v) => v.metricName === 'weir_event_to_enforced_seconds_count')?.value;
    assert.ok(count !== undefined && count <= MAX_UNAPPLIED && count > 0, `observed ${count} of ${n + 1} batches`);
  });
});

describe('health and readiness', () => {
  test('/healthz fails once no write has succeeded for three resync intervals, and recovers with the next success', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000, retryMinMs: 100, retryMaxMs: 400 });
    r.onBatch(batch('r1'));
    await clock.advance(1500);
    assert.deepEqual(r.health(), { healthy: true, reason: 'Ok' });
    dataplane.failWith = () => new RestoreError('iptables-nft-restore', 4, 'line 2 failed', '*filter\n-A cali-x -s 10.9.8.7/32 -j ACCEPT\n');
    dataplane.failWrites = Infinity;
    r.onBatch(batch('r2'));
    const failingFrom = clock.t;
    await clock.advance(3000);
    assert.equal(r.health().healthy, true, 'three intervals have not passed yet');
    await clock.advance(1);
    assert.deepEqual(r.health(), { healthy: false, reason: 'NoWriteSucceeded', error: 'WEIR_RESTORE_FAILED' });
    assert.ok(clock.t - failingFrom > 3000);
    dataplane.failWrites = 0;
    await clock.advance(400);
    assert.deepEqual(r.health(), { healthy: true, reason: 'Ok' });
  });

  test('/healthz fails while a write hangs', async () => {
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advance(10);
    dataplane.hang = true;
    r.onBatch(batch('r2')); // within the debounce of r1: its write starts 20 ms later, and hangs
    await clock.advance(3000);
    assert.equal(r.health().healthy, true);
    await clock.advance(1);
    assert.deepEqual(r.health(), { healthy: false, reason: 'NoWriteSucceeded' }, 'a write has been owed since the batch came');
    await clock.advance(20);
    assert.deepEqual(r.health(), { healthy: false, reason: 'WriteHung' }, 'and the one write started has run for the whole bound');
  });

  test('/healthz stays ok on an idle node, and before the source is synced', async () => {
    const { clock, r } = setup({ resyncIntervalMs: 0 });
    r.onBatch(batch('r0', false));
    await clock.advance(3_600_000);
    assert.equal(r.health().healthy, true, 'not synced: nothing is owed yet');
    r.onBatch(batch('r1'));
    await clock.advance(3_600_000);
    assert.equal(r.health().healthy, true);
  });

  test('readiness carries codes only, never the text of the error (payload lines, addresses)', async () => {
    const { clock, dataplane, r } = setup();
    dataplane.failWith = () =>
      new RestoreError('iptables-nft-restore', 4, 'Error occurred at line: 2', '*filter\n-A cali-pi-secret -s 10.9.8.7/32 -m comment --comment "cali:x ns/db" -j MARK\nCOMMIT\n');
    dataplane.failWrites = 1;
    r.onBatch(batch('r1'));
    await clock.advance(20);
    const body = JSON.stringify({ ready: r.readiness(), health: r.health() });
    assert.deepEqual(r.readiness(), { ready: false, revision: '', reason: 'ApplyFailed', error: 'WEIR_RESTORE_FAILED' });
    for (const secret of ['10.9.8.7', 'cali-pi-secret', 'ns/db', 'line']) assert.ok(!body.includes(secret), `${secret} in ${body}`);
  });
});

describe('the hook check and the start-up guard', () => {
  test('a hook found missing is repaired by a resync at once, counted and only then checked again', async () => {
    const { clock, dataplane, metrics, r } = setup({ hookCheckIntervalMs: 5000 });
    r.onBatch(batch('r1'));
    await clock.advance(20);
    await clock.advance(10_000);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['hookIntact', 5000],
        ['hookIntact', 10_000],
      ],
    );
    dataplane.hook = false;
    await clock.advance(5000);
    assert.deepEqual(
      dataplane.calls.slice(3).map((c) => [c.kind, c.at]),
      [
        ['hookIntact', 15_000],
        ['resync', 15_000],
      ],
    );
    assert.equal(dataplane.hook, true);
    assert.equal(await counterValue(metrics, 'driftRepairs', { what: 'hook' }), 1);
    await clock.advance(5000);
    assert.deepEqual(
      dataplane.calls.slice(5).map((c) => [c.kind, c.at]),
      [['hookIntact', 20_000]],
    );
    await r.stop();
  });

  test('under a constant stream of batches, a hook deleted at any moment is repaired within 10 s', async () => {
    for (const deletedAt of [1_000, 7_777, 12_345]) {
      const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 5000, resyncIntervalMs: 30_000 });
      dataplane.writeMs = 5;
      let repairedAt: number | null = null;
      for (let t = 0; t < 30_000; t += 30) {
        if (t === Math.floor(deletedAt / 30) * 30) dataplane.hook = false;
        r.onBatch(batch(`r${t}`, true, `p${t % 300}`));
        await clock.advance(30);
        if (repairedAt === null && t >= deletedAt && dataplane.hook === true) repairedAt = clock.t;
      }
      assert.ok(repairedAt !== null && repairedAt - deletedAt <= 10_000, `deleted at ${deletedAt}, repaired at ${repairedAt}`);
      await stopWhileAdvancing(clock, r);
    }
  });

  test('a change that arrives when the hook check is due is written first; the check follows at once', async () => {
    const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 5000 });
    r.onBatch(batch('r1'));
    await clock.advance(4990);
    dataplane.writeMs = 20;
    r.onBatch(batch('r2', true, 'p2')); // written 4990-5010, while the check falls due
    await clock.advance(10);
    r.onBatch(batch('r3', true, 'p3'));
    await clock.advance(100);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['apply', 4990],
        ['apply', 5010],
        ['hookIntact', 5030],
      ],
    );
    await stopWhileAdvancing(clock, r);
  });

  test('a change that arrives while a hook check runs is written at once, without waiting for the check', async () => {
    const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 5000 });
    dataplane.hookMs = 70;
    r.onBatch(batch('r1'));
    await clock.advance(5010); // the check fell due at 5000 and runs until 5070
    r.onBatch(batch('r2', true, 'p2'));
    await clock.advance(100);
    const apply = dataplane.writes('apply')[0];
    const check = dataplane.calls.find((c) => c.kind === 'hookIntact');
    assert.ok(check && apply, `calls: ${JSON.stringify(dataplane.calls)}`);
    assert.ok(apply.at < dataplane.hookChecksDone[0], `the change was written at ${apply.at}, the check ran ${check.at}-${dataplane.hookChecksDone[0]}`);
    assert.equal(apply.at, check.at + 10);
    await stopWhileAdvancing(clock, r);
  });

  test('a hook found missing while a change is written still gets its resync', async () => {
    const { clock, dataplane, metrics, r } = setup({ hookCheckIntervalMs: 5000 });
    dataplane.hookMs = 70;
    r.onBatch(batch('r1'));
    await clock.advance(4990);
    dataplane.writeMs = 100;
    dataplane.hook = false;
    await clock.advance(20); // the check starts at 5000 and ends at 5070, inside the write
    r.onBatch(batch('r2', true, 'p2')); // written 5010-5110
    await clock.advance(300);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['hookIntact', 5000],
        ['apply', 5010],
        ['resync', 5110],
      ],
    );
    assert.equal(dataplane.hook, true);
    assert.equal(await counterValue(metrics, 'driftRepairs', { what: 'hook' }), 1);
    await stopWhileAdvancing(clock, r);
  });

  test('a hook check that fails is answered with a resync', async () => {
    const { clock, dataplane, metrics, r } = setup({ hookCheckIntervalMs: 1000 });
    r.onBatch(batch('r1'));
    await clock.advance(20);
    dataplane.hook = 'throw';
    await clock.advance(1000);
    assert.deepEqual(
      dataplane.calls.map((c) => [c.kind, c.at]),
      [
        ['resync', 0],
        ['hookIntact', 1000],
        ['resync', 1000],
      ],
    );
    assert.equal(await counterValue(metrics, 'errors', { reason: 'UNKNOWN' }), 1);
    await r.stop();
  });

  test('start() runs the guard once and nothing else is written before the source is synced; the hook is not checked before', async () => {
    const { clock, dataplane, r } = setup({ hookCheckIntervalMs: 1000, resyncIntervalMs: 1000 });
    dataplane.guardDoes = true;
    await r.start();
    r.onBatch(batch('r0', false));
    await clock.advance(60_000);
    assert.deepEqual(
      dataplane.calls.map((c) => c.kind),
      ['guard'],
    );
    r.onBatch(batch('r1'));
    await clock.advance(20);
    assert.deepEqual(
      dataplane.calls.map((c) => c.kind),
      ['guard', 'resync'],
    );
    await r.stop();
  });

  test('a guard that fails is logged and does not stop the loop', async () => {
    const { clock, dataplane, metrics, r } = setup();
    dataplane.guardDoes = 'throw';
    await r.start();
    r.onBatch(batch('r1'));
    await clock.advance(20);
    assert.deepEqual(
      dataplane.calls.map((c) => c.kind),
      ['guard', 'resync'],
    );
    assert.equal(r.readiness().ready, true);
    assert.equal(await counterValue(metrics, 'errors', { reason: 'UNKNOWN' }), 1);
  });
});

/** stop() waits for a running write, which in these tests waits for fake time. */
async function stopWhileAdvancing(clock: FakeClock, r: Reconciler): Promise<void> {
  let stopped = false;
  const p = r.stop().then(() => (stopped = true));
  for (let i = 0; i < 100 && !stopped; i++) await clock.advance(10);
  await p;
}
