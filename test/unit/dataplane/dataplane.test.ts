import { test } from 'node:test';
import assert from 'node:assert/strict';
import { emptyDirty, type Dirty, type Rule } from '../../../src/calc/desired.ts';
import { makeNames } from '../../../src/calc/names.ts';
import { PreconditionError, RestoreError } from '../../../src/errors.ts';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane, type ApplyStep } from '../../../src/dataplane/dataplane.ts';
import { recordingRunner, type RecordedCall, type RunResult } from '../../../src/exec/runner.ts';
import { renderChain } from '../../../src/dataplane/render.ts';
import { accept, desired, fromSet, jump, set } from './fixtures.ts';

const names = makeNames('cali');
const OK: RunResult = { stdout: '', stderr: '', exitCode: 0 };

/** The part of save text `iptables-save -t <table>` prints: that table's section. */
const tableOf = (text: string, args: readonly string[]) => {
  const table = args[args.indexOf('-t') + 1];
  return text
    .split(/^(?=\*)/m)
    .filter((section) => section.startsWith(`*${table}\n`))
    .join('');
};

/** What `iptables -t <table> -S <chain>` prints of save text: the policy line and that chain's rules. */
const chainOf = (text: string, args: readonly string[]) => {
  const chain = args[args.indexOf('-S') + 1];
  const rules = tableOf(text, args)
    .split('\n')
    .filter((l) => l.startsWith(`-A ${chain} `));
  return [`-P ${chain} ACCEPT`, ...rules, ''].join('\n');
};

/** Answers save and list commands (per table) with fixed kernel text and lets a test fail chosen calls. */
function fakeKernel(kernel: { save4?: string; save6?: string; ipset?: string } = {}, fail?: (c: RecordedCall) => RunResult | undefined) {
  return recordingRunner((c) => {
    const f = fail?.(c);
    if (f) return f;
    if (c.cmd === 'iptables-nft-save') return { ...OK, stdout: tableOf(kernel.save4 ?? '', c.args) };
    if (c.cmd === 'ip6tables-nft-save') return { ...OK, stdout: tableOf(kernel.save6 ?? '', c.args) };
    if (c.cmd === 'iptables-nft') return { ...OK, stdout: chainOf(kernel.save4 ?? '', c.args) };
    if (c.cmd === 'ip6tables-nft') return { ...OK, stdout: chainOf(kernel.save6 ?? '', c.args) };
    if (c.cmd === 'ipset' && c.args[0] === 'save') return { ...OK, stdout: kernel.ipset ?? '' };
    return OK;
  });
}

const make = (runner: ReturnType<typeof fakeKernel>, extra: { step?: (s: ApplyStep, sec: number, ok: boolean) => void } = {}) =>
  createDataplane({ runner, names, families: [4, 6], backend: 'nft', log: silentLogger(), onMetric: { step: extra.step } });

const what = (c: RecordedCall) => (c.cmd === 'ipset' ? `ipset ${c.args[0]}` : c.cmd);

const base = desired({
  sets: [set('cali40s:a', 4, ['10.0.0.1']), set('cali60s:a', 6, ['fd00::1'])],
  chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a')] },
  chains6: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali60s:a')] },
});

const dirtyOf = (o: { sets?: [string, string[] | 'all'][]; c4?: string[]; c6?: string[] }): Dirty => {
  const d = emptyDirty();
  for (const [n, m] of o.sets ?? []) d.sets.set(n, m === 'all' ? 'all' : new Set(m));
  for (const c of o.c4 ?? []) d.chains[4].add(c);
  for (const c of o.c6 ?? []) d.chains[6].add(c);
  return d;
};

test('first apply reads the kernel, creates sets, then writes one payload per family', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  const stats = await dp.apply(base);
  assert.deepEqual(runner.calls.map(what), [
    'iptables-nft-save',
    'ip6tables-nft-save',
    'iptables-nft-save',
    'ip6tables-nft-save',
    'ipset save',
    'ipset restore',
    'iptables-nft-restore',
    'ip6tables-nft-restore',
  ]);
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
  assert.deepEqual(runner.calls.map(what).slice(0, 5), ['iptables-nft-save', 'ip6tables-nft-save', 'iptables-nft-save', 'ip6tables-nft-save', 'ipset save']);
  assert.ok(runner.calls.some((c) => c.cmd === 'iptables-nft-restore' && c.input!.includes(':cali-x - [0:0]')));
});

