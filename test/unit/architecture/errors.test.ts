import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

const read = (rel: string) => readFileSync(new URL(`../../../${rel}`, import.meta.url), 'utf8');

test('docs/errors.md lists exactly the error codes of src/errors.ts', () => {
  const union = /export type ErrorCode =([^;]+);/.exec(read('src/errors.ts'))![1];
  const codes = [...union.matchAll(/'([A-Z_]+)'/g)].map((m) => m[1]).sort();
  const documented = [...read('docs/errors.md').matchAll(/^\| `([A-Z_]+)` \|/gm)].map((m) => m[1]).sort();
  assert.ok(codes.length >= 5);
  assert.deepEqual(documented, codes);
});
