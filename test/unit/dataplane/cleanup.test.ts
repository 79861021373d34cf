// Cleanup (cleanup.ts): only what carries Weir's mark goes.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane } from '../../../src/dataplane/dataplane.ts';
import { removeOwn } from '../../../src/dataplane/cleanup.ts';
import { lazyTools } from '../../../src/dataplane/tools.ts';
import { desired, accept, jump, names, fakeKernel, what, KERNEL4, ACCEPT_HOOK, IPSET, OUTPUT_HOOK, FELIX4, FELIX_SETS } from './fixtures.ts';

test('cleanup removes only own chains, the hook and own sets, reading the kernel first', async () => {
  const runner = fakeKernel({ save4: KERNEL4, ipset: IPSET });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  const stats = await dp.cleanup();
  const payload = runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  assert.equal(
    payload,
    `*mangle\n:cali-FORWARD - [0:0]\n:cali-stale - [0:0]\n-D FORWARD -m comment --comment "weir:hook" -j cali-FORWARD\n-X cali-FORWARD\n-X cali-stale\nCOMMIT\n*filter\n-D FORWARD ${ACCEPT_HOOK}\nCOMMIT\n`,
  );
  assert.equal(runner.calls.find((c) => what(c) === 'ipset restore')!.input, 'destroy cali40s:stale\ndestroy cali40s:a\n');
  assert.deepEqual(stats, { chainsDeleted: 2, hooksDeleted: 2, setsDeleted: 2 });
  assert.equal(dp.status().inSync, false);
});

test('cleanup removes an OUTPUT hook too, whatever --ipvs says; the boot guard writes it when IPVS is on', async () => {
  const runner = fakeKernel({ save4: KERNEL4.replace('-A cali-FORWARD', `-A OUTPUT ${OUTPUT_HOOK}\n-A cali-FORWARD`), ipset: '' });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  const stats = await dp.cleanup();
  const payload = runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  assert.match(payload, new RegExp(`-D OUTPUT ${OUTPUT_HOOK.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\n`));
  assert.equal(stats.hooksDeleted, 3);

  const boot = fakeKernel();
  const guarded = createDataplane({ runner: boot, names, families: [4], backend: 'nft', log: silentLogger(), ipvs: 'on' });
  assert.equal(await guarded.guard(desired({ chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [accept] } })), true);
  const written = boot.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  assert.match(written, /-I FORWARD 1 [^\n]*\n-I OUTPUT 1 -m ipvs /);
});

test("on a kernel with nothing of Weir's, cleanup writes nothing", async () => {
  const runner = fakeKernel({ save4: FELIX4, ipset: FELIX_SETS });
  const tools = await lazyTools({ runner, backend: 'nft', log: silentLogger() }).get();
  assert.deepEqual(await removeOwn(tools, names, [4, 6], silentLogger()), { chainsDeleted: 0, hooksDeleted: 0, setsDeleted: 0 });
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-save', 'iptables-nft-save', 'ip6tables-nft-save', 'ip6tables-nft-save', 'ipset save']);
});
