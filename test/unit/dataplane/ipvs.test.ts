// Whether the OUTPUT hook for kube-proxy's IPVS mode is wanted (ipvs.ts).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ipvsMode } from '../../../src/dataplane/ipvs.ts';
import { recordingRunner } from '../../../src/exec/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import { ipvsKernel } from './fixtures.ts';

test('--ipvs on and off never look for kube-ipvs0', async () => {
  for (const choice of ['on', 'off'] as const) {
    const runner = recordingRunner();
    const mode = ipvsMode(choice, runner);
    assert.equal(await mode.detect(), choice === 'on');
    await mode.relearn(silentLogger());
    assert.equal(mode.wanted, choice === 'on');
    assert.equal(runner.calls.length, 0);
  }
});

test('under --ipvs auto kube-ipvs0 is wanted from the next relearn on; a detect alone changes nothing', async () => {
  const kernel = { save4: '', ipvs0: true };
  const mode = ipvsMode('auto', ipvsKernel(kernel));
  assert.equal(mode.wanted, false);
  assert.equal(await mode.detect(), true);
  assert.equal(mode.wanted, false);
  await mode.relearn(silentLogger());
  assert.equal(mode.wanted, true);
  kernel.ipvs0 = false;
  await mode.relearn(silentLogger());
  assert.equal(mode.wanted, false);
});
