import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Rule } from '../../../src/calc/desired.ts';
import { commitChains, commitSetChanges, planChains, planSets, type SetsPlanOptions } from '../../../src/dataplane/plan.ts';
import { acceptHookSpec, hookSpec, hooksFor, ipsetPayload, renderChain, type SetLine } from '../../../src/dataplane/render.ts';
import { emptyFamilyState, noLeftovers, type AppliedSet, type FamilyState, type HookState } from '../../../src/dataplane/state.ts';
import { accept, desired, fromSet, jump, set } from './fixtures.ts';

const opts: SetsPlanOptions = { maxElem: 1000, tmpName: (f) => `cali${f}0s:tmp` };
/** A record as a kernel read leaves it: members and their number. */
const applied = (entries: [string, Omit<AppliedSet, 'members' | 'size'> & { members: string[] }][]): Map<string, AppliedSet> =>
  new Map(entries.map(([n, s]) => [n, { ...s, size: s.members.length, members: new Set(s.members) }]));
/** A record as writes leave it: the size alone. */
const recorded = (entries: [string, Omit<AppliedSet, 'members'>][]): Map<string, AppliedSet> => new Map(entries);
const v4net = { type: 'hash:net', family: 4 as const, maxElem: 1000 };
/** The restore text's lines: a set's adds or deletes come as one entry of many. */
const textLines = (lines: readonly SetLine[]) => ipsetPayload(lines).split('\n').slice(0, -1);

test('planSets: a new set is created, then filled by one entry of its adds', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1', '10.0.0.0/24'])] });
  const p = planSets(d, new Map([['cali40s:a', 'all']]), new Map(), opts);
  assert.deepEqual(textLines(p.lines), ['create cali40s:a hash:net family inet maxelem 1000 comment -exist', 'add cali40s:a 10.0.0.1 -exist', 'add cali40s:a 10.0.0.0/24 -exist']);
  assert.equal(p.lines.length, 2, "the set's adds are one entry");
  assert.deepEqual([p.created, p.added, p.removed, p.destroyLines.length], [1, 2, 0, 0]);
});

test('planSets: dirty members are added when wanted and deleted when not, others left alone; the record keeps the size', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1', '10.0.0.2', '10.0.0.9'])] });
  const have = recorded([['cali40s:a', { ...v4net, size: 3 }]]);
  // 10.0.0.9 is not dirty: an incremental apply trusts that the kernel holds it.
  const p = planSets(d, new Map([['cali40s:a', new Set(['10.0.0.1', '10.0.0.2', '10.0.0.3'])]]), have, opts);
  assert.deepEqual(textLines(p.lines), ['del cali40s:a 10.0.0.3 -exist', 'add cali40s:a 10.0.0.1 -exist', 'add cali40s:a 10.0.0.2 -exist']);
  commitSetChanges(have, p.changes);
  assert.deepEqual(have.get('cali40s:a'), { ...v4net, size: 3 });
});

test('planSets: the write after a kernel read diffs against the members read, and the record then drops them', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1', '10.0.0.2'])] });
  const have = applied([['cali40s:a', { ...v4net, members: ['10.0.0.2', '10.0.0.3', '10.0.0.4'] }]]);
  const p = planSets(d, new Map([['cali40s:a', 'all']]), have, opts);
  assert.deepEqual(textLines(p.lines), ['del cali40s:a 10.0.0.3 -exist', 'del cali40s:a 10.0.0.4 -exist', 'add cali40s:a 10.0.0.1 -exist']);
  commitSetChanges(have, p.changes);
  assert.deepEqual(have.get('cali40s:a'), { ...v4net, size: 2 });
});

