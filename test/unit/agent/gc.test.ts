import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { listHeapGuard, v8Collector } from '../../../src/agent/gc.ts';

const GC = fileURLToPath(new URL('../../../src/agent/gc.ts', import.meta.url));

// A heap of many small objects of which one in eight survives: what a cold start leaves, in
// miniature. Prints V8's committed heap after a plain full collection, then after a compacting one.
const CHILD = `
import { v8Collector } from ${JSON.stringify(GC)};
const collect = v8Collector();
let all = [];
for (let i = 0; i < 1_000_000; i++) all.push({ a: i, b: 'x' + i });
const keep = all.filter((_, i) => i % 8 === 0);
all = null;
collect(false);
const plain = process.memoryUsage().heapTotal;
collect(true);
console.log(JSON.stringify({ plain, compacted: process.memoryUsage().heapTotal, kept: keep.length }));
`;

// A heap compacted by the collector, then grown by about 40 MB: prints the full collections
// V8 ran of its own during that growth.
const GROWTH = `
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { v8Collector } from ${JSON.stringify(GC)};
const collect = v8Collector();
const keep = [];
for (let i = 0; i < 1_500_000; i++) keep.push({ a: i, b: 'x' + i });
collect(true);
let full = 0;
new PerformanceObserver((l) => {
  for (const e of l.getEntries()) if (e.detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR || e.detail?.kind === constants.NODE_PERFORMANCE_GC_INCREMENTAL) full++;
}).observe({ entryTypes: ['gc'] });
for (let i = 0; i < 400_000; i++) {
  keep.push({ i, s: 'y' + i });
  for (let j = 0; j < 5; j++) ({ j });
}
setTimeout(() => console.log(JSON.stringify({ full, kept: keep.length })), 100);
`;

test('without --expose-gc there is no collector to call', () => {
  assert.equal(v8Collector(), undefined);
});

test('the compacting collection gives back pages a plain full collection keeps committed', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, ['--expose-gc', '--input-type=module', '-e', CHILD]);
  const { plain, compacted } = JSON.parse(stdout) as { plain: number; compacted: number };
  const mb = (n: number) => `${(n / 2 ** 20).toFixed(0)} MB`;
  assert.ok(compacted < plain * 0.4, `V8's heap after a plain collection ${mb(plain)}, after a compacting one ${mb(compacted)}`);
});

/** A heap that grows by `step` per object and falls to 100 at each collection. */
function guarded(step: number, growthBytes: number, every = 10) {
  let used = 100;
  const collections: number[] = [];
  const reported: [number, number][] = [];
  let objects = 0;
  const startList = listHeapGuard(
    () => {
      collections.push(objects);
      used = 100;
    },
    { every, growthBytes, heapUsed: () => used, onCollect: (before, after) => reported.push([before, after]) },
  );
  let guard = startList();
  return {
    newList() {
      guard = startList();
    },
    take(n: number) {
      for (let i = 0; i < n; i++) {
        objects++;
        used += step;
        guard();
      }
    },
    set used(v: number) {
      used = v;
    },
    collections,
    reported,
  };
}

test('a list that grows the heap by the allowance since its lowest gets a full collection, and the count starts again after it', () => {
  const g = guarded(1, 50);
  g.take(200);
  // Looked at every 10 objects: the lowest is 110 at object 10, and 170 at object 70 is 60
  // over it; after the collection the lowest is 100, and 160 at object 130 is 60 over it.
  assert.deepEqual(g.collections, [70, 130, 190]);
  // Each is reported with the heap it found and the heap it left, for the agent's debug log.
  assert.deepEqual(g.reported, [
    [170, 100],
    [160, 100],
    [160, 100],
  ]);
});

test('a heap that V8 keeps down by its own collections gets none from the guard', () => {
  const g = guarded(1, 50);
  for (let i = 0; i < 20; i++) {
    g.take(40);
    g.used = 100; // V8 collected on its own
  }
  assert.deepEqual(g.collections, []);
});

test('each list starts afresh: a relist finding the heap already grown gets no collection for what it found', () => {
  const g = guarded(1, 50);
  g.take(40);
  g.used = 300; // what the first list left, V8 having collected on its own
  g.newList();
  g.take(40);
  assert.deepEqual(g.collections, []);
});

test('the heap is looked at only every so many objects', () => {
  const g = guarded(100, 50, 1000);
  g.take(999);
  assert.deepEqual(g.collections, []);
  g.take(1001);
  assert.deepEqual(g.collections, [2000]);
});

test('after the compacting collection the heap may grow as usual: no full collection of V8’s own while it does', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, ['--max-semi-space-size=2', '--expose-gc', '--input-type=module', '-e', GROWTH]);
  const { full } = JSON.parse(stdout) as { full: number };
  assert.equal(full, 0, `V8 ran ${full} full collections while the compacted heap grew`);
});
