// The dataplane against real kernels: every case runs in a fresh network namespace (never the
// root one), for each iptables backend installed, and reads the result back with
// iptables-save and ipset save.

import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execa } from 'execa';
import { emptyDirty, type DesiredDataplane, type Rule } from '../../src/calc/desired.ts';
import { makeNames } from '../../src/calc/names.ts';
import { CommandError, RestoreError } from '../../src/errors.ts';
import { silentLogger } from '../../src/log.ts';
import { createNs, deleteAllNs, deleteNs, uniquePrefix } from '../../src/sim/netns.ts';
import { createDataplane, type Dataplane } from '../../src/dataplane/dataplane.ts';
import type { Backend } from '../../src/dataplane/iptables.ts';
import { createIpset } from '../../src/dataplane/ipset.ts';
import { setCreate, setMemberLines } from '../../src/dataplane/render.ts';
import { processRunner, netnsRunner, recordingRunner, runOk, type CommandRunner } from '../../src/exec/runner.ts';
import { desired, set } from '../unit/dataplane/fixtures.ts';

const nsPrefix = uniquePrefix('wd');
after(() => deleteAllNs(nsPrefix));

const have = async (bin: string) => (await execa('sh', ['-c', `command -v ${bin}`], { reject: false })).exitCode === 0;
const isRoot = process.getuid?.() === 0;
const backends: Backend[] = [];
for (const b of ['nft', 'legacy'] as const) {
  if (isRoot && (await have(`iptables-${b}-restore`)) && (await have(`ip6tables-${b}-restore`)) && (await have('ipset'))) backends.push(b);
}

let seq = 0;
/** Runs fn in a fresh namespace and deletes it afterwards, whatever happens. */
async function inFreshNs(fn: (runner: CommandRunner) => Promise<void>): Promise<void> {
  const ns = `${nsPrefix}${seq++}`;
  await createNs(ns);
  try {
    await fn(netnsRunner(ns, processRunner()));
  } finally {
    await deleteNs(ns);
  }
}

// ---- The desired dataplane used throughout -------------------------------------------------

const names = makeNames('cali');
const web4 = names.peerSet(4, 'ns:web');
const web6 = names.peerSet(6, 'ns:web');
const http4 = names.peerSet(4, 'np:http');
const pol = names.policyIngress('default/allow-web');
const tw = names.toWorkload('default/web-1');
const ACCEPT_MARK = 0x10000;

const workloadChain: Rule[] = [
  { matches: [{ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }], action: { kind: 'accept' } },
  { matches: [{ kind: 'ctstate', states: ['INVALID'] }], action: { kind: 'drop' } },
  { matches: [], action: { kind: 'setMark', value: 0, mask: 0x30000 } },
  { matches: [], action: { kind: 'jump', chain: pol } },
  { matches: [{ kind: 'mark', value: ACCEPT_MARK, mask: ACCEPT_MARK }], action: { kind: 'return' } },
  { matches: [], action: { kind: 'drop' }, comment: 'no policy allowed it' },
];
const policyChain = (peer: string, extra: Rule[] = []): Rule[] => [
  {
    matches: [
      { kind: 'set', set: peer, dir: 'src' },
      {
        kind: 'proto',
        protocol: 'TCP',
        dports: [
          { from: 80, to: 80 },
          { from: 8000, to: 8100 },
        ],
      },
    ],
    action: { kind: 'setMark', value: ACCEPT_MARK, mask: ACCEPT_MARK },
    comment: 'policy default/allow-web ingress rule 0',
  },
  ...extra,
];
const namedPort: Rule = { matches: [{ kind: 'set', set: http4, dir: 'dst,dst' }], action: { kind: 'setMark', value: ACCEPT_MARK, mask: ACCEPT_MARK } };