test('planSets: a set dirty as a whole with no members read is rebuilt and swapped in, never diffed blind', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1'])] });
  const have = recorded([['cali40s:a', { ...v4net, size: 5 }]]);
  const p = planSets(d, new Map([['cali40s:a', 'all']]), have, opts);
  assert.deepEqual(textLines(p.lines), ['create cali40s:tmp hash:net family inet maxelem 1000 comment -exist', 'add cali40s:tmp 10.0.0.1 -exist', 'swap cali40s:tmp cali40s:a', 'destroy cali40s:tmp']);
  commitSetChanges(have, p.changes);
  assert.deepEqual(have.get('cali40s:a'), { ...v4net, size: 1 });
});

test("planSets: 'all' diffs the whole set", () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1', '10.0.0.2'])] });
  const have = applied([['cali40s:a', { ...v4net, members: ['10.0.0.2', '10.0.0.3'] }]]);
  const p = planSets(d, new Map([['cali40s:a', 'all']]), have, opts);
  assert.deepEqual(textLines(p.lines), ['del cali40s:a 10.0.0.3 -exist', 'add cali40s:a 10.0.0.1 -exist']);
});

test("planSets: a member whose text differs from the kernel's form is deleted, then added back: never left out", () => {
  const d = desired({ sets: [set('cali60s:a', 6, ['fd00::0:3'])] });
  const have = applied([['cali60s:a', { type: 'hash:net', family: 6, maxElem: 1000, members: ['fd00::3'] }]]);
  assert.deepEqual(textLines(planSets(d, new Map([['cali60s:a', 'all']]), have, opts).lines), ['del cali60s:a fd00::3 -exist', 'add cali60s:a fd00::0:3 -exist']);
});

test('planSets: a host prefix written by calc equals the bare address read back', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1/32'])] });
  const have = applied([['cali40s:a', { ...v4net, members: ['10.0.0.1'] }]]);
  assert.deepEqual(textLines(planSets(d, new Map([['cali40s:a', 'all']]), have, opts).lines), []);
});

test('planSets: sets no longer desired are destroyed in step 3, not step 1', () => {
  const have = applied([['cali40s:old', { ...v4net, members: ['10.0.0.1'] }]]);
  const p = planSets(
    desired({}),
    new Map([
      ['cali40s:old', 'all'],
      ['cali40s:never', 'all'],
    ]),
    have,
    opts,
  );
  assert.deepEqual(textLines(p.lines), []);
  assert.deepEqual(p.destroyLines, ['destroy cali40s:old']);
  assert.deepEqual(p.destroyed, ['cali40s:old']);
});

test('planSets: a set with another maxelem is rebuilt by swap, keeping its name referenced', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1'])] });
  const have = applied([['cali40s:a', { ...v4net, maxElem: 65536, members: ['10.0.0.7'] }]]);
  const p = planSets(d, new Map([['cali40s:a', new Set(['10.0.0.1'])]]), have, opts);
  assert.deepEqual(textLines(p.lines), ['create cali40s:tmp hash:net family inet maxelem 1000 comment -exist', 'add cali40s:tmp 10.0.0.1 -exist', 'swap cali40s:tmp cali40s:a', 'destroy cali40s:tmp']);
  commitSetChanges(have, p.changes);
  assert.deepEqual(have.get('cali40s:a'), { type: 'hash:net', family: 4, maxElem: 1000, size: 1 });
});

test('planSets: a set of another type is destroyed and recreated', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1,tcp:80'], 'hash:ip,port')] });
  const have = applied([['cali40s:a', { ...v4net, members: [] }]]);
  const p = planSets(d, new Map([['cali40s:a', 'all']]), have, opts);
  assert.deepEqual(textLines(p.lines), ['destroy cali40s:a', 'create cali40s:a hash:ip,port family inet maxelem 1000 comment -exist', 'add cali40s:a 10.0.0.1,tcp:80 -exist']);
});

test('planSets: a scratch set left by a crash is destroyed first and never in step 3', () => {
  const have = applied([['cali40s:tmp', { ...v4net, members: [] }]]);
  const p = planSets(desired({}), new Map([['cali40s:tmp', 'all']]), have, opts);
  assert.deepEqual(textLines(p.lines), ['destroy cali40s:tmp']);
  assert.deepEqual(p.destroyLines, []);
  commitSetChanges(have, p.changes);
  assert.equal(have.size, 0);
});

