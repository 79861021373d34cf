// Layered writes (nf_tables) and what they owe (ledger.ts). A transaction that deletes a rule keeps
// iptables-nft-restore from exiting for an RCU grace period (docs/design/dataplane.md); one that only
// adds does not. So a change is first written as additions only, and the old rules are removed by
// a later, separate write (the tidy).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Rule } from '../../../src/calc/desired.ts';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane } from '../../../src/dataplane/dataplane.ts';
import { renderChain } from '../../../src/dataplane/render.ts';
import { recordingRunner } from '../../../src/exec/runner.ts';
import { createLedger } from '../../../src/dataplane/ledger.ts';
import { desired, accept, jump, fromSet, names, OK, fakeKernel, make, what, base, dirtyOf } from './fixtures.ts';

const changedX = desired({
  sets: [...base.sets.values()],
  chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a', 'new'), accept] },
  chains6: Object.fromEntries(base.chains[6]),
});
const removes = (payload: string) => payload.split('\n').filter((l) => /^(-D|-X|-F|-R) /.test(l) || l.startsWith(':'));

test('on nf_tables a change to a chain is written with additions only: the new rules above a RETURN that shadows the old', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  const before = renderChain('cali-x', [fromSet('cali40s:a')]).hashes;
  runner.calls.length = 0;
  dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
  const stats = await dp.apply(changedX);
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-restore']);
  const payload = runner.calls[0].input!;
  assert.deepEqual(removes(payload), [], 'nothing is flushed or deleted');
  const inserted = payload.split('\n').filter((l) => l.startsWith('-I cali-x 1 '));
  const want = renderChain('cali-x', [fromSet('cali40s:a', 'new'), accept]);
  // Inserted at the top one by one, last first: the kernel then holds new rules, RETURN, old rules.
  assert.equal(inserted.length, want.lines.length + 1);
  assert.match(inserted[0], /-j RETURN$/);
  assert.deepEqual(
    inserted.slice(1).reverse(),
    want.lines.map((l) => l.replace('-A cali-x ', '-I cali-x 1 ')),
  );
  assert.deepEqual([stats.chainsWritten, stats.rulesWritten], [1, 3]);
  assert.equal(dp.status().tidyPending, 1);
  assert.equal(dp.status().rules, 3 + 3 + before.length, 'the record holds what the kernel holds: old rules included');
});

test('the tidy rewrites a layered chain in full and leaves nothing pending', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
  await dp.apply(changedX);
  runner.calls.length = 0;
  const stats = await dp.apply(changedX, { tidy: true });
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-restore']);
  const want = renderChain('cali-x', [fromSet('cali40s:a', 'new'), accept]);
  assert.equal(runner.calls[0].input, `*mangle\n:cali-x - [0:0]\n${want.lines.join('\n')}\nCOMMIT\n`);
  assert.deepEqual([stats.chainsWritten, dp.status().tidyPending, dp.status().rules], [1, 0, 5]);
});

test('a deleted chain and the sets it used stay until the tidy, which deletes them in order', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  const next = desired({ sets: [base.sets.get('cali60s:a')!], chains4: { 'cali-FORWARD': [accept] }, chains6: Object.fromEntries(base.chains[6]) });
  dp.markDirty(dirtyOf({ sets: [['cali40s:a', 'all']], c4: ['cali-FORWARD', 'cali-x'] }));
  await dp.apply(next);
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-restore'], 'no set is destroyed while a shadowed rule names it');
  assert.deepEqual(removes(runner.calls[0].input!), []);
  assert.equal(dp.status().tidyPending, 3, 'two chains and one set');
  runner.calls.length = 0;
  const stats = await dp.apply(next, { tidy: true });
  assert.deepEqual(runner.calls.map(what), ['iptables-nft-restore', 'ipset restore']);
  assert.match(runner.calls[0].input!, /^\*mangle\n:cali-FORWARD - \[0:0\]\n:cali-x - \[0:0\]\n.*\n-X cali-x\nCOMMIT\n$/s);
  assert.equal(runner.calls[1].input, 'destroy cali40s:a\n');
  assert.deepEqual([stats.chainsDeleted, stats.setsDeleted, dp.status().tidyPending], [1, 1, 0]);
});

