// The hook check (hook-check.ts): hooks and kube-ipvs0 compared with the record.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane } from '../../../src/dataplane/dataplane.ts';
import { renderChain } from '../../../src/dataplane/render.ts';
import { hooksAsRecorded } from '../../../src/dataplane/hook-check.ts';
import { ipvsMode } from '../../../src/dataplane/ipvs.ts';
import { emptyState } from '../../../src/dataplane/state.ts';
import { lazyTools } from '../../../src/dataplane/tools.ts';
import { desired, names, fakeKernel, base, ACCEPT_HOOK, OUTPUT_HOOK, savedBase, ipvsKernel, withAccept } from './fixtures.ts';

test('with --ipvs on, the first apply hooks OUTPUT at 1 too, and the hook check notices that hook moved', async () => {
  const runner = fakeKernel();
  const dp = createDataplane({ runner, names, families: [4, 6], backend: 'nft', log: silentLogger(), ipvs: 'on' });
  const stats = await dp.apply(base);
  for (const cmd of ['iptables-nft-restore', 'ip6tables-nft-restore']) {
    const payload = runner.calls.find((c) => c.cmd === cmd)!.input!;
    assert.match(
      payload,
      /-I FORWARD 1 -m comment --comment "weir:hook" -j cali-FORWARD\n-I OUTPUT 1 -m ipvs --ipvs --vdir ORIGINAL -m addrtype ! --src-type LOCAL -m comment --comment "weir:hook" -j cali-FORWARD\n/,
    );
  }
  assert.equal(stats.hooksWritten, 4);
  assert.equal(dp.status().ipvs, true);
  assert.ok(!runner.calls.some((c) => c.cmd === 'ip'), '--ipvs on never looks for kube-ipvs0');

  const k = { save4: savedBase({ output: 'first' }), ipvs0: false };
  const one = createDataplane({ runner: ipvsKernel(k), names, families: [4], backend: 'nft', log: silentLogger(), ipvs: 'on' });
  await one.apply(desired({ chains4: Object.fromEntries(base.chains[4]) }));
  assert.equal(await one.hookIntact(), true);
  k.save4 = savedBase({ output: 'second' });
  assert.equal(await one.hookIntact(), false, 'OUTPUT hook no longer first');
  k.save4 = savedBase({ output: 'none' });
  assert.equal(await one.hookIntact(), false, 'OUTPUT hook gone');
});

test('the hook check lists only the chains that hold hooks, never saving a whole table', async () => {
  const k = { save4: savedBase({ output: 'none' }), ipvs0: false };
  const runner = ipvsKernel(k);
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger(), ipvs: 'auto' });
  await dp.apply(desired({ chains4: Object.fromEntries(base.chains[4]) }));
  runner.calls.length = 0;
  assert.equal(await dp.hookIntact(), true);
  assert.deepEqual(runner.calls.map((c) => [c.cmd, ...c.args].join(' ')).sort(), [
    'ip -o link show dev kube-ipvs0',
    'iptables-nft -t filter -S FORWARD --wait=5',
    'iptables-nft -t mangle -S FORWARD --wait=5',
  ]);
});

test('with --ipvs auto the OUTPUT hook follows kube-ipvs0: added when it appears, removed when it goes, each noticed by the hook check', async () => {
  const k = { save4: savedBase({ output: 'none' }), ipvs0: false };
  const runner = ipvsKernel(k);
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger(), ipvs: 'auto' });
  const d = desired({ chains4: Object.fromEntries(base.chains[4]) });
  const first = await dp.apply(d);
  assert.equal(first.hooksWritten, 0, 'no kube-ipvs0: FORWARD only (already right)');
  assert.equal(dp.status().ipvs, false);
  assert.equal(await dp.hookIntact(), true);

  k.ipvs0 = true; // kube-proxy switched to IPVS mode
  assert.equal(await dp.hookIntact(), false, 'kube-ipvs0 appeared');
  runner.calls.length = 0;
  await dp.resync(d);
  const added = runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  assert.deepEqual(
    added.split('\n').filter((l) => l.includes('OUTPUT')),
    [`-I OUTPUT 1 ${OUTPUT_HOOK}`],
  );
  assert.equal(dp.status().ipvs, true);

  k.save4 = savedBase({ output: 'first' });
  assert.equal(await dp.hookIntact(), true);
  k.ipvs0 = false; // and back
  assert.equal(await dp.hookIntact(), false, 'kube-ipvs0 went away');
  runner.calls.length = 0;
  await dp.resync(d);
  const removed = runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  assert.deepEqual(
    removed.split('\n').filter((l) => l.includes('OUTPUT')),
    [`-D OUTPUT ${OUTPUT_HOOK}`],
  );
});

test('ACCEPT mode: the boot guard writes the accept hook; the hook check notices it moved or gone, and a resync puts it back first', async () => {
  const boot = fakeKernel();
  const guarded = createDataplane({ runner: boot, names, families: [4], backend: 'nft', log: silentLogger() });
  assert.equal(await guarded.guard(withAccept), true);
  assert.match(
    boot.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!,
    /COMMIT\n\*filter\n-I FORWARD 1 -m mark --mark 0x10000\/0x10000 -m comment --comment "weir:hook" -j ACCEPT\nCOMMIT\n$/,
  );

  const rules = [...withAccept.chains[4]].flatMap(([name, r]) => renderChain(name, r).lines);
  const kernel = (filterForward: string[]) =>
    [
      '*mangle',
      ':FORWARD ACCEPT [0:0]',
      ...[...withAccept.chains[4].keys()].map((c) => `:${c} - [0:0]`),
      '-A FORWARD -m comment --comment weir:hook -j cali-FORWARD',
      ...rules,
      'COMMIT',
      '*filter',
      ':FORWARD ACCEPT [0:0]',
      ':KUBE-FORWARD - [0:0]',
      ...filterForward.map((r) => `-A FORWARD ${r}`),
      'COMMIT',
      '',
    ].join('\n');
  const k = { save4: kernel([ACCEPT_HOOK, '-j KUBE-FORWARD']), ipvs0: false };
  const runner = ipvsKernel(k);
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  const first = await dp.apply(withAccept);
  assert.equal(first.chainsWritten + first.hooksWritten, 0, 'the kernel already holds it all');
  assert.equal(await dp.hookIntact(), true);
  k.save4 = kernel(['-j KUBE-FORWARD', ACCEPT_HOOK]);
  assert.equal(await dp.hookIntact(), false, 'kube-proxy’s jump above the accept hook');
  runner.calls.length = 0;
  await dp.resync(withAccept);
  assert.equal(
    runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!,
    `*filter\n-D FORWARD ${ACCEPT_HOOK}\n-I FORWARD 1 -m mark --mark 0x10000/0x10000 -m comment --comment "weir:hook" -j ACCEPT\nCOMMIT\n`,
  );
  k.save4 = kernel(['-j KUBE-FORWARD']);
  assert.equal(await dp.hookIntact(), false, 'accept hook gone');
});

test('against a record of no hooks, an accept hook found in filter FORWARD is a difference', async () => {
  const k = { save4: savedBase({ output: 'none' }), ipvs0: false };
  const runner = ipvsKernel(k);
  const tools = await lazyTools({ runner, backend: 'nft', log: silentLogger() }).get();
  const ipvs = ipvsMode('off', runner);
  assert.equal(await hooksAsRecorded(tools, names, [4], emptyState(), ipvs), true);
  k.save4 = `${k.save4}*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD ${ACCEPT_HOOK}\nCOMMIT\n`;
  assert.equal(await hooksAsRecorded(tools, names, [4], emptyState(), ipvs), false);
});
