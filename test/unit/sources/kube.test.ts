// The kube source against a loopback fake API server: initial sync, exact diffs, and the faults
// a real API server does not produce on demand. Timings are shrunk and the retry delay is
// injected (recorded, never waited), so the suite runs in about a second.

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { pino } from 'pino';
import { ConfigError } from '../../../src/errors.ts';
import type { Logger } from '../../../src/log.ts';
import type { ModelEvent } from '../../../src/model/types.ts';
import { toClusterNetworkPolicy, toNamespace, toNetworkPolicy, toNode, toPod } from '../../../src/sources/convert.ts';
import { createKubeSource } from '../../../src/sources/kube/index.ts';
import type { KubeTimings, WatchEvent } from '../../../src/sources/kube/index.ts';
import type { Source, SourceBatch } from '../../../src/sources/types.ts';
import { clusterNetworkPolicy, FakeApiServer, namespace, networkPolicy, node, pod } from './kube-fake-api.ts';
import type { Kind } from './kube-fake-api.ts';

const FAST: KubeTimings = {
  watchTimeoutSeconds: [300, 300],
  watchdogMs: 20_000,
  relistMs: [600_000, 600_000],
  backoffInitialMs: 100,
  backoffMaxMs: 400,
  healthyWatchMs: 60_000,
  listTimeoutMs: 5_000,
  pageSize: 500,
  coalesceMs: 5,
};
/** The injected random: jitter is then exactly 3/4 of each backoff step. */
const RANDOM = 0.5;
const step = (n: number) => Math.min(FAST.backoffMaxMs, FAST.backoffInitialMs * 2 ** (n - 1)) * 0.75;

interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}
const WARN = 40;

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function until(cond: () => boolean, what: string, timeoutMs = 3000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** A fake API server holding a small cluster, and a kube source for node-a pointed at it. */
async function harness(opts: { timings?: Partial<KubeTimings>; seed?: (api: FakeApiServer) => void; startList?: () => () => void } = {}) {
  const api = new FakeApiServer();
  await api.start();
  cleanups.push(() => api.close());
  if (opts.seed) opts.seed(api);
  else {
    api.set('Namespace', namespace('default'));
    api.set('Node', node('node-a', '10.244.0.0/24'));
    api.set('Pod', pod('default', 'web', { labels: { app: 'web' }, ip: '10.244.0.5' }));
  }
  const lines: LogLine[] = [];
  const log: Logger = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as LogLine) });
  const batches: SourceBatch[] = [];
  const hooks: WatchEvent[] = [];
  const delays: number[] = [];
  const source: Source = createKubeSource({
    kubeConfig: api.kubeConfig(),
    nodeName: 'node-a',
    log,
    timings: { ...FAST, ...opts.timings },
    onWatchEvent: (e) => void hooks.push(e),
    // Recorded, not waited: a macrotask only, so a retry loop cannot starve the server.
    delay: async (ms) => {
      delays.push(ms);
      await new Promise((r) => setImmediate(r));
    },
    random: () => RANDOM,
    startList: opts.startList,
  });
  let stopped = false;
  const stop = async () => {
    if (!stopped) await source.stop();
    stopped = true;
  };
  cleanups.push(stop);
  const events = () => batches.flatMap((b) => b.events);
  return {
    api,
    source,
    batches,
    hooks,
    delays,
    lines,
    stop,
    start: () => source.start((b) => void batches.push(b)),
    hooksOf: (kind: Kind, type: WatchEvent['type']) => hooks.filter((h) => h.kind === kind && h.type === type),
    warnings: () => lines.filter((l) => l.level >= WARN),
    /** Waits until `pred` holds for some event after the first `from` batches; returns those events. */
    async eventsAfter(from: number, pred: (e: ModelEvent) => boolean, what: string): Promise<ModelEvent[]> {
      await until(() => batches.slice(from).some((b) => b.events.some(pred)), what);
      return batches.slice(from).flatMap((b) => b.events);
    },
    events,
  };
}

const isPodUpsert = (name: string) => (e: ModelEvent) => e.kind === 'Pod' && e.op === 'upsert' && e.object.name === name;

