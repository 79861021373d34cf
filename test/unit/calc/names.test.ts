import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import { NAME_CACHE_CHARS, NAME_CACHE_MAX_KEY } from '../../../src/calc/names.ts';
import { sha256Base64Url } from '../../../src/calc/hash.ts';
import { EMPTY, MARKS, NODE, diff, pod, policy, scatteredV6, world } from './fixtures.ts';

test('names are SHA-256 in base64url, the same bytes as every earlier version wrote', () => {
  assert.equal(sha256Base64Url('abc'), 'ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0');
  assert.equal(sha256Base64Url('ünïcødé ✓'), 'pnRdd2cDkfSGshPu8qOM9cf_Yr7Ne5Uhes8flipgIWI', 'UTF-8');
  // Pinned from the previous (hand-written) hash: an upgraded agent finds its own chains and sets.
  const names = makeNames('cali');
  assert.equal(names.peerSet(4, 'pods|ns=web|role in (lb)'), 'cali40s:oQq46q9CPTH_NPCGdhJQ6bH');
  assert.equal(names.toWorkload('web/w1'), 'cali-tw-MZ_aUdlXtMt6cnZhXStn');
  assert.equal(names.policyIngress('db/deny-all'), 'cali-pi-1tu2S1OkugEzDnkcsksz');
});

test('30 edits of a large ipBlock policy leave the name cache bounded, and names stay right', () => {
  const names = makeNames('cali');
  const calc = new Calculator({ nodeName: NODE, names, families: [4, 6], marks: MARKS });
  const excepts = scatteredV6(15_031);
  const spec = (i: number) => ({ podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: [{ ipBlock: { cidr: '::/0', except: excepts.slice(i, i + 15_000) } }] }] });
  let prev = EMPTY;
  for (let i = 0; i <= 30; i++) {
    const w = world([pod('big', 'p1', { ip4: 1 })], [{ name: 'big', labels: {} }], [policy('big', 'p', spec(i), i + 1)]);
    calc.applyEvents(diff(prev, w));
    prev = w;
  }
  // Each edit named a new except set after a key of about 400 KB.
  assert.ok(names.cacheSize <= NAME_CACHE_MAX_KEY, `the cache holds ${names.cacheSize} characters`);
  const v6 = [...calc.desired.sets.values()].filter((s) => s.family === 6);
  assert.equal(v6.length, 1, 'the sets of earlier versions are gone');
  assert.equal(v6[0].members.size, 15_000);
});

test('many small names: the cache evicts the least recently used beyond its size', () => {
  const names = makeNames('cali');
  const first = names.toWorkload('ns/pod-0');
  for (let i = 0; i < 200_000; i++) names.toWorkload(`ns/pod-${i}`);
  assert.ok(names.cacheSize <= NAME_CACHE_CHARS, `${names.cacheSize} > ${NAME_CACHE_CHARS}`);
  assert.ok(names.cacheSize > NAME_CACHE_CHARS / 2, 'and it is used');
  assert.equal(names.toWorkload('ns/pod-0'), first, 'an evicted name is computed again, the same');
});
