// SetRegistry.peek, which `weir explain` evaluates policies' alternatives with: a set some rule
// holds is answered by the live set itself, any other with exactly the members acquire would
// give it, and peeking takes no reference and records no change.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Changes } from '../../../src/calc/changes.ts';
import { makeNames } from '../../../src/calc/names.ts';
import type { SetSpec } from '../../../src/calc/rules.ts';
import { setKey } from '../../../src/calc/rules.ts';
import { SetRegistry } from '../../../src/calc/set-registry.ts';
import { ClusterState } from '../../../src/model/cluster.ts';
import type { Labels } from '../../../src/model/types.ts';
import { byNamespaceLabels, inNamespace, prefixes, union } from './set-specs.ts';
import { pod, rng } from './fixtures.ts';

const SPECS: SetSpec[] = [
  inNamespace('a', { app: 'web' }),
  inNamespace('a', { app: 'db' }),
  inNamespace('a', {}, 'http'),
  byNamespaceLabels({ team: 'x' }, {}),
  prefixes('10.244.1.5/32', '10.9.0.0/16'),
];
SPECS.push(union(SPECS[0], SPECS[3]), union(SPECS[1], SPECS[4]), union(SPECS[0], SPECS[1], SPECS[4]));

const sorted = (m: Iterable<string>) => [...m].sort();

test('peek answers with the members acquire gives a set, and with the live set itself while one exists, changing nothing', () => {
  for (let seed = 1; seed <= 20; seed++) {
    const r = rng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
    const cluster = new ClusterState();
    const changes = new Changes();
    const registry = new SetRegistry(cluster, makeNames('cali'), changes);
    cluster.upsertNamespace({ name: 'a', labels: { team: pick(['x', 'y']) } });
    cluster.upsertNamespace({ name: 'b', labels: { team: pick(['x', 'y']) } });
    for (let i = 1; i <= 8; i++) {
      const p = pod(pick(['a', 'b']), `p${i}`, {
        ip4: i,
        labels: pick<Labels>([{ app: 'web' }, { app: 'db' }, {}]),
        phase: pick(['Running', 'Running', 'Pending']),
        ports: r() < 0.5 ? [{ name: 'http', port: 8000 + i, protocol: 'TCP' }] : [],
      });
      cluster.upsertPod(p);
    }
    // Some sets held by rules (and so their unions' parts), the others not.
    const held = SPECS.filter(() => r() < 0.4).map((s) => registry.acquire(s));
    changes.take();
    const kernel = sorted(registry.kernelSets.keys());
    const live = registry.liveCount;
    for (const spec of SPECS) {
      const peeked = registry.peek(spec);
      assert.equal(changes.take().sets.size, 0, `seed ${seed}: peeking ${setKey(spec)} recorded a change`);
      assert.deepEqual(sorted(registry.kernelSets.keys()), kernel, `seed ${seed}: peeking ${setKey(spec)} changed the kernel's sets`);
      assert.equal(registry.liveCount, live, `seed ${seed}: peeking ${setKey(spec)} kept a set`);
      const want = sorted(peeked.members);
      const acquired = registry.acquire(spec);
      assert.deepEqual(want, sorted(acquired.members), `seed ${seed}: ${setKey(spec)}`);
      assert.equal(peeked.name, acquired.name);
      assert.equal(peeked.type, acquired.type);
      if (held.includes(acquired)) assert.equal(peeked, acquired, `seed ${seed}: a held set is answered by itself`);
      registry.release(acquired);
      changes.take();
    }
  }
});

test('a peeked live set follows later pod changes, as the kernel does', () => {
  const cluster = new ClusterState();
  const registry = new SetRegistry(cluster, makeNames('cali'), new Changes());
  const spec = inNamespace('a', { app: 'web' });
  registry.acquire(spec);
  const peeked = registry.peek(spec);
  const p = pod('a', 'web', { ip4: 5, labels: { app: 'web' } });
  registry.podChanged(cluster.upsertPod(p), p);
  assert.deepEqual(sorted(peeked.members), ['10.244.1.5']);
});