test('nothing is sent until every kind is listed; the first batch is the full state, synced', async () => {
  let release = () => {};
  const h = await harness({
    seed: (api) => {
      api.set('Namespace', namespace('default'));
      api.set('Namespace', namespace('prod', { env: 'prod' }));
      api.set('Node', node('node-a', '10.244.0.0/24'));
      api.set('Node', node('node-b', '10.244.1.0/24'));
      api.set('Pod', pod('prod', 'db', { labels: { app: 'db' }, ip: '10.244.1.7', node: 'node-b' }));
      api.set('Pod', pod('default', 'web', { labels: { app: 'web' }, ip: '10.244.0.5' }));
      api.set('NetworkPolicy', networkPolicy('prod', 'db-ingress', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ podSelector: {} }] }] }));
      api.fault('NetworkPolicy', 'list', { hold: new Promise<void>((r) => (release = r)) });
    },
  });
  let resolved = false;
  const started = h.start().then(() => (resolved = true));
  await until(() => h.api.requestsOf('Pod', 'watch').length > 0 && h.api.requestsOf('Node', 'watch').length > 0 && h.api.requestsOf('Namespace', 'watch').length > 0, 'the other kinds watch');
  // A change while policies are still being listed goes into the first batch, not before it.
  const web = h.api.set('Pod', pod('default', 'web', { labels: { app: 'web', tier: 'front' }, ip: '10.244.0.5' }));
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(h.batches.length, 0, 'no batch before NetworkPolicies are listed');
  assert.equal(resolved, false, 'start() waits for the first batch');

  release();
  await started;
  assert.equal(h.batches.length, 1);
  const [first] = h.batches;
  assert.equal(first.synced, true);
  assert.equal(first.revision, '1');
  const stored = (kind: Kind, key: string) => h.api.get(kind, key);
  const pods = [stored('Pod', 'prod/db'), web].sort((a, b) => (String(a.metadata.uid) < String(b.metadata.uid) ? -1 : 1));
  const expected: ModelEvent[] = [
    { kind: 'Namespace', op: 'upsert', object: toNamespace(stored('Namespace', 'default')) },
    { kind: 'Namespace', op: 'upsert', object: toNamespace(stored('Namespace', 'prod')) },
    { kind: 'Node', op: 'upsert', object: toNode(stored('Node', 'node-a')) },
    ...pods.map((p): ModelEvent => ({ kind: 'Pod', op: 'upsert', object: toPod(p) })),
    { kind: 'NetworkPolicy', op: 'upsert', object: toNetworkPolicy(stored('NetworkPolicy', 'prod/db-ingress')) },
  ];
  assert.deepEqual(first.events, expected);
  assert.equal(h.api.requestsOf('Node', 'list')[0].query.get('fieldSelector'), 'metadata.name=node-a');
  assert.equal(h.api.requestsOf('Node', 'watch')[0].query.get('fieldSelector'), 'metadata.name=node-a');
});

test('every batch is the exact diff: one event per model change, none for changes the model ignores', async () => {
  const h = await harness();
  await h.start();
  const webPod = (labels: Record<string, string>) => pod('default', 'web', { labels, ip: '10.244.0.5' });
  /** Each step makes its change and returns the events it must produce. */
  const steps: { name: string; kind: 'Pod' | 'Namespace'; change: () => ModelEvent[] }[] = [
    {
      name: 'a label change is one upsert',
      kind: 'Pod',
      change: () => [{ kind: 'Pod', op: 'upsert', object: toPod(h.api.set('Pod', webPod({ app: 'web', v: '2' }))) }],
    },
    {
      name: 'an unchanged object (annotation and resourceVersion only) sends nothing',
      kind: 'Pod',
      change: () => {
        const p = webPod({ app: 'web', v: '2' });
        (p.metadata.annotations as Record<string, string>)['weir.test/noise'] = 'changed';
        h.api.set('Pod', p);
        return [];
      },
    },
    {
      name: 'a change undone within the batching window sends nothing',
      kind: 'Pod',
      change: () => {
        h.api.set('Pod', webPod({ app: 'web', v: '3' }));
        h.api.set('Pod', webPod({ app: 'web', v: '2' }));
        return [];
      },
    },
    {
      name: 'a namespace label change is one upsert',
      kind: 'Namespace',
      change: () => [{ kind: 'Namespace', op: 'upsert', object: toNamespace(h.api.set('Namespace', namespace('default', { team: 'a' }))) }],
    },
    {
      name: 'a deleted pod is one delete naming its uid',
      kind: 'Pod',
      change: () => {
        const uid = String(h.api.get('Pod', 'default/web').metadata.uid);
        h.api.remove('Pod', 'default/web');
        return [{ kind: 'Pod', op: 'delete', uid }];
      },
    },
  ];
  let tag = 0;
  const isSentinel = (e: ModelEvent) => e.op === 'upsert' && (e.kind === 'Pod' || e.kind === 'Namespace') && e.object.name === 'sentinel';
  const stepOf = (e: ModelEvent) => (e.op === 'upsert' && (e.kind === 'Pod' || e.kind === 'Namespace') ? e.object.labels.step : undefined);
  for (const s of steps) {
    const from = h.batches.length;
    const expected = s.change();
    // A sentinel change on the same watch stream, after the step's change: once it has
    // arrived, whatever the step produced has arrived too.
    const mark = String(++tag);
    h.api.set(s.kind, s.kind === 'Pod' ? pod('default', 'sentinel', { labels: { step: mark } }) : namespace('sentinel', { step: mark }));
    const seen = await h.eventsAfter(from, (e) => isSentinel(e) && stepOf(e) === mark, `the sentinel of "${s.name}"`);
    assert.deepEqual(
      seen.filter((e) => !isSentinel(e)),
      expected,
      s.name,
    );
  }
  assert.deepEqual(
    h.batches.map((b) => b.revision),
    h.batches.map((_, i) => String(i + 1)),
    'revisions count the batches delivered',
  );
});