const KERNEL4 = `*mangle
:PREROUTING ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:cali-FORWARD - [0:0]
:cali-stale - [0:0]
-A FORWARD -m comment --comment "flannel" -s 10.244.0.0/16 -j ACCEPT
-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD
-A cali-FORWARD -m comment --comment "weir:0123456789abcdef" -j cali-stale
-A cali-stale -m comment --comment "weir:fedcba9876543210" -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A FORWARD -m mark --mark 0x10000/0x10000 -m comment --comment weir:hook -j ACCEPT
-A KUBE-FORWARD -j ACCEPT
COMMIT
`;
const ACCEPT_HOOK = '-m mark --mark 0x10000/0x10000 -m comment --comment weir:hook -j ACCEPT';
const IPSET = `create cali40s:stale hash:net family inet hashsize 1024 maxelem 1048576 comment
add cali40s:stale 10.9.9.9
create KUBE-LOOP hash:ip family inet hashsize 1024 maxelem 65536
create cali40s:a hash:net family inet hashsize 1024 maxelem 1048576 comment
add cali40s:a 10.0.0.1
add cali40s:a 10.6.6.6
`;

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

test('resync reads the kernel again even when nothing is dirty', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  // The kernel now reports nothing at all: every object must be written again.
  const stats = await dp.resync(base);
  assert.equal(stats.resynced, true);
  assert.deepEqual(runner.calls.map(what), [
    'iptables-nft-save',
    'ip6tables-nft-save',
    'iptables-nft-save',
    'ip6tables-nft-save',
    'ipset save',
    'ipset restore',
    'iptables-nft-restore',
    'ip6tables-nft-restore',
  ]);
  assert.equal(stats.chainsWritten, 4);
});

test('a counts resync after a failed write reads every member all the same', async () => {
  let fail = true;
  const runner = fakeKernel({}, (c) => (c.cmd === 'iptables-nft-restore' && fail ? { stdout: '', stderr: 'Error occurred at line: 3\n', exitCode: 2 } : undefined));
  const dp = make(runner);
  await assert.rejects(dp.apply(base));
  fail = false;
  runner.calls.length = 0;
  await dp.resync(base, { members: 'counts' });
  assert.ok(runner.calls.some((c) => c.cmd === 'ipset' && c.args.join(' ') === 'save'));
  assert.ok(!runner.calls.some((c) => c.args.includes('-terse')));
});

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

test("concurrent applies run one after the other; only the two families' restores overlap", async () => {
  const active = new Set<string>();
  const overlaps: string[] = [];
  const runner = recordingRunner(async (call) => {
    active.add(call.cmd);
    if (active.size > 1) overlaps.push([...active].sort().join('+'));
    await new Promise((r) => setTimeout(r, 2));
    active.delete(call.cmd);
    return OK;
  });
  const dp = createDataplane({ runner, names, families: [4, 6], backend: 'nft', log: silentLogger() });
  await Promise.all([dp.apply(base), dp.resync(base), dp.apply(base)]);
  assert.ok(overlaps.length > 0, 'the v4 and v6 payloads are written side by side');
  for (const o of overlaps) assert.ok(['ip6tables-nft-restore+iptables-nft-restore', 'ip6tables-nft-save+iptables-nft-save'].includes(o), o);
});

// Felix names its chains and sets exactly like Weir's default prefix does: only the mark (rule
// comments "weir:", sets created with the comment extension) tells them apart.
const FELIX4 = `*filter
:FORWARD ACCEPT [0:0]
:cali-FORWARD - [0:0]
:cali-tw-cali12345 - [0:0]
:cali-empty - [0:0]
-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
-A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j cali-tw-cali12345
-A cali-tw-cali12345 -m comment --comment "cali:abcdabcdabcdabcd" -j ACCEPT
COMMIT
`;
const FELIX_SETS = `create cali40s:felix hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x1
add cali40s:felix 10.1.1.1
`;

