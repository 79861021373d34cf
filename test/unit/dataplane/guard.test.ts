// The fail-closed boot guard (guard.ts).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Rule } from '../../../src/calc/desired.ts';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane } from '../../../src/dataplane/dataplane.ts';
import { guardUnpoliced, skeletonOf } from '../../../src/dataplane/guard.ts';
import { lazyTools } from '../../../src/dataplane/tools.ts';
import { accept, desired, fromSet, jump, names, fakeKernel, KERNEL4, OLD4, withAccept } from './fixtures.ts';

test('upgrade: the boot guard leaves a node the older Weir polices from filter alone; cleanup removes Weir’s objects of both tables', async () => {
  const runner = fakeKernel({ save4: OLD4 });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  assert.equal(await dp.guard(withAccept), false);
  assert.ok(!runner.calls.some((c) => c.cmd.endsWith('-restore')));
  const stats = await dp.cleanup();
  const payload = runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  assert.ok(payload.startsWith('*filter\n'), 'nothing of Weir’s in mangle');
  assert.deepEqual(stats, { chainsDeleted: 3, hooksDeleted: 2, setsDeleted: 0 });
});

test('the skeleton holds the chains that name no set, as they were when the guard was asked for', () => {
  const want = desired({
    chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a')] },
    chains6: { 'cali-FORWARD': [jump('cali-y')], 'cali-y': [accept] },
  });
  const skeleton = skeletonOf(want);
  (want.chains[4] as Map<string, readonly Rule[]>).set('cali-late', [accept]); // calc changes its maps as it goes
  assert.deepEqual([skeleton.chains[4].map(([name]) => name), skeleton.chains[6].map(([name]) => name), skeleton.topChain], [['cali-FORWARD'], ['cali-FORWARD', 'cali-y'], 'cali-FORWARD']);
});

test('the guard writes the skeleton and the hook into a family with no Weir hook, and only there', async () => {
  const runner = fakeKernel({ save4: KERNEL4 });
  const tools = await lazyTools({ runner, backend: 'nft', log: silentLogger() }).get();
  const skeleton = skeletonOf(desired({ chains4: { 'cali-FORWARD': [accept] }, chains6: { 'cali-FORWARD': [accept] } }));
  assert.equal(await guardUnpoliced(tools, names, [4, 6], skeleton, false, silentLogger()), true);
  assert.deepEqual(
    runner.calls.filter((c) => c.cmd.endsWith('-restore')).map((c) => c.cmd),
    ['ip6tables-nft-restore'],
    'IPv4 already holds the hook',
  );
  assert.match(runner.calls.find((c) => c.cmd === 'ip6tables-nft-restore')?.input ?? '', /^\*mangle\n:cali-FORWARD - \[0:0\]\n-A cali-FORWARD [^\n]*-j ACCEPT\n-I FORWARD 1 /);
});