const chains = (o: Record<string, Rule[]>) => new Map(Object.entries(o));
const NO_HOOK = { specs: [], atTop: false };
const stateWith = (o: Record<string, Rule[]>, forward: HookState = NO_HOOK, output: HookState = NO_HOOK): FamilyState => ({
  chains: new Map(Object.entries(o).map(([n, r]) => [n, renderChain(n, r).hashes])),
  hooks: { FORWARD: forward, OUTPUT: output },
  acceptHook: NO_HOOK,
  leftovers: noLeftovers(),
});
const goodHook = { specs: [hookSpec('cali-FORWARD')], atTop: true };
/** The hooks of a node without IPVS: FORWARD only. */
const fwd = (top: string) => hooksFor(top, false);
const body = (payload: string | undefined) => payload?.split('\n').filter((l) => l !== '*mangle' && l !== '*filter' && l !== 'COMMIT' && l !== '');

test('planChains: first write declares every chain before any rule, then inserts the hook', () => {
  const want = chains({ 'cali-FORWARD': [jump('cali-a')], 'cali-a': [accept] });
  const p = planChains(want, fwd('cali-FORWARD'), new Set(want.keys()), emptyFamilyState());
  const lines = body(p.payload)!;
  assert.deepEqual(lines.slice(0, 2), [':cali-FORWARD - [0:0]', ':cali-a - [0:0]']);
  assert.match(lines[2], /^-A cali-FORWARD .*-j cali-a$/);
  assert.match(lines[3], /^-A cali-a .*-j ACCEPT$/);
  assert.equal(lines[4], '-I FORWARD 1 -m comment --comment "weir:hook" -j cali-FORWARD');
  assert.equal(lines.length, 5);
  assert.deepEqual([p.written.size, p.rules, p.deleted.length], [2, 2, 0]);
});

test('planChains: an unchanged dirty chain is not written; a changed one is', () => {
  const want = chains({ 'cali-FORWARD': [jump('cali-a')], 'cali-a': [accept, accept] });
  const state = stateWith({ 'cali-FORWARD': [jump('cali-a')], 'cali-a': [accept] }, goodHook);
  const p = planChains(want, fwd('cali-FORWARD'), new Set(want.keys()), state);
  assert.deepEqual([...p.written.keys()], ['cali-a']);
  assert.equal(body(p.payload)!.filter((l) => l.includes('cali-FORWARD')).length, 0);
  commitChains(state, p);
  assert.equal(planChains(want, fwd('cali-FORWARD'), new Set(want.keys()), state).payload, undefined);
});

test('planChains: a chain no longer desired is flushed first and deleted last, after the rewrite of its user', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const state = stateWith({ 'cali-FORWARD': [jump('cali-old')], 'cali-old': [accept] }, goodHook);
  const lines = body(planChains(want, fwd('cali-FORWARD'), new Set(['cali-FORWARD', 'cali-old']), state).payload)!;
  assert.deepEqual(lines.slice(0, 2), [':cali-FORWARD - [0:0]', ':cali-old - [0:0]']);
  assert.equal(lines.at(-1), '-X cali-old');
  assert.ok(lines.indexOf('-X cali-old') > lines.findIndex((l) => l.startsWith('-A cali-FORWARD')));
});

test('planChains: a misplaced or duplicated hook is deleted by spec and inserted at 1', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const spec = hookSpec('cali-FORWARD');
  const state = stateWith({ 'cali-FORWARD': [accept] }, { specs: [spec, spec], atTop: false });
  const p = planChains(want, fwd('cali-FORWARD'), new Set(), state);
  assert.deepEqual(body(p.payload), [`-D FORWARD ${spec}`, `-D FORWARD ${spec}`, `-I FORWARD 1 ${spec}`]);
  assert.deepEqual(p.hooks.get('FORWARD'), goodHook);
});

