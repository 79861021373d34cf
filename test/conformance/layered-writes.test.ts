// Layered writes (nf_tables), proved with real packets: a change is written above the rules it
// replaces, behind a RETURN, and those rules are removed by a later write (the tidy). Every
// verdict must be the new one while the old rules are still in the kernel, and the same after
// the tidy. The agents here tidy after 5 s of quiet, so each truth table below is probed while
// the layers are in place, which the test checks before and after probing.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { A1, B1, B2, Conformance, G1, np } from './harness.ts';
import { from, ingress, none, type Verdict } from './predicates.ts';

const TIDY_DELAY_S = 5;
const WEB = { matchLabels: { app: 'web' } };
const TEAM_B = { matchLabels: { team: 'b' } };
const always: Verdict = () => true;

describe('conformance: a change holds while the rules it replaced wait for removal, and after', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wclay', ['--tidy-delay', String(TIDY_DELAY_S)]);
  });
  after(async () => {
    await c?.stop();
  });

  /** Probes while node-a's agent owes a tidy from the last write, and checks it still did after. */
  async function expectLayered(allowed: Verdict, what: string): Promise<void> {
    assert.ok(c.tidyPending()['node-a'] > 0, `${what}: node-a holds layered chains before probing`);
    await c.expect(allowed, `${what} (layered)`);
    assert.ok(c.tidyPending()['node-a'] > 0, `${what}: the tidy did not run while probing`);
  }

  test('isolation, a narrower allowance and its removal: each verdict layered, then tidied', async () => {
    await c.reset();
    await c.settledTidy(3 * TIDY_DELAY_S * 1000);
    // a1 (web, node-a) isolated: a change of its chains, not only of set members.
    await c.setPolicies(np('alpha', 'web', { podSelector: WEB, policyTypes: ['Ingress'] }));
    await expectLayered(ingress({ [A1]: none }), 'a1 isolated');
    // Another layer above it: only beta's pods may reach a1 now.
    await c.setPolicies(np('alpha', 'web', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_B }] }] }));
    await expectLayered(ingress({ [A1]: from(B1, B2) }), 'a1 from beta only');
    await c.settledTidy(3 * TIDY_DELAY_S * 1000);
    assert.equal(c.tidyPending()['node-a'], 0);
    await c.expect(ingress({ [A1]: from(B1, B2) }), 'a1 from beta only (tidied)');
    // The policy goes: the layer that opens a1 again sits above the isolating rules.
    await c.setPolicies();
    await expectLayered(always, 'policy deleted');
    await c.settledTidy(3 * TIDY_DELAY_S * 1000);
    await c.expect(always, 'policy deleted (tidied)');
    assert.deepEqual(c.agentErrors(), []);
  });

  test('a peer set that comes back before the tidy destroyed it holds what it holds now, not what it held', async () => {
    await c.reset();
    const fromTeamB = np('alpha', 'web', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_B }] }] });
    await c.setPolicies(fromTeamB);
    await c.settledTidy(3 * TIDY_DELAY_S * 1000);
    await c.expect(ingress({ [A1]: from(B1, B2) }), 'a1 from beta');
    // The set of team b's pods leaves the rules (and waits for the tidy to be destroyed); while
    // out, team b becomes gamma instead of beta, then the set comes back before the tidy.
    await c.setPolicies(np('alpha', 'web', { podSelector: WEB, policyTypes: ['Ingress'] }));
    assert.ok(c.tidyPending()['node-a'] > 0, 'the set is owed to the tidy');
    await c.setNamespaceLabels('beta', {});
    await c.setNamespaceLabels('gamma', { team: 'b' });
    await c.setPolicies(fromTeamB);
    await expectLayered(ingress({ [A1]: from(G1) }), 'a1 from gamma only');
    await c.settledTidy(3 * TIDY_DELAY_S * 1000);
    await c.expect(ingress({ [A1]: from(G1) }), 'a1 from gamma only (tidied)');
    assert.deepEqual(c.agentErrors(), []);
  });
});