test("chains and sets named like Weir's that Weir did not write make it refuse, and are never deleted", async () => {
  const runner = fakeKernel({ save4: FELIX4, ipset: FELIX_SETS });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  await assert.rejects(dp.checkOwnership(), (e: Error) => e instanceof PreconditionError && /cali-FORWARD/.test(e.message) && /cali40s:felix/.test(e.message) && /cali-empty/.test(e.message));
  await assert.rejects(dp.apply(base), PreconditionError);
  const stats = await dp.cleanup();
  assert.deepEqual(stats, { chainsDeleted: 0, hooksDeleted: 0, setsDeleted: 0 });
  assert.ok(!runner.calls.some((c) => c.cmd.endsWith('-restore') && c.input !== undefined && c.input.trim() !== ''), 'nothing written');
});

// ---- IPVS: kube-proxy's IPVS mode forwards Service traffic INPUT -> OUTPUT, never FORWARD ----

const OUTPUT_HOOK = '-m ipvs --ipvs --vdir ORIGINAL -m addrtype ! --src-type LOCAL -m comment --comment "weir:hook" -j cali-FORWARD';

/** What iptables-save prints once `base` (IPv4) is written, with the hooks given. */
function savedBase(hooks: { forward?: boolean; output?: 'first' | 'second' | 'none' }): string {
  const rules = [...base.chains[4]].flatMap(([name, r]) => renderChain(name, r).lines);
  const output = ['-A OUTPUT -j KUBE-FIREWALL'];
  if (hooks.output === 'first') output.unshift(`-A OUTPUT ${OUTPUT_HOOK}`);
  if (hooks.output === 'second') output.push(`-A OUTPUT ${OUTPUT_HOOK}`);
  return [
    '*mangle',
    ':INPUT ACCEPT [0:0]',
    ':FORWARD ACCEPT [0:0]',
    ':OUTPUT ACCEPT [0:0]',
    ':KUBE-FIREWALL - [0:0]',
    ':cali-FORWARD - [0:0]',
    ':cali-x - [0:0]',
    ...(hooks.forward === false ? [] : ['-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD']),
    ...output,
    ...rules,
    'COMMIT',
    '',
  ].join('\n');
}

/** A kernel for IPv4 whose save text and kube-ipvs0 presence the test sets as it goes. */
function ipvsKernel(k: { save4: string; ipvs0: boolean }) {
  return recordingRunner((c) => {
    if (c.cmd === 'iptables-nft-save') return { ...OK, stdout: tableOf(k.save4, c.args) };
    if (c.cmd === 'iptables-nft') return { ...OK, stdout: chainOf(k.save4, c.args) };
    if (c.cmd === 'ip' && c.args.join(' ') === '-o link show dev kube-ipvs0') {
      return k.ipvs0 ? { ...OK, stdout: '9: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN\n' } : { ...OK, exitCode: 1, stderr: 'Device "kube-ipvs0" does not exist.\n' };
    }
    return OK;
  });
}

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

test('the hook check reads beside a running write instead of after it, and calls a difference drift only if it outlasts the write', async () => {
  const k = { save4: savedBase({ output: 'none' }), ipvs0: false };
  const inner = ipvsKernel(k);
  let hold: Promise<void> | undefined;
  let release = () => {};
  // The next iptables-nft-restore after `hold` is set waits for release(): a change's write (the
  // hook check never restores).
  const runner = {
    ...inner,
    async run(cmd: string, args: readonly string[], opts?: { input?: string }) {
      if (cmd === 'iptables-nft-restore' && hold !== undefined) {
        const h = hold;
        hold = undefined;
        await h;
      }
      return inner.run(cmd, args, opts);
    },
  };
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger(), ipvs: 'auto' });
  const chains = Object.fromEntries(base.chains[4]);
  await dp.apply(desired({ chains4: chains }));
  // A change: cali-x with its first rule repeated n more times.
  const change = (n: number) => {
    dp.markDirty(dirtyOf({ c4: ['cali-x'] }));
    return dp.apply(desired({ chains4: { ...chains, 'cali-x': [...chains['cali-x'], ...Array.from({ length: n }, () => chains['cali-x'][0])] } }));
  };
  const waited = (p: Promise<boolean>) => Promise.race([p, new Promise<'still waiting'>((r) => setTimeout(() => r('still waiting'), 100))]);

  hold = new Promise((r) => (release = r));
  const writing = change(1);
  assert.equal(await waited(dp.hookIntact()), true, 'answered while the write is held: the kernel is as recorded');
  assert.equal(hold, undefined, 'the write was under way');
  release();
  await writing;

  k.save4 = savedBase({ forward: false, output: 'none' }); // and now the FORWARD hook is gone
  hold = new Promise((r) => (release = r));
  const writing2 = change(2);
  const check = dp.hookIntact();
  assert.equal(await waited(check), 'still waiting', 'a difference is confirmed once the write is done');
  release();
  await writing2;
  assert.equal(await check, false, 'still different after the write: drift');
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

