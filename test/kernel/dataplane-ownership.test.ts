// The dataplane against real kernels: what is Weir's and what is not. Others' objects survive,
// an older Weir's are replaced, cleanup and the boot guard, the hook check, and refusing
// Felix's. Every case runs in a fresh network namespace, for each iptables backend installed.

import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { DesiredDataplane, Rule } from '../../src/calc/desired.ts';
import { runOk } from '../../src/exec/runner.ts';
import { desired } from '../unit/dataplane/fixtures.ts';
import { inFreshNs, names, tw, ACCEPT_MARK, base, ipt, tableLines, own, bothTables, snapshot, newDataplane, skip, testedBackends, iptablesOf } from './dataplane-fixtures.ts';

for (const backend of testedBackends) {
  describe(`dataplane on the ${backend} backend`, { skip }, () => {
    const { run, mangle } = iptablesOf(backend);

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
  });
}
