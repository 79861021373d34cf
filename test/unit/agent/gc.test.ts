import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { v8Collector } from '../../../src/agent/gc.ts';

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

test('without --expose-gc there is no collector to call', () => {
  assert.equal(v8Collector(), undefined);
});

test('the compacting collection gives back pages a plain full collection keeps committed', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, ['--expose-gc', '--input-type=module', '-e', CHILD]);
  const { plain, compacted } = JSON.parse(stdout) as { plain: number; compacted: number };
  const mb = (n: number) => `${(n / 2 ** 20).toFixed(0)} MB`;
  assert.ok(compacted < plain * 0.4, `V8's heap after a plain collection ${mb(plain)}, after a compacting one ${mb(compacted)}`);
});