test('a watch the server ends is restarted from the last resourceVersion, without a relist', async () => {
  const h = await harness();
  await h.start();
  await until(() => h.api.openWatches('Pod') === 1, 'the pod watch is open');
  const changed = h.api.set('Pod', pod('default', 'web', { labels: { app: 'web', v: '2' }, ip: '10.244.0.5' }));
  await h.eventsAfter(1, isPodUpsert('web'), 'the label change');
  h.api.endWatches('Pod');
  await until(() => h.api.requestsOf('Pod', 'watch').length === 2, 'the pod watch restarts');
  assert.equal(h.api.requestsOf('Pod', 'watch')[1].query.get('resourceVersion'), changed.metadata.resourceVersion);
  assert.equal(h.api.requestsOf('Pod', 'list').length, 1, 'no relist');
  // The ended watch had made progress, so the retry waits the first backoff step only.
  assert.deepEqual(h.delays, [step(1)]);
  assert.match(h.hooksOf('Pod', 'restart')[0].detail ?? '', /server ended the watch/);

  const from = h.batches.length;
  h.api.set('Pod', pod('default', 'web', { labels: { app: 'web', v: '3' }, ip: '10.244.0.5' }));
  const seen = await h.eventsAfter(from, isPodUpsert('web'), 'the change after the restart');
  assert.deepEqual(
    seen.map((e) => (e.op === 'upsert' && e.kind === 'Pod' ? e.object.labels.v : '')),
    ['3'],
  );

  // That watch delivered an event too: ending it again starts from the first step, not the second.
  h.api.endWatches('Pod');
  await until(() => h.api.requestsOf('Pod', 'watch').length === 3, 'the pod watch restarts again');
  assert.deepEqual(h.delays, [step(1), step(1)]);
});

test('HTTP 500 on list and on watch is retried with exponential backoff that resets after success', async () => {
  const h = await harness({
    seed: (api) => {
      api.set('Namespace', namespace('default'));
      api.set('Pod', pod('default', 'web', { labels: { app: 'web' } }));
      for (let i = 0; i < 5; i++) api.fault('Pod', 'list', { status: 500, reason: 'InternalError' });
    },
  });
  await h.start();
  // Five failed lists, each waiting twice as long as the one before, up to the cap.
  assert.deepEqual(h.delays, [1, 2, 3, 4, 5].map(step));
  assert.equal(h.api.requestsOf('Pod', 'list').length, 6);
  assert.equal(h.hooksOf('Pod', 'error').length, 5);
  assert.match(h.hooksOf('Pod', 'error')[0].detail ?? '', /500 InternalError: injected 500/);
  assert.ok(h.warnings().some((l) => l.kind === 'Pod' && /Pod list failed/.test(l.msg)));

  // The list succeeded: a watch failing now starts from the first step again.
  await until(() => h.api.openWatches('Pod') === 1, 'the pod watch is open');
  h.api.fault('Pod', 'watch', { status: 500 });
  h.api.fault('Pod', 'watch', { status: 500 });
  h.api.endWatches('Pod');
  await until(() => h.api.openWatches('Pod') === 1 && h.api.requestsOf('Pod', 'watch').length === 4, 'the pod watch is back');
  assert.deepEqual(h.delays.slice(5), [1, 2, 3].map(step));
  assert.equal(h.hooksOf('Pod', 'restart').length, 8);
  const listRv = h.api.requestsOf('Pod', 'watch')[0].query.get('resourceVersion');
  assert.ok(
    h.api.requestsOf('Pod', 'watch').every((r) => r.query.get('resourceVersion') === listRv),
    'every retry resumes from the list',
  );
  assert.equal(h.api.requestsOf('Pod', 'list').length, 6, 'a 500 on watch does not relist');
});

