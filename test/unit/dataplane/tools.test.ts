// Tool detection (tools.ts): the backend is chosen on first use, once.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lazyTools } from '../../../src/dataplane/tools.ts';
import { recordingRunner } from '../../../src/exec/runner.ts';
import { silentLogger } from '../../../src/log.ts';

test('the backend is chosen on the first use of the tools, not before and not again', async () => {
  const runner = recordingRunner();
  const tools = lazyTools({ runner, backend: 'auto', log: silentLogger() });
  assert.deepEqual([runner.calls.length, tools.backend()], [0, undefined]);
  const t = await tools.get();
  const detecting = runner.calls.length;
  assert.ok(detecting > 0, 'auto reads the kernel to choose');
  assert.equal(await tools.get(), t);
  assert.equal(runner.calls.length, detecting);
  assert.equal(tools.backend(), 'nft');
});

test('a configured backend is taken as it is, with no kernel read', async () => {
  const runner = recordingRunner();
  const t = await lazyTools({ runner, backend: 'legacy', log: silentLogger() }).get();
  assert.deepEqual([t.iptables.backend, runner.calls.length], ['legacy', 0]);
});
