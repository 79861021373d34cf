// The Dockerfile and scripts/image.sh describe one image: anyone with Docker must get what the
// Docker-free build makes. The script prints what it builds (`image.sh spec`); the Dockerfile
// must say the same. (test/image/image.test.ts checks the built image against the spec.)

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.ts';
import { imageSpec } from './spec.ts';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** The Dockerfile's instructions, continuation lines joined and comments dropped, by stage. */
function dockerfileStages(): { from: string; instructions: [string, string][] }[] {
  const text = readFileSync(`${root}Dockerfile`, 'utf8')
    .split('\n')
    .filter((l) => !/^\s*#/.test(l))
    .join('\n')
    .replace(/\\\n/g, ' ');
  const stages: { from: string; instructions: [string, string][] }[] = [];
  for (const line of text.split('\n')) {
    const m = /^(\w+)\s+(.*)$/.exec(line.trim());
    if (!m) continue;
    const [, op, args] = m;
    if (op.toUpperCase() === 'FROM') stages.push({ from: args, instructions: [] });
    else stages.at(-1)?.instructions.push([op.toUpperCase(), args.replace(/\s+/g, ' ').trim()]);
  }
  return stages;
}

const finalStage = () => dockerfileStages().at(-1)!;

test("the Dockerfile installs exactly the Debian packages of the script's image, from the same release", () => {
  const spec = imageSpec();
  const stage = finalStage();
  assert.match(stage.from, new RegExp(`^debian:${spec.suite}(-slim)?$`), `the final stage starts from ${stage.from}, not Debian ${spec.suite}`);
  const installs = stage.instructions
    .filter(([op]) => op === 'RUN')
    .flatMap(([, args]) => [...args.matchAll(/apt-get install ((?:[^&;|])*)/g)].map((m) => m[1]))
    .flatMap((args) => args.split(' ').filter((w) => w !== '' && !w.startsWith('-')));
  assert.deepEqual([...installs].sort(), [...spec.packages].sort());
  assert.ok(spec.packages.includes('iptables') && spec.packages.includes('ipset') && spec.packages.includes('iproute2'));
});

test('the Dockerfile runs the same entrypoint and cmd, in the same working directory', () => {
  const spec = imageSpec();
  const last = (op: string) =>
    finalStage()
      .instructions.filter(([o]) => o === op)
      .at(-1)?.[1];
  assert.deepEqual(JSON.parse(last('ENTRYPOINT') ?? 'null'), spec.entrypoint);
  // The agent runs with the Node flags its code names (a startup-only heap setting).
  assert.deepEqual(spec.entrypoint, ['node', ...NODE_FLAGS, '/app/dist/cli/main.js']);
  assert.deepEqual(JSON.parse(last('CMD') ?? 'null'), spec.cmd);
  assert.equal(last('WORKDIR'), spec.workdir);
  // No ENV in the final stage: Debian's base image and the script set only the default PATH.
  assert.deepEqual(
    finalStage().instructions.filter(([o]) => o === 'ENV'),
    [],
  );
  assert.deepEqual(spec.env, ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin']);
});

test("both take Node from the lockfile's 'node' package and ship the one bundle scripts/build.ts makes", () => {
  const dockerfile = readFileSync(`${root}Dockerfile`, 'utf8');
  const script = readFileSync(`${root}scripts/image.sh`, 'utf8');
  for (const [name, text] of [
    ['Dockerfile', dockerfile],
    ['scripts/image.sh', script],
  ] as const) {
    assert.match(text, /node_modules\/node\/bin\/node/, `${name} does not take the 'node' package's binary`);
    assert.match(text, /scripts\/build\.ts"? \S*\/dist/, `${name} does not build /app/dist with scripts/build.ts`);
    assert.doesNotMatch(text, /npm ci --omit=dev/, `${name} installs node_modules into the image, which the bundle does not load`);
  }
  assert.ok(
    finalStage().instructions.some(([op, args]) => op === 'COPY' && args.endsWith(' /usr/local/bin/node')),
    'the final stage does not put Node at /usr/local/bin/node',
  );
  const lock = JSON.parse(readFileSync(`${root}package-lock.json`, 'utf8')) as { packages: Record<string, { version?: string; dev?: boolean }> };
  assert.match(lock.packages['node_modules/node']?.version ?? '', /^24\./, 'package-lock.json pins no Node 24');
});