for (const gone of [
  { name: 'an ERROR event with code 410 (the usual form)', fault: null },
  { name: 'an HTTP 410 answer', fault: { status: 410, reason: 'Gone' } },
]) {
  test(`410 Gone as ${gone.name} relists, and the diff reports what changed while disconnected`, async () => {
    const h = await harness({
      seed: (api) => {
        api.set('Namespace', namespace('default'));
        for (const name of ['a', 'b', 'c']) api.set('Pod', pod('default', name, { labels: { app: name } }));
      },
    });
    await h.start();
    await until(() => h.api.openWatches('Pod') === 1, 'the pod watch is open');
    const b = h.api.get('Pod', 'default/b');
    let release = () => {};
    h.api.fault('Pod', 'watch', gone.fault ?? { hold: new Promise<void>((r) => (release = r)) });
    h.api.endWatches('Pod');
    // While the agent is away: b goes, a changes, and the server forgets the history.
    h.api.remove('Pod', 'default/b');
    const a = h.api.set('Pod', pod('default', 'a', { labels: { app: 'a', v: '2' } }));
    h.api.compact('Pod');
    release();

    const seen = await h.eventsAfter(1, isPodUpsert('a'), 'the relist diff');
    assert.deepEqual(seen, [
      { kind: 'Pod', op: 'delete', uid: String(b.metadata.uid) },
      { kind: 'Pod', op: 'upsert', object: toPod(a) },
    ]);
    assert.equal(h.api.requestsOf('Pod', 'list').length, 2);
    // Only the ended watch waited; 410 is the server's way of saying "relist", not a failure,
    // so the relist comes at once (a backoff there kept a missed deletion unrepaired for 30 s).
    assert.deepEqual(h.delays, [step(1)]);
    assert.match(h.hooksOf('Pod', 'relist')[0].detail ?? '', /^410 Gone/);
    assert.ok(h.hooksOf('Pod', 'error').some((e) => /410/.test(e.detail ?? '')));
    await until(() => h.api.openWatches('Pod') === 1, 'the pod watch reopens');
    const last = h.api.requestsOf('Pod', 'watch').at(-1)!;
    assert.equal(Number(last.query.get('resourceVersion')) >= Number(a.metadata.resourceVersion), true, 'it watches from the relist');
  });
}

test('a stalled watch (open but silent) is restarted by the watchdog', async () => {
  const watchdogMs = 150;
  const h = await harness({ timings: { watchdogMs } });
  h.api.fault('Pod', 'watch', { stall: true });
  await h.start();
  await until(() => h.api.requestsOf('Pod', 'watch').length === 1, 'the pod watch is open');
  const opened = performance.now();
  // The stalled stream never delivers this; the restarted watch replays it.
  h.api.set('Pod', pod('default', 'web', { labels: { app: 'web', v: '2' } }));
  await h.eventsAfter(1, isPodUpsert('web'), 'the change, via the restarted watch');
  const waited = performance.now() - opened;
  assert.ok(waited >= watchdogMs * 0.9, `restarted after ${Math.round(waited)} ms, not before the watchdog limit`);
  assert.ok(waited < 2000, `restarted after ${Math.round(waited)} ms`);
  // Every kind is silent here, so whichever watchdog fires first resets the shared connection
  // pool (a stalled path is suspect), which also restarts the pod watch.
  const dogs = (['Pod', 'Namespace', 'Node', 'NetworkPolicy'] as const).flatMap((k) => h.hooksOf(k, 'watchdog'));
  assert.ok(dogs.length >= 1, 'a watchdog fired');
  assert.match(dogs[0].detail ?? '', /silent for 150 ms/);
  assert.equal(h.api.requestsOf('Pod', 'list').length, 1, 'a watchdog restart resumes, it does not relist');
});

test('a bookmark moves the resourceVersion the next watch resumes from', async () => {
  const h = await harness();
  await h.start();
  await until(() => h.api.openWatches('Pod') === 1, 'the pod watch is open');
  const before = h.api.requestsOf('Pod', 'watch')[0].query.get('resourceVersion');
  // Other kinds move the cluster's resourceVersion on; pods only learn of it by bookmark.
  h.api.set('Namespace', namespace('other'));
  h.api.set('Namespace', namespace('more'));
  const bookmarked = h.api.bookmark('Pod');
  assert.notEqual(bookmarked, before);
  await until(() => h.hooksOf('Pod', 'bookmark').length === 1, 'the bookmark arrives');
  assert.equal(h.hooksOf('Pod', 'bookmark')[0].detail, bookmarked);
  h.api.endWatches('Pod');
  await until(() => h.api.requestsOf('Pod', 'watch').length === 2, 'the pod watch restarts');
  assert.equal(h.api.requestsOf('Pod', 'watch')[1].query.get('resourceVersion'), bookmarked);
  assert.equal(h.api.requestsOf('Pod', 'watch')[0].query.get('allowWatchBookmarks'), 'true');
  assert.ok(
    h.batches.slice(1).every((b) => b.events.every((e) => e.kind !== 'Pod')),
    'a bookmark is not a change',
  );
});

for (const c of [
  { name: 'deleted and re-created (DELETED then ADDED)', silentDelete: false },
  { name: 'the DELETED event was missed (only the new uid arrives)', silentDelete: true },
]) {
  test(`a pod name taken by a new uid, ${c.name}: delete of the old uid, upsert of the new`, async () => {
    const h = await harness();
    await h.start();
    const old = h.api.get('Pod', 'default/web');
    h.api.remove('Pod', 'default/web', { silent: c.silentDelete });
    const fresh = h.api.set('Pod', pod('default', 'web', { uid: 'uid-new', labels: { app: 'web' }, ip: '10.244.0.6' }));
    const seen = await h.eventsAfter(1, isPodUpsert('web'), 'the new pod');
    assert.deepEqual(seen, [
      { kind: 'Pod', op: 'delete', uid: String(old.metadata.uid) },
      { kind: 'Pod', op: 'upsert', object: toPod(fresh) },
    ]);
  });
}