function base(policy4: Rule[] = policyChain(web4, [namedPort])): DesiredDataplane {
  return desired({
    sets: [set(web4, 4, ['10.244.1.0/24', '10.244.2.7']), set(web6, 6, ['fd00:244::/64']), set(http4, 4, ['10.244.1.5,tcp:8080'], 'hash:ip,port')],
    chains4: {
      [names.forward]: [{ matches: [], action: { kind: 'jump', chain: names.toWorkloadDispatch } }],
      [names.toWorkloadDispatch]: [{ matches: [{ kind: 'addr', dir: 'dst', cidr: '10.244.1.5/32' }], action: { kind: 'goto', chain: tw } }],
      [tw]: workloadChain,
      [pol]: policy4,
    },
    chains6: {
      [names.forward]: [{ matches: [], action: { kind: 'jump', chain: names.toWorkloadDispatch } }],
      [names.toWorkloadDispatch]: [{ matches: [{ kind: 'addr', dir: 'dst', cidr: 'fd00:244::5/128' }], action: { kind: 'goto', chain: tw } }],
      [tw]: workloadChain,
      [pol]: policyChain(web6),
    },
    top: names.forward,
  });
}

// ---- Reading the kernel back ----------------------------------------------------------------

const ipt = (b: Backend, family: 4 | 6) => `${family === 4 ? 'iptables' : 'ip6tables'}-${b}`;

/** One table as iptables-save prints it, without comments and counters. */
async function tableLines(runner: CommandRunner, b: Backend, family: 4 | 6, table: 'mangle' | 'filter' = 'mangle'): Promise<string[]> {
  const out = await runOk(runner, `${ipt(b, family)}-save`, ['-t', table]);
  return out
    .split('\n')
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ' [0:0]'));
}

/** Own lines only, with rule hashes replaced, so expected text can be written by hand. */
const own = (lines: string[]) => lines.filter((l) => l.includes('cali')).map((l) => l.replace(/weir:[A-Za-z0-9_-]{16}/g, 'weir:HASH'));

/** `ipset save` without the per-boot header fields; members sorted within each set. */
async function ipsetLines(runner: CommandRunner): Promise<string[]> {
  const out = await runOk(runner, 'ipset', ['save']);
  return out
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.replace(/ (hashsize|bucketsize|initval) \S+/g, ''))
    .sort();
}

interface Snapshot {
  readonly v4: string[];
  readonly v6: string[];
  readonly sets: string[];
}
/** Per family: mangle (Weir's chains), then filter. */
const bothTables = async (runner: CommandRunner, b: Backend, family: 4 | 6) => [...(await tableLines(runner, b, family, 'mangle')), ...(await tableLines(runner, b, family, 'filter'))];
const snapshot = async (runner: CommandRunner, b: Backend): Promise<Snapshot> => ({
  v4: await bothTables(runner, b, 4),
  v6: await bothTables(runner, b, 6),
  sets: await ipsetLines(runner),
});

