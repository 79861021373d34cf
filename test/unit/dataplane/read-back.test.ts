// Kernel read-back (read-back.ts): what a read records and the work it makes; through the
// dataplane, stale own objects removed and foreign objects with Weir's names refused.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PreconditionError } from '../../../src/errors.ts';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane } from '../../../src/dataplane/dataplane.ts';
import { dirtyAfterRead, readOwn, type ReadBack } from '../../../src/dataplane/read-back.ts';
import { emptyFamilyState } from '../../../src/dataplane/state.ts';
import { lazyTools } from '../../../src/dataplane/tools.ts';
import { set, desired, jump, fromSet, names, fakeKernel, what, base, KERNEL4, ACCEPT_HOOK, IPSET, FELIX4, FELIX_SETS } from './fixtures.ts';

test('the first apply removes stale own chains and sets, repairs the hook and touches nothing foreign', async () => {
  const runner = fakeKernel({ save4: KERNEL4, ipset: IPSET });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1'])], chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a')] } });
  await dp.apply(d);
  const byTool = (cmd: string) => runner.calls.filter((c) => what(c) === cmd).map((c) => c.input!);
  const [members, destroys] = byTool('ipset restore');
  assert.equal(members, 'del cali40s:a 10.6.6.6 -exist\n');
  assert.equal(destroys, 'destroy cali40s:stale\n');
  const payload = byTool('iptables-nft-restore')[0];
  const [mangle, filter] = payload.split('*filter\n');
  assert.match(mangle, /-D FORWARD -m comment --comment "weir:hook" -j cali-FORWARD\n/);
  assert.match(mangle, /-I FORWARD 1 /);
  assert.match(mangle, /:cali-stale - \[0:0\][\s\S]*-X cali-stale\nCOMMIT/);
  // No accept chain desired (RETURN mode): the accept hook goes.
  assert.equal(filter, `-D FORWARD ${ACCEPT_HOOK}\nCOMMIT\n`);
  for (const foreign of ['KUBE', 'flannel', '10.244']) assert.ok(!payload.includes(foreign), `payload mentions ${foreign}`);
  assert.ok(!destroys.includes('KUBE') && !members.includes('KUBE'));
});

test("chains and sets named like Weir's that Weir did not write make it refuse, and are never deleted", async () => {
  const runner = fakeKernel({ save4: FELIX4, ipset: FELIX_SETS });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  await assert.rejects(dp.checkOwnership(), (e: Error) => e instanceof PreconditionError && /cali-FORWARD/.test(e.message) && /cali40s:felix/.test(e.message) && /cali-empty/.test(e.message));
  await assert.rejects(dp.apply(base), PreconditionError);
  const stats = await dp.cleanup();
  assert.deepEqual(stats, { chainsDeleted: 0, hooksDeleted: 0, setsDeleted: 0 });
  assert.ok(!runner.calls.some((c) => c.cmd.endsWith('-restore') && c.input !== undefined && c.input.trim() !== ''), 'nothing written');
});

test("Felix's chains in mangle make Weir refuse too", async () => {
  const runner = fakeKernel({ save4: FELIX4.replace('*filter', '*mangle'), ipset: '' });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  await assert.rejects(dp.checkOwnership(), (e: Error) => e instanceof PreconditionError && /cali-FORWARD/.test(e.message));
});

test("a read records own chains and sets with their members, and leaves others' objects out", async () => {
  const tools = await lazyTools({ runner: fakeKernel({ save4: KERNEL4, ipset: IPSET }), backend: 'nft', log: silentLogger() }).get();
  const { state } = await readOwn(tools, names, [4]);
  assert.deepEqual([...state.families[4].chains.keys()], ['cali-FORWARD', 'cali-stale']);
  assert.deepEqual([...state.sets.keys()].sort(), ['cali40s:a', 'cali40s:stale']);
  assert.deepEqual([...(state.sets.get('cali40s:a')?.members ?? [])], ['10.0.0.1', '10.6.6.6']);
  assert.equal(state.families[6].chains.size, 0, 'a family not read is empty');
});

test('after a counts read, a desired set whose members were kept from the record is no work; every other set and every chain desired or found is', () => {
  const found = { type: 'hash:net', family: 4, maxElem: 1048576, size: 1 } as const;
  const v4 = emptyFamilyState();
  v4.chains.set('cali-stale', []);
  const read: ReadBack = {
    state: {
      sets: new Map([
        ['cali40s:a', found],
        ['cali40s:b', found],
        ['cali40s:stale', found],
      ]),
      families: { 4: v4, 6: emptyFamilyState() },
    },
    reread: new Set(['cali40s:b']),
  };
  const want = desired({ sets: [...base.sets.values(), set('cali40s:b', 4, ['10.0.0.2'])], chains4: Object.fromEntries(base.chains[4]) });
  const counts = dirtyAfterRead(want, read, [4, 6], 'counts');
  assert.deepEqual([...counts.sets.keys()].sort(), ['cali40s:b', 'cali40s:stale', 'cali60s:a']);
  assert.deepEqual([...counts.chains[4]].sort(), ['cali-FORWARD', 'cali-stale', 'cali-x']);
  const all = dirtyAfterRead(want, read, [4, 6], 'all');
  assert.deepEqual([...all.sets.keys()].sort(), ['cali40s:a', 'cali40s:b', 'cali40s:stale', 'cali60s:a']);
});
