// The write (apply.ts), on its own and through the dataplane: the three steps, what each writes,
// failures, and marks made while a write runs.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RestoreError } from '../../../src/errors.ts';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane, type ApplyStep } from '../../../src/dataplane/dataplane.ts';
import { emptyDirty } from '../../../src/calc/desired.ts';
import { applyDesired, type ApplyContext, type DataplaneState } from '../../../src/dataplane/apply.ts';
import { ipvsMode } from '../../../src/dataplane/ipvs.ts';
import { createLedger } from '../../../src/dataplane/ledger.ts';
import { emptyState } from '../../../src/dataplane/state.ts';
import { lazyTools } from '../../../src/dataplane/tools.ts';
import type { CommandRunner } from '../../../src/exec/runner.ts';
import { set, desired, accept, jump, fromSet, names, OK, fakeKernel, make, what, READ_KERNEL, WRITE_BASE, base, dirtyOf, OLD4, withAccept, holdingKernel } from './fixtures.ts';

test('first apply reads the kernel, creates sets, then writes one payload per family', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  const stats = await dp.apply(base);
  assert.deepEqual(runner.calls.map(what), [...READ_KERNEL, ...WRITE_BASE]);
  assert.match(runner.calls[5].input!, /^create cali40s:a .*\nadd cali40s:a 10\.0\.0\.1 -exist\ncreate cali60s:a /);
  assert.match(runner.calls[6].input!, /^\*mangle\n[^*]*--match-set cali40s:a src/);
  assert.match(runner.calls[6].input!, /-I FORWARD 1 -m comment --comment "weir:hook" -j cali-FORWARD\nCOMMIT\n$/);
  assert.deepEqual([stats.resynced, stats.setsCreated, stats.membersAdded, stats.chainsWritten, stats.rulesWritten, stats.hooksWritten], [true, 2, 2, 4, 4, 2]);
  assert.deepEqual(dp.status(), { backend: 'nft', ipvs: false, inSync: true, sets: 2, members: 2, chains: 4, rules: 4, tidyPending: 0 });
});

test('an apply with nothing dirty runs no command', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  const stats = await dp.apply(base);
  assert.equal(runner.calls.length, 0);
  assert.equal(stats.resynced, false);
});

test('an incremental change writes only the dirty chain of the dirty family, with no kernel read', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  const next = desired({
    sets: [...base.sets.values()],
    chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a'), accept] },
    chains6: Object.fromEntries(base.chains[6]),
  });
  dp.markDirty(dirtyOf({ c4: ['cali-x', 'cali-FORWARD'] }));
  const stats = await dp.apply(next);
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-restore']);
  const lines = runner.calls[0].input!.split('\n');
  assert.ok(lines.some((l) => l.startsWith('-I cali-x 1 ')));
  assert.equal(lines.filter((l) => l.includes('cali-FORWARD')).length, 0, 'the unchanged chain and the hook are left alone');
  assert.deepEqual([stats.chainsWritten, stats.rulesWritten], [1, 3], 'two rules and the RETURN above the old one');
});

test('a member change writes only that member', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  const next = desired({ sets: [set('cali40s:a', 4, ['10.0.0.2']), base.sets.get('cali60s:a')!], chains4: Object.fromEntries(base.chains[4]), chains6: Object.fromEntries(base.chains[6]) });
  dp.markDirty(dirtyOf({ sets: [['cali40s:a', ['10.0.0.1', '10.0.0.2']]] }));
  const stats = await dp.apply(next);
  assert.deepEqual(
    runner.calls.map((c) => [what(c), c.input]),
    [['ipset restore', 'del cali40s:a 10.0.0.1 -exist\nadd cali40s:a 10.0.0.2 -exist\n']],
  );
  assert.deepEqual([stats.membersAdded, stats.membersRemoved], [1, 1]);
});

test('sets are destroyed only after the chains that used them are gone', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  const next = desired({ chains4: { 'cali-FORWARD': [accept] }, chains6: { 'cali-FORWARD': [accept] } });
  dp.markDirty(
    dirtyOf({
      sets: [
        ['cali40s:a', 'all'],
        ['cali60s:a', 'all'],
      ],
      c4: ['cali-FORWARD', 'cali-x'],
      c6: ['cali-FORWARD', 'cali-x'],
    }),
  );
  const stats = await dp.apply(next, { tidy: true });
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-restore', 'ip6tables-nft-restore', 'ipset restore']);
  assert.match(runner.calls[0].input!, /-X cali-x\nCOMMIT/);
  assert.equal(runner.calls[2].input, 'destroy cali40s:a\ndestroy cali60s:a\n');
  assert.deepEqual([stats.setsDeleted, stats.chainsDeleted], [2, 2]);
});

