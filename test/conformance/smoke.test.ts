// The smallest proof that the harness and the agents work: no policy, then one default deny.
// Their tables live in explain-scenarios.ts.

import { after, before, describe, test } from 'node:test';
import { playScenario, scenario, SMOKE_SCENARIOS } from './explain-scenarios.ts';
import { Conformance } from './harness.ts';

describe('conformance smoke', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start();
  });
  after(async () => {
    await c?.stop();
  });

  test('with no policy every pod and the external host reach every pod', () => playScenario(c, scenario('a pod selected by no policy accepts everything and sends everywhere')));

  for (const s of SMOKE_SCENARIOS) test(s.name, () => playScenario(c, s));
});