const PAGED = ['p1', 'p2', 'p3', 'p4', 'p5'];

/** Five pods in one namespace, listed two a page. */
function seedPaged(api: FakeApiServer): void {
  api.set('Namespace', namespace('default'));
  PAGED.forEach((n, i) => {
    api.set('Pod', pod('default', n, { ip: `10.244.0.${i + 10}` }));
  });
}

/** The names of the pods the first batch upserts. */
function firstBatchPods(h: { batches: readonly SourceBatch<ModelEvent>[] }): string[] {
  return h.batches[0].events.flatMap((e) => (e.op === 'upsert' && e.kind === 'Pod' ? [e.object.name] : [])).sort();
}

test('lists are paginated with limit and continue, and every page counts; the first page of the first list may come from the watch cache', async () => {
  const h = await harness({ timings: { pageSize: 2 }, seed: seedPaged });
  await h.start();
  const lists = h.api.requestsOf('Pod', 'list');
  assert.equal(lists.length, 3);
  assert.ok(lists.every((r) => r.query.get('limit') === '2'));
  assert.equal(lists[0].query.get('continue'), null);
  assert.equal(lists[0].query.get('resourceVersion'), '0');
  assert.ok(lists.slice(1).every((r) => (r.query.get('continue') ?? '') !== '' && r.query.get('resourceVersion') === null));
  assert.deepEqual(firstBatchPods(h), PAGED);
});

test('every object a list reads is announced, one that does not convert too, on every page', async () => {
  let items = 0;
  const h = await harness({
    timings: { pageSize: 2 },
    seed: (api) => {
      seedPaged(api);
      const broken = pod('default', 'broken');
      (broken.metadata.labels as Record<string, unknown>).port = 8080; // does not convert
      api.set('Pod', broken);
    },
    startList: () => () => items++,
  });
  await h.start();
  // The namespace and every pod, the one skipped included; no Node or policy was seeded.
  assert.equal(items, 1 + PAGED.length + 1);
});

test('a list answer cut off halfway is a failed list, retried, never a shorter list', async () => {
  const h = await harness({
    seed: (api) => {
      seedPaged(api);
      api.fault('Pod', 'list', { truncate: true });
    },
  });
  await h.start();
  assert.equal(h.api.requestsOf('Pod', 'list').length, 2);
  assert.match(h.hooksOf('Pod', 'error')[0].detail ?? '', /terminated/);
  assert.deepEqual(firstBatchPods(h), PAGED);
});

test('a page failing after the first fails the list, which starts over from the first page', async () => {
  let release = () => {};
  const h = await harness({
    timings: { pageSize: 2 },
    seed: (api) => {
      seedPaged(api);
      api.fault('Pod', 'list', { hold: new Promise<void>((r) => (release = r)) }); // page 1, held
      api.fault('Pod', 'list', { status: 500, reason: 'InternalError' }); // page 2 fails
    },
  });
  const started = h.start();
  await until(() => h.api.requestsOf('Pod', 'list').length === 1, 'the first page asked for');
  release();
  await started;
  const lists = h.api.requestsOf('Pod', 'list');
  assert.deepEqual(
    lists.map((r) => r.query.get('continue') !== null),
    [false, true, false, true, true],
    'page 1, page 2 (failed), then the whole list again',
  );
  assert.equal(h.hooksOf('Pod', 'error').length, 1);
  assert.deepEqual(firstBatchPods(h), PAGED);
});

test('a first list that fails after its first page and is retried without an object of that page does not send the object', async () => {
  let release = () => {};
  const h = await harness({
    timings: { pageSize: 2 },
    seed: (api) => {
      seedPaged(api);
      api.fault('Pod', 'list', { hold: Promise.resolve() }); // page 1, p1 and p2
      api.fault('Pod', 'list', { hold: new Promise<void>((r) => (release = r)), status: 500 }); // page 2, held, then fails
    },
  });
  const started = h.start();
  await until(() => h.api.requestsOf('Pod', 'list').length === 2, 'the second page asked for');
  h.api.remove('Pod', 'default/p1', { silent: true });
  release();
  await started;
  assert.deepEqual(firstBatchPods(h), ['p2', 'p3', 'p4', 'p5']);
});