test('a rejected payload throws, keeps the work dirty and makes the next apply read the kernel back', async () => {
  let rejectV4 = true;
  const runner = fakeKernel({}, (c) => (c.cmd === 'iptables-nft-restore' && rejectV4 ? { stdout: '', stderr: 'Error occurred at line: 3\n', exitCode: 2 } : undefined));
  const steps: [ApplyStep, boolean][] = [];
  const dp = make(runner, { step: (s, _sec, ok) => steps.push([s, ok]) });
  await assert.rejects(dp.apply(base), RestoreError);
  assert.equal(dp.status().inSync, false);
  assert.deepEqual(steps, [
    ['read', true],
    ['sets', true],
    ['chains', false],
  ]);
  rejectV4 = false;
  runner.calls.length = 0;
  const stats = await dp.apply(base);
  assert.equal(stats.resynced, true);
  assert.deepEqual(runner.calls.map(what).slice(0, 5), READ_KERNEL);
  assert.ok(runner.calls.some((c) => c.cmd === 'iptables-nft-restore' && c.input!.includes(':cali-x - [0:0]')));
});

test('a large set write goes to one ipset restore per family, side by side; a failing one fails the write and the next apply reads the kernel back', async () => {
  const v4 = Array.from({ length: 6000 }, (_, i) => `10.1.${i >> 8}.${i & 255}`);
  const v6 = Array.from({ length: 6000 }, (_, i) => `fd00::1:${i.toString(16)}`);
  const big = desired({
    sets: [set('cali40s:a', 4, v4), set('cali60s:a', 6, v6)],
    chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a')] },
    chains6: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali60s:a')] },
  });
  let failV6 = true;
  const runner = fakeKernel({}, (c) =>
    failV6 && c.cmd === 'ipset' && c.args[0] === 'restore' && c.input?.includes('cali60s:a') ? { ...OK, exitCode: 1, stderr: 'ipset v7.17: Error in line 3' } : undefined,
  );
  const dp = make(runner);
  await assert.rejects(dp.apply(big), RestoreError);
  const restores = runner.calls.filter((c) => c.cmd === 'ipset' && c.args[0] === 'restore');
  assert.equal(restores.length, 2);
  assert.ok(
    restores.every((c) => !(c.input!.includes('cali40s:') && c.input!.includes('cali60s:'))),
    'each restore holds one family',
  );
  assert.ok(!runner.calls.some((c) => c.cmd.includes('tables-nft-restore')), 'no chain is written after a failed set step');
  failV6 = false;
  runner.calls.length = 0;
  await dp.apply(big);
  assert.equal(runner.calls[0].cmd, 'iptables-nft-save', 'the retry reads the kernel back first');
  assert.equal(runner.calls.filter((c) => c.cmd === 'ipset' && c.args[0] === 'restore').length, 2);
});

test('upgrade: the first apply writes the chains in mangle, then removes the older Weir’s chains and hooks from filter and puts the accept hook first; nothing foreign', async () => {
  const runner = fakeKernel({ save4: OLD4 });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  await dp.apply(withAccept);
  const payload = runner.calls.find((c) => c.cmd === 'iptables-nft-restore')!.input!;
  const [mangle, filter] = payload.split('*filter\n');
  assert.match(mangle, /^\*mangle\n:cali-FORWARD - \[0:0\]\n[\s\S]*-I FORWARD 1 -m comment --comment "weir:hook" -j cali-FORWARD\nCOMMIT\n$/);
  assert.equal(
    filter,
    [
      ':cali-FORWARD - [0:0]',
      ':cali-x - [0:0]',
      ':cali-flushed - [0:0]',
      '-D FORWARD -m comment --comment "weir:hook" -j cali-FORWARD',
      '-D OUTPUT -m comment --comment "weir:hook" -j cali-FORWARD',
      '-X cali-FORWARD',
      '-X cali-x',
      '-X cali-flushed',
      '-I FORWARD 1 -m mark --mark 0x10000/0x10000 -m comment --comment "weir:hook" -j ACCEPT',
      'COMMIT',
      '',
    ].join('\n'),
  );
  assert.ok(!payload.includes('KUBE'));
});

test('a change made while the sets are written waits for the next write: what was written and recorded is what was planned', async () => {
  const k = holdingKernel((c) => c.cmd === 'ipset' && c.args[0] === 'restore');
  const dp = make(k.runner);
  const live = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1']), set('cali60s:a', 6, ['fd00::1'])], chains4: Object.fromEntries(base.chains[4]), chains6: Object.fromEntries(base.chains[6]) });
  await dp.apply(live);
  const members = live.sets.get('cali40s:a')!.members as Set<string>;
  members.add('10.0.0.2');
  dp.markDirty(dirtyOf({ sets: [['cali40s:a', ['10.0.0.2']]] }));
  const h = k.holdNext();
  const writing = dp.apply(live);
  await h.isHeld;
  // calc changes the same live set while the restore runs.
  members.delete('10.0.0.1');
  members.add('10.0.0.3');
  dp.markDirty(dirtyOf({ sets: [['cali40s:a', ['10.0.0.1', '10.0.0.3']]] }));
  h.release();
  const first = await writing;
  assert.deepEqual([first.membersAdded, first.membersRemoved], [1, 0]);
  assert.equal(k.calls.at(-1)!.input, 'add cali40s:a 10.0.0.2 -exist\n', 'written as planned');
  assert.equal(dp.status().members, 3, 'recorded as written: 10.0.0.1, 10.0.0.2 and fd00::1');
  const second = await dp.apply(live);
  assert.equal(k.calls.at(-1)!.input, 'del cali40s:a 10.0.0.1 -exist\nadd cali40s:a 10.0.0.3 -exist\n');
  assert.deepEqual([second.membersAdded, second.membersRemoved], [1, 1]);
});

