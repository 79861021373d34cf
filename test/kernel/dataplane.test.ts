// The dataplane against real kernels: writes, resyncs and failures. Every case runs in a fresh
// network namespace (never the root one), for each iptables backend installed, and reads the
// result back with iptables-save and ipset save.

import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { emptyDirty, type Rule } from '../../src/calc/desired.ts';
import { CommandError, RestoreError } from '../../src/errors.ts';
import { silentLogger } from '../../src/log.ts';
import { createDataplane } from '../../src/dataplane/dataplane.ts';
import { createIpset } from '../../src/dataplane/ipset.ts';
import { setCreate, setMemberLines } from '../../src/dataplane/render.ts';
import { recordingRunner, runOk } from '../../src/exec/runner.ts';
import {
  isRoot,
  inFreshNs,
  names,
  web4,
  http4,
  pol,
  tw,
  ACCEPT_MARK,
  policyChain,
  namedPort,
  base,
  ipt,
  tableLines,
  own,
  ipsetLines,
  snapshot,
  EXPECTED_V4,
  EXPECTED_V6,
  EXPECTED_SETS,
  newDataplane,
  skip,
  testedBackends,
  iptablesOf,
} from './dataplane-fixtures.ts';

for (const backend of testedBackends) {
  describe(`dataplane on the ${backend} backend`, { skip }, () => {
    const { mangle } = iptablesOf(backend);

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