/** In iptables-save order: declarations, then rules chain by chain (chains sorted by name). */
const EXPECTED_V4 = [
  `:${names.forward} - [0:0]`,
  `:${pol} - [0:0]`,
  `:${names.toWorkloadDispatch} - [0:0]`,
  `:${tw} - [0:0]`,
  `-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`,
  `-A ${names.forward} -m comment --comment "weir:HASH" -j ${names.toWorkloadDispatch}`,
  `-A ${pol} -p tcp -m comment --comment "weir:HASH policy default/allow-web ingress rule 0" -m set --match-set ${web4} src -m multiport --dports 80,8000:8100 -j MARK --set-xmark 0x10000/0x10000`,
  `-A ${pol} -m comment --comment "weir:HASH" -m set --match-set ${http4} dst,dst -j MARK --set-xmark 0x10000/0x10000`,
  `-A ${names.toWorkloadDispatch} -d 10.244.1.5/32 -m comment --comment "weir:HASH" -g ${tw}`,
  `-A ${tw} -m comment --comment "weir:HASH" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
  `-A ${tw} -m comment --comment "weir:HASH" -m conntrack --ctstate INVALID -j DROP`,
  `-A ${tw} -m comment --comment "weir:HASH" -j MARK --set-xmark 0x0/0x30000`,
  `-A ${tw} -m comment --comment "weir:HASH" -j ${pol}`,
  `-A ${tw} -m comment --comment "weir:HASH" -m mark --mark 0x10000/0x10000 -j RETURN`,
  `-A ${tw} -m comment --comment "weir:HASH no policy allowed it" -j DROP`,
];
/** The same layout for IPv6: its own peer set and address, and no named-port rule. */
const EXPECTED_V6 = EXPECTED_V4.filter((l) => !l.includes(http4)).map((l) => l.replace(web4, web6).replace('10.244.1.5/32', 'fd00:244::5/128'));
const EXPECTED_SETS = [
  `add ${http4} 10.244.1.5,tcp:8080`,
  `add ${web4} 10.244.1.0/24`,
  `add ${web4} 10.244.2.7`,
  `add ${web6} fd00:244::/64`,
  `create ${http4} hash:ip,port family inet maxelem 1048576 comment`,
  `create ${web4} hash:net family inet maxelem 1048576 comment`,
  `create ${web6} hash:net family inet6 maxelem 1048576 comment`,
].sort();

const newDataplane = (runner: CommandRunner, backend: Backend): Dataplane =>
  createDataplane({ runner, names, families: [4, 6], backend, log: silentLogger(), lockRetry: { attempts: 2, delayMs: 10 } });

const skip = backends.length === 0 ? 'needs root, ipset and iptables-{nft,legacy}-restore' : false;

for (const backend of backends.length > 0 ? backends : (['nft'] as Backend[])) {
  describe(`dataplane on the ${backend} backend`, { skip }, () => {
    // --wait: the legacy xtables lock is shared with every other process on the host.
    const run = (runner: CommandRunner, family: 4 | 6, args: string[]) => runOk(runner, ipt(backend, family), ['--wait', ...args]);
    /** The same in mangle, where Weir's chains and hooks live. */
    const mangle = (runner: CommandRunner, family: 4 | 6, args: string[]) => run(runner, family, ['-t', 'mangle', ...args]);

    test('apply writes exactly the expected chains, hook and sets for both families', async () => {
      await inFreshNs(async (runner) => {
        const stats = await newDataplane(runner, backend).apply(base());
        const snap = await snapshot(runner, backend);
        assert.deepEqual(own(snap.v4), EXPECTED_V4);
        assert.deepEqual(own(snap.v6), EXPECTED_V6);
        assert.deepEqual(snap.sets, EXPECTED_SETS);
        assert.deepEqual([stats.setsCreated, stats.membersAdded, stats.chainsWritten, stats.hooksWritten], [3, 4, 8, 2]);
      });
    });

    test('an incremental change writes only the dirty chain; on nft as additions only, tidied later to the same rules', async () => {
      await inFreshNs(async (runner) => {
        const rec = recordingRunner(runner);
        const dp = newDataplane(rec, backend);
        await dp.apply(base());
        const before = await snapshot(runner, backend);
        rec.calls.length = 0;
        const extra: Rule = { matches: [{ kind: 'addr', dir: 'src', cidr: '192.168.0.0/16' }], action: { kind: 'setMark', value: ACCEPT_MARK, mask: ACCEPT_MARK } };
        const next = base(policyChain(web4, [namedPort, extra]));
        const d = emptyDirty();
        d.chains[4].add(pol);
        dp.markDirty(d);
        const stats = await dp.apply(next);
        assert.equal(rec.calls.length, 1);
        const payload = rec.calls[0].input!;
        assert.equal(rec.calls[0].cmd, `iptables-${backend}-restore`);
        const polRules = async () => own(await tableLines(runner, backend, 4)).filter((l) => l.startsWith(`-A ${pol} `));
        const oldRules = own(before.v4).filter((l) => l.startsWith(`-A ${pol} `));
        if (backend === 'nft') {
          // The new rules above a RETURN above the old ones; no line flushes or deletes.
          assert.deepEqual(
            payload.split('\n').filter((l) => l.startsWith(':') || (l.startsWith('-') && !l.startsWith(`-I ${pol} 1 `))),
            [],
          );
          assert.deepEqual([stats.chainsWritten, stats.rulesWritten], [1, 4]);
          const layered = await polRules();
          assert.equal(layered.length, 3 + 1 + oldRules.length);
          assert.ok(layered[0].startsWith(`-A ${pol} -p tcp `) && layered[2].startsWith(`-A ${pol} -s 192.168.0.0/16 `));
          assert.match(layered[3], /^-A \S+ -m comment --comment "weir:HASH end of the new rules; older ones below wait for removal" -j RETURN$/);
          assert.deepEqual(layered.slice(4), oldRules);
          assert.equal(await dp.hookIntact(), true, 'the record holds the layered chain as the kernel does');
          assert.equal(dp.status().tidyPending, 1);
          await dp.apply(next, { tidy: true });
          assert.equal(dp.status().tidyPending, 0);
        } else {
          assert.deepEqual(
            payload.split('\n').filter((l) => l.startsWith(':')),
            [`:${pol} - [0:0]`],
          );
          assert.equal(payload.split('\n').filter((l) => l.startsWith('-') && !l.startsWith(`-A ${pol} `)).length, 0);
          assert.deepEqual([stats.chainsWritten, stats.rulesWritten], [1, 3]);
        }
        assert.equal((await polRules()).length, 3);
        const after = await snapshot(runner, backend);
        assert.deepEqual(after.v6, before.v6);
        assert.deepEqual(after.sets, before.sets);
        const notPol = (ls: string[]) => ls.filter((l) => !l.includes(`-A ${pol} `));
        assert.deepEqual(notPol(after.v4), notPol(before.v4));
        assert.ok(after.v4.some((l) => l.startsWith(`-A ${pol} -s 192.168.0.0/16 `)));
      });
    });

    test('a counts resync reads the members of a set only when its size changed: a lost member is put back, a swapped one waits for a full resync', async () => {
      await inFreshNs(async (runner) => {
        const rec = recordingRunner(runner);
        const dp = newDataplane(rec, backend);
        await dp.apply(base());
        const members = async () => (await ipsetLines(runner)).filter((l) => l.startsWith(`add ${web4} `));
        const good = await members();
        await runOk(runner, 'ipset', ['del', web4, '10.244.2.7']);
        rec.calls.length = 0;
        await dp.resync(base(), { members: 'counts' });
        const ipsetReads = rec.calls.filter((c) => c.cmd === 'ipset' && c.args[0] !== 'restore').map((c) => c.args.join(' '));
        assert.deepEqual(ipsetReads, ['list -terse', `save ${web4}`], 'sizes of all, members of the one that shrank');
        assert.deepEqual(await members(), good);
        // The same size, another member: only a full read sees it.
        await runOk(runner, 'ipset', ['del', web4, '10.244.2.7']);
        await runOk(runner, 'ipset', ['add', web4, '192.0.2.1']);
        await dp.resync(base(), { members: 'counts' });
        assert.ok((await members()).includes(`add ${web4} 192.0.2.1`));
        await dp.resync(base());
        assert.deepEqual(await members(), good);
      });
    });

    test('foreign rules, chains and sets survive apply, resync and cleanup untouched', async () => {
      await inFreshNs(async (runner) => {
        for (const f of [4, 6] as const) {
          await run(runner, f, ['-N', 'KUBE-FORWARD']);
          await run(runner, f, ['-A', 'KUBE-FORWARD', '-m', 'comment', '--comment', 'kubernetes forwarding rules', '-j', 'ACCEPT']);
          await run(runner, f, ['-A', 'FORWARD', '-j', 'KUBE-FORWARD']);
          await run(runner, f, ['-N', 'DOCKER']);
        }
        await runOk(runner, 'ipset', ['create', 'KUBE-LOOP-BACK', 'hash:ip,port,ip']);
        const foreign = async () => {
          const s = await snapshot(runner, backend);
          return { v4: s.v4.filter((l) => !l.includes('cali')), v6: s.v6.filter((l) => !l.includes('cali')), sets: s.sets.filter((l) => !l.includes('cali')) };
        };
        const dp = newDataplane(runner, backend);
        await dp.apply(base());
        // Another program inserts its own rule at the top, pushing our hook down.
        await mangle(runner, 4, ['-I', 'FORWARD', '1', '-s', '10.244.0.0/16', '-m', 'comment', '--comment', 'flanneld forward', '-j', 'ACCEPT']);
        const before = await foreign();
        assert.ok(before.v4.some((l) => l.includes('flanneld')));
        const stats = await dp.resync(base());
        assert.equal(stats.hooksWritten, 1, 'only the v4 hook was out of place');
        const fwd = (await tableLines(runner, backend, 4)).filter((l) => l.startsWith('-A FORWARD '));
        assert.deepEqual(fwd, [`-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`, '-A FORWARD -s 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT']);
        assert.deepEqual(
          (await tableLines(runner, backend, 4, 'filter')).filter((l) => l.startsWith('-A FORWARD ')),
          ['-A FORWARD -j KUBE-FORWARD'],
        );
        assert.deepEqual(await foreign(), before);
        await dp.cleanup();
        assert.deepEqual(await foreign(), before);
      });
    });

    test('resync repairs drift: moved hook, flushed chain, destroyed set, extra member', async () => {
      await inFreshNs(async (runner) => {
        const dp = newDataplane(runner, backend);
        await dp.apply(base());
        const good = await snapshot(runner, backend);
        const hook = ['-m', 'comment', '--comment', 'weir:hook', '-j', names.forward];
        await mangle(runner, 4, ['-D', 'FORWARD', ...hook]);
        await mangle(runner, 4, ['-A', 'FORWARD', '-j', 'ACCEPT']);
        await mangle(runner, 4, ['-A', 'FORWARD', ...hook]);
        await mangle(runner, 6, ['-I', 'FORWARD', '1', ...hook]);
        // Flushing the policy chain frees web4, which lets the other program destroy it.
        await mangle(runner, 4, ['-F', pol]);
        await runOk(runner, 'ipset', ['destroy', web4]);
        await runOk(runner, 'ipset', ['add', http4, '10.9.9.9,udp:53']);
        await mangle(runner, 6, ['-A', tw, '-j', 'ACCEPT']);
        assert.notDeepEqual(await snapshot(runner, backend), good);
        const stats = await dp.resync(base());
        const fixed = await snapshot(runner, backend);
        const withoutForeignAccept = fixed.v4.filter((l) => l !== '-A FORWARD -j ACCEPT');
        assert.deepEqual(withoutForeignAccept, good.v4);
        assert.deepEqual(fixed.v6, good.v6);
        assert.deepEqual(fixed.sets, good.sets);
        assert.equal(fixed.v4.filter((l) => l.startsWith('-A FORWARD'))[0], `-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`);
        assert.deepEqual([stats.chainsWritten, stats.hooksWritten, stats.setsCreated, stats.membersRemoved], [2, 2, 1, 1]);
      });
    });

    test('stale own chains and sets from a previous run are removed on the first apply', async () => {
      await inFreshNs(async (runner) => {
        const staleSet = names.peerSet(4, 'ns:gone');
        const staleChain = names.policyIngress('default/gone');
        await runOk(runner, 'ipset', ['create', staleSet, 'hash:net', 'comment']);
        await runOk(runner, 'ipset', ['create', web4, 'hash:net', 'maxelem', '1048576', 'comment']);
        await runOk(runner, 'ipset', ['add', web4, '10.1.1.1']);
        const old = [
          '*mangle',
          `:${staleChain} - [0:0]`,
          `:${names.forward} - [0:0]`,
          `-A ${staleChain} -m set --match-set ${staleSet} src -j ACCEPT`,
          `-A ${names.forward} -m comment --comment "weir:oldoldoldoldoldo" -j ${staleChain}`,
          `-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`,
          `-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`,
          'COMMIT',
          '',
        ].join('\n');
        await runOk(runner, `${ipt(backend, 4)}-restore`, ['--noflush'], { input: old });
        const stats = await newDataplane(runner, backend).apply(base());
        const snap = await snapshot(runner, backend);
        assert.deepEqual(own(snap.v4), EXPECTED_V4);
        assert.deepEqual(snap.sets, EXPECTED_SETS);
        assert.deepEqual([stats.chainsDeleted, stats.setsDeleted, stats.membersRemoved], [1, 1, 1]);
      });
    });

    test('upgrade: an older Weir’s chains and hooks in filter are replaced by mangle’s in one restore, the accept hook first in filter FORWARD; cleanup leaves neither table a line of Weir’s', async () => {
      await inFreshNs(async (runner) => {
        for (const f of [4, 6] as const) {
          await run(runner, f, ['-N', 'KUBE-FORWARD']);
          await run(runner, f, ['-A', 'FORWARD', '-j', 'KUBE-FORWARD']);
        }
        // What the previous Weir wrote: the same chains and hook, in filter (both families).
        const previous = newDataplane(runner, backend);
        await previous.apply(base());
        for (const f of [4, 6] as const) {
          const own = (await tableLines(runner, backend, f)).filter((l) => /cali|weir:/.test(l));
          const filter = ['*filter', ...own.filter((l) => l.startsWith(':') || l.startsWith('-A')), 'COMMIT', ''].join('\n');
          await runOk(runner, `${ipt(backend, f)}-restore`, ['--noflush'], { input: filter });
        }
        await newDataplane(runner, backend).cleanup(); // everything in both tables goes...
        for (const f of [4, 6] as const) {
          const own = (await tableLines(runner, backend, f)).filter((l) => /cali|weir:/.test(l));
          assert.deepEqual(own, []);
        }
        assert.deepEqual(
          (await snapshot(runner, backend)).v4.filter((l) => /cali|weir:/.test(l)),
          [],
          '...in filter too',
        );
        // Again, then a new Weir in ACCEPT mode (its accept chain) starts on that node.
        await previous.resync(base());
        for (const f of [4, 6] as const) {
          const own = (await tableLines(runner, backend, f)).filter((l) => /cali|weir:/.test(l));
          const filter = ['*filter', ...own.filter((l) => l.startsWith(':') || l.startsWith('-A')), 'COMMIT', ''].join('\n');
          await runOk(runner, `${ipt(backend, f)}-restore`, ['--noflush'], { input: filter });
        }
        const acceptChain: Rule[] = [
          { matches: [], action: { kind: 'setMark', value: ACCEPT_MARK, mask: ACCEPT_MARK } },
          { matches: [], action: { kind: 'accept' } },
        ];
        const b = base();
        const withAccept: DesiredDataplane = { ...b, chains: { 4: new Map([...b.chains[4], [names.accept, acceptChain]]), 6: new Map([...b.chains[6], [names.accept, acceptChain]]) } };
        const dp = newDataplane(runner, backend);
        await dp.apply(withAccept);
        for (const f of [4, 6] as const) {
          const filter = await tableLines(runner, backend, f, 'filter');
          assert.deepEqual(
            filter.filter((l) => l.startsWith('-A ') || l.includes('cali')),
            ['-A FORWARD -m mark --mark 0x10000/0x10000 -m comment --comment "weir:hook" -j ACCEPT', '-A FORWARD -j KUBE-FORWARD'],
            `IPv${f} filter`,
          );
          assert.ok((await tableLines(runner, backend, f)).includes(`-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`));
        }
        assert.equal(await dp.hookIntact(), true);
        await run(runner, 4, ['-I', 'FORWARD', '1', '-j', 'KUBE-FORWARD']);
        assert.equal(await dp.hookIntact(), false, 'a jump above the accept hook');
        await dp.resync(withAccept);
        assert.equal(
          (await tableLines(runner, backend, 4, 'filter')).filter((l) => l.startsWith('-A FORWARD'))[0],
          '-A FORWARD -m mark --mark 0x10000/0x10000 -m comment --comment "weir:hook" -j ACCEPT',
        );
        await dp.cleanup();
        for (const f of [4, 6] as const)
          assert.deepEqual(
            (await bothTables(runner, backend, f)).filter((l) => /cali|weir:/.test(l)),
            [],
          );
      });
    });

    test('a set found with another maxelem is rebuilt by swap while rules still reference it', async () => {
      await inFreshNs(async (runner) => {
        const small = createDataplane({ runner, names, families: [4, 6], backend, log: silentLogger(), maxSetSize: 4096 });
        await small.apply(base());
        const before = await snapshot(runner, backend);
        assert.ok(before.sets.includes(`create ${web4} hash:net family inet maxelem 4096 comment`));
        const stats = await newDataplane(runner, backend).apply(base());
        const after = await snapshot(runner, backend);
        assert.deepEqual(after.sets, EXPECTED_SETS);
        assert.deepEqual(after.v4, before.v4);
        assert.deepEqual([stats.chainsWritten, stats.setsCreated], [0, 0]);
      });
    });

    test('cleanup leaves no line mentioning the prefix, even from a fresh process', async () => {
      await inFreshNs(async (runner) => {
        await newDataplane(runner, backend).apply(base());
        // A new dataplane object has no record: cleanup must work from the kernel alone.
        const stats = await newDataplane(runner, backend).cleanup();
        assert.deepEqual(stats, { chainsDeleted: 8, hooksDeleted: 2, setsDeleted: 3 });
        const snap = await snapshot(runner, backend);
        const all = [...snap.v4, ...snap.v6, ...snap.sets];
        assert.deepEqual(
          all.filter((l) => l.includes('cali')),
          [],
        );
        assert.ok(snap.v4.includes(':FORWARD ACCEPT [0:0]'));
      });
    });

    test("guard writes the fail-closed skeleton on a bare node, and leaves a node holding Weir's rules alone", async () => {
      await inFreshNs(async (runner) => {
        const skeleton = desired({
          chains4: {
            [names.forward]: [{ matches: [], action: { kind: 'jump', chain: names.fromWorkloadDispatch } }],
            [names.fromWorkloadDispatch]: [{ matches: [{ kind: 'iface', dir: 'in', name: 'cni0' }], action: { kind: 'drop' } }],
          },
          chains6: {
            [names.forward]: [{ matches: [], action: { kind: 'jump', chain: names.fromWorkloadDispatch } }],
            [names.fromWorkloadDispatch]: [{ matches: [{ kind: 'iface', dir: 'in', name: 'cni0' }], action: { kind: 'drop' } }],
          },
          top: names.forward,
        });
        assert.equal(await newDataplane(runner, backend).guard(skeleton), true);
        const v4 = own(await tableLines(runner, backend, 4));
        assert.ok(v4.includes(`-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`), v4.join('\n'));
        assert.ok(v4.includes(`-A ${names.fromWorkloadDispatch} -i cni0 -m comment --comment "weir:HASH" -j DROP`), v4.join('\n'));
        // A restarted agent finds the previous one's rules: they keep holding until the sync.
        const dp = newDataplane(runner, backend);
        await dp.apply(base());
        const before = await snapshot(runner, backend);
        assert.equal(await newDataplane(runner, backend).guard(skeleton), false);
        assert.deepEqual(await snapshot(runner, backend), before);
      });
    });

    test('hookIntact sees a deleted or displaced hook, not rules of others below it; a flushed own chain is left to the resync', async () => {
      await inFreshNs(async (runner) => {
        const dp = newDataplane(runner, backend);
        await dp.apply(base());
        assert.equal(await dp.hookIntact(), true);
        // Someone else's rules below the hook: not drift.
        await run(runner, 4, ['-A', 'FORWARD', '-j', 'ACCEPT']);
        await mangle(runner, 4, ['-A', 'FORWARD', '-j', 'ACCEPT']);
        assert.equal(await dp.hookIntact(), true);
        await mangle(runner, 6, ['-D', 'FORWARD', '-m', 'comment', '--comment', 'weir:hook', '-j', names.forward]);
        assert.equal(await dp.hookIntact(), false, 'IPv6 hook deleted');
        await dp.resync(base());
        assert.equal(await dp.hookIntact(), true);
        await mangle(runner, 4, ['-I', 'FORWARD', '1', '-j', 'ACCEPT']);
        assert.equal(await dp.hookIntact(), false, 'a rule above the IPv4 hook');
        await dp.resync(base());
        const before = await tableLines(runner, backend, 4);
        // The check reads only the hooked builtin chains (cheap); chains' content is the resync's.
        await mangle(runner, 4, ['-F', tw]);
        assert.equal(await dp.hookIntact(), true, 'own chains are not read by the check');
        await dp.resync(base());
        assert.deepEqual(await tableLines(runner, backend, 4), before, 'the resync refilled the flushed chain');
      });
    });

    test("Felix's chains and sets (same names, no Weir mark) make Weir refuse and are never touched", async () => {
      await inFreshNs(async (runner) => {
        const felix = [
          '*filter',
          ':cali-FORWARD - [0:0]',
          ':cali-tw-cali12345 - [0:0]',
          '-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD',
          '-A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j cali-tw-cali12345',
          '-A cali-tw-cali12345 -m comment --comment "cali:abcdabcdabcdabcd" -j ACCEPT',
          'COMMIT',
          '',
        ].join('\n');
        await runOk(runner, `${ipt(backend, 4)}-restore`, ['--noflush'], { input: felix });
        await runOk(runner, 'ipset', ['create', 'cali40s:felixfelixfelixfelix', 'hash:net']);
        const before = await snapshot(runner, backend);
        const dp = newDataplane(runner, backend);
        await assert.rejects(dp.checkOwnership(), /cali-FORWARD.*cali-tw-cali12345|Calico/);
        await assert.rejects(dp.apply(base()), /did not write/);
        assert.deepEqual(await dp.cleanup(), { chainsDeleted: 0, hooksDeleted: 0, setsDeleted: 0 });
        assert.deepEqual(await snapshot(runner, backend), before);
      });
    });

    test('a payload the kernel rejects raises RestoreError with the line and changes nothing', async () => {
      await inFreshNs(async (runner) => {
        const dp = newDataplane(runner, backend);
        await dp.apply(base());
        const before = await snapshot(runner, backend);
        const missing = names.peerSet(4, 'ns:never-created');
        const d = emptyDirty();
        d.chains[4].add(pol);
        d.chains[4].add(tw);
        dp.markDirty(d);
        const broken = base(policyChain(missing));
        const err = await dp.apply(broken).then(
          () => assert.fail('expected a rejection'),
          (e: unknown) => e,
        );
        assert.ok(err instanceof RestoreError, String(err));
        assert.equal(err.family, 4);
        assert.match(err.lineText ?? '', new RegExp(`--match-set ${missing} src`));
        assert.deepEqual(await snapshot(runner, backend), before);
        // The retry after a fix reads the kernel back and converges.
        await dp.apply(base());
        assert.deepEqual(await snapshot(runner, backend), before);
      });
    });
  });
}

test('netnsRunner: a binary missing inside the namespace is WEIR_COMMAND_MISSING', { skip: !isRoot && 'needs root' }, async () => {
  await inFreshNs(async (runner) => {
    await assert.rejects(runner.run('weir-no-such-binary', []), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_MISSING');
    assert.equal((await runner.run('true', [])).exitCode, 0);
  });
});

test('ipset restore: a batch of 250k members streams whole, and a batch rejected at its first line names it', { skip: !isRoot && 'needs root' }, async () => {
  await inFreshNs(async (runner) => {
    const ipset = createIpset(runner);
    const members = Array.from({ length: 250_000 }, (_, i) => `10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`);
    await ipset.restore([setCreate('weir-big', 'hash:net', 4, 262_144), setMemberLines('add', 'weir-big', members)]);
    assert.match(await ipset.listHeaders(), /Number of entries: 250000/);
    // ipset stops at the bad line while the pieces behind it are still being written.
    const err = await ipset.restore(['add weir-nosuch 10.0.0.1 -exist', setMemberLines('del', 'weir-big', members)]).then(
      () => assert.fail('expected a rejection'),
      (e: unknown) => e,
    );
    assert.ok(err instanceof RestoreError, String(err));
    assert.equal(err.line, 1);
    assert.equal(err.lineText, 'add weir-nosuch 10.0.0.1 -exist');
    assert.match(await ipset.listHeaders(), /Number of entries: 250000/);
  });
});