test('a change made while a resync reads the kernel is written by that resync', async () => {
  const k = holdingKernel((c) => c.cmd === 'ipset' && c.args[0] === 'save');
  const dp = make(k.runner);
  const live = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1']), set('cali60s:a', 6, ['fd00::1'])], chains4: Object.fromEntries(base.chains[4]), chains6: Object.fromEntries(base.chains[6]) });
  const h = k.holdNext();
  const writing = dp.resync(live);
  await h.isHeld;
  (live.sets.get('cali40s:a')!.members as Set<string>).add('10.0.0.2');
  dp.markDirty(dirtyOf({ sets: [['cali40s:a', ['10.0.0.2']]] }));
  h.release();
  const stats = await writing;
  assert.match(k.calls.find((c) => c.cmd === 'ipset' && c.args[0] === 'restore')!.input!, /add cali40s:a 10\.0\.0\.2 -exist/);
  assert.equal(stats.membersAdded, 3);
  const next = await dp.apply(live);
  assert.deepEqual([next.membersAdded, next.membersRemoved, next.chainsWritten], [0, 0, 0], 'nothing left for the next write');
});

test('a set created for a new rule exists before the chains that name it are written', async () => {
  const k = holdingKernel((c) => c.cmd === 'ipset' && c.args[0] === 'restore');
  const dp = make(k.runner);
  await dp.apply(base);
  const next = desired({
    sets: [...base.sets.values(), set('cali40s:b', 4, ['10.0.0.9'])],
    chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a'), fromSet('cali40s:b')] },
    chains6: Object.fromEntries(base.chains[6]),
  });
  dp.markDirty(
    dirtyOf({
      sets: [
        ['cali40s:b', 'all'],
        ['cali40s:a', ['10.0.0.3']],
      ],
      c4: ['cali-x'],
    }),
  );
  k.calls.length = 0;
  const h = k.holdNext();
  const writing = dp.apply(next);
  await h.isHeld;
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(k.calls.map(what), [], 'nothing else runs while the set is being created');
  h.release();
  await writing;
  assert.deepEqual(k.calls.map(what), ['ipset restore', 'iptables-nft-restore']);
  assert.match(k.calls[0].input!, /^create cali40s:b /);
});

/** A write's context built by hand, over `runner`, with sets of at most 65536 members. */
function applyContext(runner: CommandRunner): ApplyContext {
  const state: DataplaneState = { applied: emptyState(), needRead: true, dirty: emptyDirty() };
  const log = silentLogger();
  return { tools: lazyTools({ runner, backend: 'nft', log }), names, families: [4, 6], maxElem: 65536, ledger: createLedger(), ipvs: ipvsMode('off', runner), state, log, now: () => 0 };
}

test('a write on its own reads the kernel into the state it is given, writes what it wants, and leaves no work behind', async () => {
  const runner = fakeKernel();
  const ctx = applyContext(runner);
  const stats = await applyDesired(ctx, base, { tidy: false });
  assert.equal(stats.resynced, true);
  assert.deepEqual([ctx.state.needRead, [...ctx.state.applied.sets.keys()].sort(), ctx.state.dirty.sets.size], [false, ['cali40s:a', 'cali60s:a'], 0]);
  assert.match(runner.calls.find((c) => what(c) === 'ipset restore')?.input ?? '', /^create cali40s:a hash:net family inet maxelem 65536 /);
});

test('a failed write on its own hands its work back to the state and asks for a kernel read', async () => {
  const runner = fakeKernel({}, (c) => (what(c) === 'ipset restore' ? { ...OK, exitCode: 1, stderr: 'ipset v7.17: Error in line 1' } : undefined));
  const ctx = applyContext(runner);
  await assert.rejects(applyDesired(ctx, base, { tidy: false }), RestoreError);
  assert.equal(ctx.state.needRead, true);
  assert.deepEqual([...ctx.state.dirty.sets.keys()].sort(), ['cali40s:a', 'cali60s:a']);
  assert.deepEqual([...ctx.state.dirty.chains[4]].sort(), ['cali-FORWARD', 'cali-x']);
});