test('the periodic relist repairs events the watch missed, and an unchanged relist sends nothing', async () => {
  const h = await harness({
    timings: { relistMs: [150, 150] },
    seed: (api) => {
      api.set('Namespace', namespace('default'));
      for (const name of ['a', 'b']) api.set('Pod', pod('default', name, { labels: { app: name } }));
    },
  });
  await h.start();
  const b = h.api.get('Pod', 'default/b');
  h.api.remove('Pod', 'default/b', { silent: true });
  const a = h.api.set('Pod', pod('default', 'a', { labels: { app: 'a', v: '2' } }), { silent: true });
  const seen = await h.eventsAfter(1, isPodUpsert('a'), 'the repair');
  assert.deepEqual(seen, [
    { kind: 'Pod', op: 'delete', uid: String(b.metadata.uid) },
    { kind: 'Pod', op: 'upsert', object: toPod(a) },
  ]);
  assert.equal(h.hooksOf('Pod', 'relist')[0].detail, 'periodic');
  assert.deepEqual(
    h.api.requestsOf('Pod', 'list').map((r) => r.query.get('resourceVersion')),
    ['0', null],
    'the first list from the watch cache, the relist consistent',
  );
  assert.ok(h.lines.some((l) => l.kind === 'Pod' && /relist repaired 2 object/.test(l.msg)));
  const batches = h.batches.length;
  const lists = h.api.requestsOf('Pod', 'list').length;
  await until(() => h.api.requestsOf('Pod', 'list').length >= lists + 2, 'two more relists');
  await until(() => h.hooksOf('Pod', 'listed').length >= lists + 2, 'the relists are applied');
  assert.equal(h.batches.length, batches, 'a relist that finds nothing new sends nothing');
  assert.equal(h.delays.length, 0, 'a planned relist does not back off');
});

test('policies are held by their generation: a new spec is an upsert carrying it, watched or relisted; other metadata sends nothing; one without a generation is compared by its spec, also after one with', async () => {
  const spec = (port: number) => ({ podSelector: {}, ingress: [{ ports: [{ port }] }] });
  const h = await harness({
    timings: { relistMs: [150, 150] },
    seed: (api) => {
      api.set('Namespace', namespace('default'));
      api.set('NetworkPolicy', networkPolicy('default', 'p', spec(80)));
      const bare = networkPolicy('default', 'bare', spec(80));
      bare.metadata.generation = undefined; // a server that does not set it (sent without it)
      api.set('NetworkPolicy', bare);
    },
  });
  await h.start();
  const isPolicy = (name: string) => (e: ModelEvent) => e.kind === 'NetworkPolicy' && e.op === 'upsert' && e.object.name === name;
  const specOf = (events: ModelEvent[], name: string) => events.filter(isPolicy(name)).map((e) => (e.kind === 'NetworkPolicy' && e.op === 'upsert' ? e.object.spec : null));
  assert.deepEqual(specOf(h.events(), 'p'), [spec(80)]);

  let from = h.batches.length;
  h.api.set('NetworkPolicy', networkPolicy('default', 'p', spec(81)));
  assert.equal(h.api.get('NetworkPolicy', 'default/p').metadata.generation, 2);
  assert.deepEqual(specOf(await h.eventsAfter(from, isPolicy('p'), 'the watched spec change'), 'p'), [spec(81)]);

  from = h.batches.length;
  h.api.set('NetworkPolicy', networkPolicy('default', 'p', spec(82)), { silent: true });
  assert.deepEqual(specOf(await h.eventsAfter(from, isPolicy('p'), 'the relist repairing a missed spec change'), 'p'), [spec(82)]);

  from = h.batches.length;
  const relabelled = networkPolicy('default', 'p', spec(82));
  relabelled.metadata.labels = { team: 'a' };
  h.api.set('NetworkPolicy', relabelled);
  const bare = networkPolicy('default', 'bare', spec(90));
  bare.metadata.generation = undefined;
  h.api.set('NetworkPolicy', bare);
  const seen = await h.eventsAfter(from, isPolicy('bare'), 'the spec change of the policy without a generation');
  assert.deepEqual(specOf(seen, 'bare'), [spec(90)]);
  assert.deepEqual(specOf(seen, 'p'), [], 'a label change of a policy sends nothing');

  // Held by generation 1, then sent without one (convert.ts says 1 again): only the spec tells.
  from = h.batches.length;
  h.api.set('NetworkPolicy', networkPolicy('default', 'q', spec(80)));
  assert.deepEqual(specOf(await h.eventsAfter(from, isPolicy('q'), 'a new policy'), 'q'), [spec(80)]);
  from = h.batches.length;
  const unset = networkPolicy('default', 'q', spec(83));
  unset.metadata.generation = undefined;
  h.api.set('NetworkPolicy', unset);
  assert.deepEqual(specOf(await h.eventsAfter(from, isPolicy('q'), 'the spec change sent without a generation'), 'q'), [spec(83)]);
  const lists = h.api.requestsOf('NetworkPolicy', 'list').length;
  const batches = h.batches.length;
  await until(() => h.hooksOf('NetworkPolicy', 'listed').length >= lists + 2, 'two more relists');
  assert.equal(h.batches.length, batches, 'relists of unchanged policies send nothing');
});