test('planChains: a hook pointing at an old top chain is replaced before that chain is deleted', () => {
  const want = chains({ 'cali-NEW': [accept] });
  const state = stateWith({ 'cali-FORWARD': [accept] }, goodHook);
  const lines = body(planChains(want, fwd('cali-NEW'), new Set(['cali-NEW', 'cali-FORWARD']), state).payload)!;
  const del = lines.indexOf(`-D FORWARD ${hookSpec('cali-FORWARD')}`);
  assert.ok(del >= 0 && del < lines.indexOf('-X cali-FORWARD'));
  assert.ok(lines.includes(`-I FORWARD 1 ${hookSpec('cali-NEW')}`));
});

test('planChains: with no top chain desired the hook is removed and none inserted', () => {
  const state = stateWith({}, goodHook);
  const p = planChains(chains({}), fwd('cali-FORWARD'), new Set(), state);
  assert.deepEqual(body(p.payload), [`-D FORWARD ${hookSpec('cali-FORWARD')}`]);
  assert.deepEqual(p.hooks.get('FORWARD'), NO_HOOK);
});

test('planChains: an own chain edited by someone else (unknown hashes) is rewritten', () => {
  const want = chains({ 'cali-FORWARD': [fromSet('cali40s:a')] });
  const state: FamilyState = { ...stateWith({}, goodHook), chains: new Map([['cali-FORWARD', ['?']]]) };
  const p = planChains(want, fwd('cali-FORWARD'), new Set(['cali-FORWARD']), state);
  assert.deepEqual([...p.written.keys()], ['cali-FORWARD']);
});

const [, outputHook] = hooksFor('cali-FORWARD', true);
const goodOutput = { specs: [outputHook.spec], atTop: true };

test('planChains: with IPVS the OUTPUT hook is inserted at 1 beside the FORWARD hook, both to the top chain', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const lines = body(planChains(want, hooksFor('cali-FORWARD', true), new Set(want.keys()), emptyFamilyState()).payload)!;
  assert.deepEqual(lines.slice(-2), [`-I FORWARD 1 ${hookSpec('cali-FORWARD')}`, `-I OUTPUT 1 ${outputHook.spec}`]);
});

test('planChains: a moved OUTPUT hook is put back first; a right one is left alone', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const moved = stateWith({ 'cali-FORWARD': [accept] }, goodHook, { specs: [outputHook.spec], atTop: false });
  const p = planChains(want, hooksFor('cali-FORWARD', true), new Set(), moved);
  assert.deepEqual(body(p.payload), [`-D OUTPUT ${outputHook.spec}`, `-I OUTPUT 1 ${outputHook.spec}`]);
  assert.deepEqual([...p.hooks], [['OUTPUT', goodOutput]]);
  commitChains(moved, p);
  assert.equal(planChains(want, hooksFor('cali-FORWARD', true), new Set(), moved).payload, undefined);
});

test('planChains: without IPVS an OUTPUT hook left from IPVS mode is removed, the FORWARD hook kept', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const p = planChains(want, fwd('cali-FORWARD'), new Set(), stateWith({ 'cali-FORWARD': [accept] }, goodHook, goodOutput));
  assert.deepEqual(body(p.payload), [`-D OUTPUT ${outputHook.spec}`]);
  assert.deepEqual([...p.hooks], [['OUTPUT', NO_HOOK]]);
});

const MARK = 0x10000;
const acceptHook = { specs: [acceptHookSpec(MARK)], atTop: true };

test('planChains: the chains and hooks go in mangle; with ACCEPT the accept hook goes first in filter FORWARD, after mangle', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const p = planChains(want, fwd('cali-FORWARD'), new Set(want.keys()), emptyFamilyState(), MARK);
  assert.deepEqual(p.payload!.split('\n'), [
    '*mangle',
    ':cali-FORWARD - [0:0]',
    ...renderChain('cali-FORWARD', [accept]).lines,
    `-I FORWARD 1 ${hookSpec('cali-FORWARD')}`,
    'COMMIT',
    '*filter',
    '-I FORWARD 1 -m mark --mark 0x10000/0x10000 -m comment --comment "weir:hook" -j ACCEPT',
    'COMMIT',
    '',
  ]);
  assert.deepEqual(p.acceptHook, acceptHook);
});

