// The composition (dataplane.ts): jobs run one after the other, resync, and the hook check
// beside a running write.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { silentLogger } from '../../../src/log.ts';
import { createDataplane } from '../../../src/dataplane/dataplane.ts';
import { recordingRunner } from '../../../src/exec/runner.ts';
import { desired, names, OK, fakeKernel, make, what, READ_KERNEL, WRITE_BASE, base, dirtyOf, savedBase, ipvsKernel } from './fixtures.ts';

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

test('resync reads the kernel again even when nothing is dirty', async () => {
  const runner = fakeKernel();
  const dp = make(runner);
  await dp.apply(base);
  runner.calls.length = 0;
  // The kernel now reports nothing at all: every object must be written again.
  const stats = await dp.resync(base);
  assert.equal(stats.resynced, true);
  assert.deepEqual(runner.calls.map(what), [...READ_KERNEL, ...WRITE_BASE]);
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