test('layers stack until the rules they shadow would pass maxShadowedRules; that write is made in full and tidies all that is owed', async () => {
  const runner = fakeKernel();
  const dp = createDataplane({ runner, names, families: [4, 6], backend: 'nft', log: silentLogger(), maxShadowedRules: 8 });
  const withY = (x: Rule[], y: Rule[]) =>
    desired({ sets: [...base.sets.values()], chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': x, 'cali-y': y }, chains6: Object.fromEntries(base.chains[6]) });
  const xRules = (i: number) => [fromSet('cali40s:a', `version ${i}`)];
  await dp.apply(withY(xRules(0), [accept]));
  dp.markDirty(dirtyOf({ c4: ['cali-y'] }));
  await dp.apply(withY(xRules(0), [fromSet('cali40s:a')])); // cali-y shadows 1 rule
  // Layer k of cali-x shadows all it held: 1 rule, then 3, 5, 7 (each layer a rule and its RETURN).
  for (let k = 1; k <= 4; k++) {
    runner.calls.length = 0;
    dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
    await dp.apply(withY(xRules(k), [fromSet('cali40s:a')]));
    assert.deepEqual(removes(runner.calls[0].input!), [], `layer ${k} adds only`);
  }
  assert.deepEqual([dp.status().tidyPending, dp.status().rules], [2, 3 + 3 + 9]);
  runner.calls.length = 0;
  dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
  await dp.apply(withY(xRules(5), [fromSet('cali40s:a')])); // would shadow 1 + 9 > 8
  const payload = runner.calls[0].input!;
  assert.ok(payload.includes(':cali-x - [0:0]') && payload.includes(':cali-y - [0:0]'), 'both chains rewritten in full');
  assert.deepEqual([dp.status().tidyPending, dp.status().rules], [0, 3 + 1 + 1]);
});

test('the legacy backend and a resync write in full: they replace the table, so layering would only add work', async () => {
  const runner = recordingRunner((c) => (c.cmd.endsWith('-save') || (c.cmd === 'ipset' && c.args[0] === 'save') ? OK : OK));
  const dp = createDataplane({ runner, names, families: [4, 6], backend: 'legacy', log: silentLogger() });
  await dp.apply(base);
  runner.calls.length = 0;
  dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
  await dp.apply(changedX);
  assert.ok(runner.calls[0].input!.includes(':cali-x - [0:0]'));
  assert.equal(dp.status().tidyPending, 0);
  const nft = fakeKernel();
  const dp2 = make(nft);
  await dp2.apply(base);
  nft.calls.length = 0;
  await dp2.resync(changedX);
  const restore = nft.calls.find((c) => c.cmd === 'iptables-nft-restore')!;
  assert.ok(restore.input!.includes(':cali-x - [0:0]'));
  assert.equal(dp2.status().tidyPending, 0);
});

test('a chain no longer desired in a write that has nothing to add is still owed to the tidy, with the set it used', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  const v4 = (chains: Record<string, Rule[]>, sets = [...base.sets.values()]) =>
    desired({ sets, chains4: { 'cali-FORWARD': [jump('cali-x')], ...chains }, chains6: Object.fromEntries(base.chains[6]) });
  await dp.apply(v4({ 'cali-x': [jump('cali-pol')], 'cali-pol': [fromSet('cali40s:a')] }));
  // First cali-x stops jumping to cali-pol; in a later batch cali-pol and its set go.
  dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
  await dp.apply(v4({ 'cali-x': [accept], 'cali-pol': [fromSet('cali40s:a')] }));
  runner.calls.length = 0;
  const last = v4({ 'cali-x': [accept] }, [base.sets.get('cali60s:a')!]);
  dp.markDirty(dirtyOf({ sets: [['cali40s:a', 'all']], c4: ['cali-pol'] }));
  await dp.apply(last);
  assert.equal(runner.calls.length, 0, 'nothing to add, nothing written');
  assert.equal(dp.status().tidyPending, 3, 'cali-x, cali-pol and the set');
  await dp.apply(last, { tidy: true });
  assert.match(runner.calls[0].input!, /-X cali-pol\n/);
  assert.equal(runner.calls[1].input, 'destroy cali40s:a\n');
  assert.equal(dp.status().tidyPending, 0);
});

test("the ledger spends a family's shadow budget by what its owed chains shadow now, and hands all that is owed back as work once", () => {
  const ledger = createLedger(10);
  ledger.oweChains(
    4,
    new Map([
      ['cali-x', 3],
      ['cali-y', 4],
    ]),
  );
  ledger.oweChains(4, new Map([['cali-x', 5]])); // a later layer of cali-x: it shadows 5 now
  ledger.oweSets(['cali40s:a']);
  assert.deepEqual([ledger.budget(4), ledger.budget(6), ledger.pending()], [1, 10, 3]);
  const work = ledger.settle();
  assert.deepEqual([[...work.chains[4]].sort(), [...work.chains[6]], [...work.sets]], [['cali-x', 'cali-y'], [], [['cali40s:a', 'all']]]);
  assert.deepEqual([ledger.pending(), ledger.budget(4), ledger.settle().sets.size], [0, 10, 0]);
});

test('a cleared ledger owes nothing and has its whole budget again', () => {
  const ledger = createLedger(10);
  ledger.oweChains(6, new Map([['cali-x', 7]]));
  ledger.oweSets(['cali60s:a']);
  ledger.clear();
  assert.deepEqual([ledger.pending(), ledger.budget(6), ledger.shadowed(6).size], [0, 10, 0]);
});
