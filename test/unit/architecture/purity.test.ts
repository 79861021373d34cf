import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../../../src/', import.meta.url));
const IMPORT = /^\s*(?:import|export)\b[^'"]*?from\s+['"]([^'"]+)['"]|^\s*import\s+['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/gm;

function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(IMPORT)].map((m) => m[1] ?? m[2] ?? m[3]);
}

/** The only outside imports the pure core may use, each in one file: both are pure functions
 *  of their input (a hash; a cache of names that are the same whether cached or not). */
const ALLOWED: Readonly<Record<string, { readonly spec: string; readonly line: string }>> = {
  'calc/hash.ts': { spec: 'node:crypto', line: "import { createHash } from 'node:crypto';" },
  'calc/names.ts': { spec: 'lru-cache', line: "import { LRUCache } from 'lru-cache';" },
};

for (const stage of ['model', 'calc']) {
  test(`${stage}/ is pure: it imports only its own stage, model/ and nothing with side effects`, () => {
    const dir = join(SRC, stage);
    const files = readdirSync(dir).filter((f) => f.endsWith('.ts'));
    assert.ok(files.length > 0);
    for (const f of files) {
      const allowed = ALLOWED[`${stage}/${f}`];
      for (const spec of importsOf(join(dir, f))) {
        if (allowed !== undefined && spec === allowed.spec) {
          // Exactly that import: createHash alone, not randomBytes or randomUUID.
          assert.ok(readFileSync(join(dir, f), 'utf8').split('\n').includes(allowed.line), `${stage}/${f} must import ${spec} exactly as: ${allowed.line}`);
          continue;
        }
        const ok = spec.startsWith('./') || spec.startsWith('../model/');
        assert.ok(ok, `${stage}/${f} imports "${spec}": the pure core may import only ./ and ../model/`);
      }
      const text = readFileSync(join(dir, f), 'utf8');
      assert.doesNotMatch(text, /\b(Date\.now|performance\.now|Math\.random|process\.|setTimeout|setInterval)\b/, `${stage}/${f} uses a clock, randomness or the process`);
    }
  });
}

test('only dataplane/ writes iptables or ipset syntax', () => {
  const walk = (d: string): string[] => readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(join(d, e.name)) : e.name.endsWith('.ts') ? [join(d, e.name)] : []));
  for (const file of walk(SRC)) {
    if (file.includes('/dataplane/')) continue;
    const text = readFileSync(file, 'utf8');
    assert.doesNotMatch(text, /--match-set|--set-xmark|--ctstate|-m multiport/, `${file.slice(SRC.length)} writes iptables syntax`);
  }
});