test('planChains: a right accept hook is left alone (quotes as the backend prints them), a moved one put back first, and it goes in RETURN mode', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const right = { ...stateWith({ 'cali-FORWARD': [accept] }, goodHook), acceptHook: { specs: [acceptHookSpec(MARK).replace(/"/g, '')], atTop: true } };
  assert.equal(planChains(want, fwd('cali-FORWARD'), new Set(), right, MARK).payload, undefined);
  const moved = { ...right, acceptHook: { specs: [acceptHookSpec(MARK)], atTop: false } };
  const p = planChains(want, fwd('cali-FORWARD'), new Set(), moved, MARK);
  assert.deepEqual(body(p.payload), [`-D FORWARD ${acceptHookSpec(MARK)}`, `-I FORWARD 1 ${acceptHookSpec(MARK)}`]);
  commitChains(moved, p);
  assert.equal(planChains(want, fwd('cali-FORWARD'), new Set(), moved, MARK).payload, undefined);
  const returnMode = planChains(want, fwd('cali-FORWARD'), new Set(), right);
  assert.deepEqual(body(returnMode.payload), [`-D FORWARD ${acceptHookSpec(MARK).replace(/"/g, '')}`]);
  assert.deepEqual(returnMode.acceptHook, NO_HOOK);
});

test('planChains: an older Weir’s chains and hooks in filter are removed after mangle is written, and only once', () => {
  const want = chains({ 'cali-FORWARD': [accept] });
  const state: FamilyState = {
    ...stateWith({}),
    leftovers: { chains: ['cali-FORWARD', 'cali-tw-x'], hooks: [{ chain: 'FORWARD', spec: hookSpec('cali-FORWARD') }] },
  };
  const p = planChains(want, fwd('cali-FORWARD'), new Set(want.keys()), state, MARK);
  const filter = p.payload!.split('*filter\n')[1].split('\n');
  assert.deepEqual(filter, [
    ':cali-FORWARD - [0:0]',
    ':cali-tw-x - [0:0]',
    `-D FORWARD ${hookSpec('cali-FORWARD')}`,
    '-X cali-FORWARD',
    '-X cali-tw-x',
    `-I FORWARD 1 ${acceptHookSpec(MARK)}`,
    'COMMIT',
    '',
  ]);
  assert.ok(p.payload!.startsWith('*mangle\n'));
  commitChains(state, p);
  assert.deepEqual(state.leftovers, noLeftovers());
  assert.equal(planChains(want, fwd('cali-FORWARD'), new Set(), state, MARK).payload, undefined);
});

test('planSets: lines by family, each in order, and whole in family order', () => {
  const d = desired({ sets: [set('cali40s:a', 4, ['10.0.0.1']), set('cali60s:a', 6, ['fd00::1'])] });
  const have = applied([['cali40s:tmp', { ...v4net, members: [] }]]);
  const p = planSets(
    d,
    new Map([
      ['cali60s:a', 'all'],
      ['cali40s:a', 'all'],
    ]),
    have,
    opts,
  );
  assert.deepEqual(textLines(p.byFamily[4]), ['destroy cali40s:tmp', 'create cali40s:a hash:net family inet maxelem 1000 comment -exist', 'add cali40s:a 10.0.0.1 -exist']);
  assert.deepEqual(textLines(p.byFamily[6]), ['create cali60s:a hash:net family inet6 maxelem 1000 comment -exist', 'add cali60s:a fd00::1 -exist']);
  assert.deepEqual(p.lines, [...p.byFamily[4], ...p.byFamily[6]]);
});