test('objects that do not convert are warned about by kind, namespace and name, and skipped; policies pass through', async () => {
  const broken = pod('default', 'broken', { labels: { app: 'x' } });
  (broken.metadata.labels as Record<string, unknown>).port = 8080; // a number where a string is due
  const weird = pod('default', 'weird-ip', { ip: 'not-an-ip' });
  const badPolicy = networkPolicy('default', 'odd', { podSelector: 'everything', ingress: 'yes' });
  const h = await harness({
    seed: (api) => {
      api.set('Namespace', namespace('default'));
      api.set('Pod', pod('default', 'web', { labels: { app: 'web' } }));
      api.set('Pod', broken);
      api.set('Pod', weird);
      api.set('NetworkPolicy', badPolicy);
    },
  });
  await h.start();
  const first = h.batches[0].events;
  const podNames = first.flatMap((e) => (e.kind === 'Pod' && e.op === 'upsert' ? [e.object.name] : []));
  assert.deepEqual(podNames.sort(), ['web', 'weird-ip']);
  const weirdPod = first.find((e) => e.kind === 'Pod' && e.op === 'upsert' && e.object.name === 'weird-ip');
  assert.deepEqual(weirdPod?.kind === 'Pod' && weirdPod.op === 'upsert' ? weirdPod.object.ips : null, []);
  const policy = first.find((e) => e.kind === 'NetworkPolicy');
  assert.deepEqual(policy?.kind === 'NetworkPolicy' && policy.op === 'upsert' ? policy.object.spec : null, { podSelector: 'everything', ingress: 'yes' });

  const skipped = h.warnings().filter((l) => l.kind === 'Pod' && l.name === 'broken');
  assert.equal(skipped.length, 1);
  assert.equal(skipped[0].namespace, 'default');
  assert.match(skipped[0].msg, /metadata\.labels\.port must be a string.*skipped/);
  assert.ok(h.warnings().some((l) => /weird-ip.*not an IP address/.test(l.msg)));

  // A pod that stops converting is treated as gone.
  const web = h.api.get('Pod', 'default/web');
  const spoiled = pod('default', 'web', { labels: { app: 'web' } });
  spoiled.spec = 'not an object';
  h.api.set('Pod', spoiled);
  const seen = await h.eventsAfter(1, (e) => e.kind === 'Pod' && e.op === 'delete', 'the delete');
  assert.deepEqual(seen, [{ kind: 'Pod', op: 'delete', uid: String(web.metadata.uid) }]);
});

test('stop() aborts lists, watches and timers, and a start() still waiting resolves', async () => {
  const h = await harness();
  h.api.fault('NetworkPolicy', 'list', { hold: new Promise<void>(() => {}) }); // never answers
  const started = h.start();
  await until(() => h.api.openWatches('Pod') === 1 && h.api.openWatches('Namespace') === 1, 'the other kinds watch');
  const t0 = performance.now();
  await h.stop();
  await started;
  assert.ok(performance.now() - t0 < 1000, 'stop() is prompt');
  await until(() => h.api.openWatches('Pod') === 0 && h.api.openWatches('Namespace') === 0 && h.api.openWatches('Node') === 0, 'the server sees the watches closed');
  const requests = h.api.requests.length;
  h.api.set('Pod', pod('default', 'late', {}));
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(h.batches.length, 0);
  assert.equal(h.api.requests.length, requests, 'nothing retries after stop()');
});

test('the token of the kubeconfig is sent: a rejected token is an error that is retried, never a crash', async () => {
  const h = await harness();
  const bad = createKubeSource({
    kubeConfig: h.api.kubeConfig('wrong-token'),
    nodeName: 'node-a',
    log: pino({ level: 'silent' }),
    timings: FAST,
    delay: async () => void (await new Promise((r) => setTimeout(r, 5))),
    onWatchEvent: (e) => void h.hooks.push(e),
  });
  void bad.start(() => assert.fail('no batch without a successful list'));
  await until(() => h.hooks.filter((e) => e.type === 'error' && /401 Unauthorized/.test(e.detail ?? '')).length >= 8, 'repeated 401s');
  await bad.stop();
  await h.start();
  assert.equal(h.batches.length, 1, 'the right token lists');
});

test('a kubeconfig without a current cluster is a configuration error at start()', async () => {
  const kc = new KubeConfig();
  kc.loadFromOptions({ clusters: [], users: [], contexts: [], currentContext: '' });
  const source = createKubeSource({ kubeConfig: kc, nodeName: 'node-a', log: pino({ level: 'silent' }) });
  await assert.rejects(
    source.start(() => {}),
    (err: unknown) => err instanceof ConfigError && /current cluster/.test(err.message),
  );
  await source.stop();
});

// ---- ClusterNetworkPolicy: a CRD the cluster may not have -----------------------------------

const INFO = 30;
const CNP_SPEC = {
  tier: 'Admin',
  priority: 10,
  subject: { namespaces: { matchLabels: { tenant: 'a' } } },
  ingress: [{ name: 'no-tenant-b', action: 'Deny', from: [{ namespaces: { matchLabels: { tenant: 'b' } } }] }],
};
const notServedLines = (lines: readonly LogLine[]) => lines.filter((l) => l.kind === 'ClusterNetworkPolicy' && /is not served by the API server/.test(l.msg));