// ---- Upgrade: an older Weir policed from the filter table -----------------------------------

const OLD4 = `*mangle
:PREROUTING ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:cali-FORWARD - [0:0]
:cali-x - [0:0]
:cali-flushed - [0:0]
-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD
-A FORWARD -j KUBE-FORWARD
-A OUTPUT -m comment --comment "weir:hook" -j cali-FORWARD
-A KUBE-FORWARD -j ACCEPT
-A cali-FORWARD -m comment --comment "weir:0123456789abcdef" -j cali-x
-A cali-FORWARD -m comment --comment "weir:0123456789abcdee" -j cali-flushed
-A cali-x -m comment --comment "weir:fedcba9876543210" -j ACCEPT
COMMIT
`;
/** ACCEPT mode's desired chains: the top chain and the accept chain, as calc builds them. */
const withAccept = desired({
  chains4: {
    'cali-FORWARD': [jump('cali-x'), { matches: [{ kind: 'mark', value: 0x10000, mask: 0x10000 }], action: { kind: 'accept' } }],
    'cali-x': [{ matches: [], action: { kind: 'goto', chain: 'cali-accept' } }],
    'cali-accept': [{ matches: [], action: { kind: 'setMark', value: 0x10000, mask: 0x10000 } }, accept],
  },
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

test("Felix's chains in mangle make Weir refuse too", async () => {
  const runner = fakeKernel({ save4: FELIX4.replace('*filter', '*mangle'), ipset: '' });
  const dp = createDataplane({ runner, names, families: [4], backend: 'nft', log: silentLogger() });
  await assert.rejects(dp.checkOwnership(), (e: Error) => e instanceof PreconditionError && /cali-FORWARD/.test(e.message));
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

// ---- Layered writes (nf_tables) ------------------------------------------------------------
// A transaction that deletes a rule keeps iptables-nft-restore from exiting for an RCU grace
// period (10-20 ms); one that only adds does not. So a change is first written as additions
// only, and the old rules are removed by a later, separate write (the tidy).

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

/** A fake kernel whose next command named `cmd` waits until `release()`; `held` resolves once it waits. */
function holdingKernel(cmd: (c: RecordedCall) => boolean) {
  const inner = fakeKernel();
  let hold: { held: () => void; release: Promise<void> } | undefined;
  const runner = {
    ...inner,
    async run(c: string, args: readonly string[], opts?: { input?: string }) {
      const h = hold;
      if (h !== undefined && cmd({ cmd: c, args: [...args], input: opts?.input })) {
        hold = undefined;
        h.held();
        await h.release;
      }
      return inner.run(c, args, opts);
    },
  };
  const holdNext = () => {
    let release = () => {};
    let held = () => {};
    const isHeld = new Promise<void>((r) => (held = r));
    hold = { held, release: new Promise<void>((r) => (release = r)) };
    return { isHeld, release: () => release() };
  };
  return { runner, calls: inner.calls, holdNext };
}

test('a change made while the sets are written waits for the next write: what was written and recorded is what was planned', async () => {
  const k = holdingKernel((c) => c.cmd === 'ipset' && c.args[0] === 'restore');
  const dp = make(k.runner as unknown as ReturnType<typeof fakeKernel>);
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
  const dp = make(k.runner as unknown as ReturnType<typeof fakeKernel>);
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
  const dp = make(k.runner as unknown as ReturnType<typeof fakeKernel>);
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