test('without the ClusterNetworkPolicy CRD the source still syncs: none are sent, it is said once at info, and nothing is watched or retried', async () => {
  const h = await harness();
  await h.start();
  assert.equal(h.batches.length, 1);
  assert.equal(h.batches[0].synced, true);
  assert.deepEqual(
    h.batches[0].events.filter((e) => e.kind === 'ClusterNetworkPolicy'),
    [],
  );
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(h.api.requestsOf('ClusterNetworkPolicy', 'list').length, 1, 'listed once; again only at the relist interval');
  assert.equal(h.api.requestsOf('ClusterNetworkPolicy', 'watch').length, 0);
  const said = notServedLines(h.lines);
  assert.equal(said.length, 1);
  assert.equal(said[0].level, INFO);
  assert.match(said[0].msg, /404 NotFound.*listed again every 600-600 s/);
  assert.deepEqual(h.warnings(), []);
  assert.deepEqual(h.delays, [], 'no backoff: a missing CRD is no failure');
  assert.deepEqual(h.hooksOf('ClusterNetworkPolicy', 'error'), []);
});

test('with the CRD served, ClusterNetworkPolicies are listed and watched: an upsert with the spec as received, one per spec change, a delete by name, nothing for a status write', async () => {
  const h = await harness({
    seed: (api) => {
      api.set('Namespace', namespace('default'));
      api.serve('ClusterNetworkPolicy', true);
      api.set('ClusterNetworkPolicy', clusterNetworkPolicy('tenants', CNP_SPEC));
    },
  });
  await h.start();
  const stored = h.api.get('ClusterNetworkPolicy', 'tenants');
  assert.deepEqual(
    h.batches[0].events.filter((e) => e.kind === 'ClusterNetworkPolicy'),
    [{ kind: 'ClusterNetworkPolicy', op: 'upsert', object: toClusterNetworkPolicy(stored) }],
  );
  assert.deepEqual(toClusterNetworkPolicy(stored), { name: 'tenants', uid: stored.metadata.uid, generation: 1, spec: CNP_SPEC });
  assert.deepEqual(notServedLines(h.lines), []);
  await until(() => h.api.openWatches('ClusterNetworkPolicy') === 1, 'the watch is open');

  const edited = { ...CNP_SPEC, priority: 20 };
  let from = h.batches.length;
  h.api.set('ClusterNetworkPolicy', clusterNetworkPolicy('tenants', edited));
  let seen = await h.eventsAfter(from, (e) => e.kind === 'ClusterNetworkPolicy', 'the edit');
  assert.deepEqual(seen, [{ kind: 'ClusterNetworkPolicy', op: 'upsert', object: { name: 'tenants', uid: stored.metadata.uid, generation: 2, spec: edited } }]);

  // A controller writing status changes neither the generation nor what the model reads.
  from = h.batches.length;
  h.api.set('ClusterNetworkPolicy', clusterNetworkPolicy('tenants', edited, { conditions: [{ type: 'Accepted', status: 'True' }] }));
  h.api.remove('ClusterNetworkPolicy', 'tenants');
  seen = await h.eventsAfter(from, (e) => e.kind === 'ClusterNetworkPolicy', 'the delete');
  assert.deepEqual(seen, [{ kind: 'ClusterNetworkPolicy', op: 'delete', name: 'tenants' }]);
});

test('a CRD installed after the start is found at the next relist interval and its policies sent; removed again, its policies are deleted and that is said once more', async () => {
  const h = await harness({ timings: { relistMs: [40, 40] } });
  await h.start();
  h.api.serve('ClusterNetworkPolicy', true);
  h.api.set('ClusterNetworkPolicy', clusterNetworkPolicy('tenants', CNP_SPEC));
  const seen = await h.eventsAfter(1, (e) => e.kind === 'ClusterNetworkPolicy', 'the policy of the new CRD');
  assert.deepEqual(seen, [{ kind: 'ClusterNetworkPolicy', op: 'upsert', object: toClusterNetworkPolicy(h.api.get('ClusterNetworkPolicy', 'tenants')) }]);
  assert.ok(h.lines.some((l) => l.kind === 'ClusterNetworkPolicy' && l.level === INFO && /is served now; watching it/.test(l.msg)));
  assert.equal(notServedLines(h.lines).length, 1);

  const from = h.batches.length;
  h.api.serve('ClusterNetworkPolicy', false);
  const gone = await h.eventsAfter(from, (e) => e.kind === 'ClusterNetworkPolicy', 'the delete');
  assert.deepEqual(gone, [{ kind: 'ClusterNetworkPolicy', op: 'delete', name: 'tenants' }]);
  assert.equal(notServedLines(h.lines).length, 2);
});
