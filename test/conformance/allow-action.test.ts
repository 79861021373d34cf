// Conformance with real packets for --allow-action RETURN: what policy allows goes back to
// FORWARD, so an administrator's own rules after Weir's hook still apply; what policy denies
// is still dropped, and replies still pass.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { inNs } from '../../src/sim/netns.ts';
import { applyStep, probeStep, scenario } from './explain-scenarios.ts';
import { A1, A2, B1, Conformance, type Cell } from './harness.ts';
import { and, not } from './predicates.ts';
import { spoofIntoEstablishedFlow } from './spoofing.ts';

const ADMIN_RULE = "an administrator's FORWARD rule after Weir's still applies to traffic policy allows";

describe('--allow-action RETURN', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wret', scenario(ADMIN_RULE).agentArgs);
  });
  after(async () => {
    await c?.stop();
  });

  test(ADMIN_RULE, async () => {
    await c.reset();
    const b1 = c.cluster.endpoint(B1)!;
    const rules = b1.ips.map((ip) => ({ tool: ip.includes(':') ? 'ip6tables' : 'iptables', args: ['-d', ip, '-p', 'tcp', '--dport', '81', '-j', 'DROP'] }));
    const nodeA = c.nodeNetns('node-a');
    for (const r of rules) await inNs(nodeA, r.tool, ['-w', '-A', 'FORWARD', ...r.args]);
    try {
      const adminDrops = (x: Cell) => x.target === B1 && x.proto === 'tcp' && x.port === 81 && x.source !== B1;
      // The scenario holds what Weir decides (policy still decides first); the packets also
      // meet the administrator's rule.
      for (const step of scenario(ADMIN_RULE).steps) {
        await applyStep(c, step);
        await probeStep(c, step, (weir) => and(not(adminDrops), weir));
      }
    } finally {
      for (const r of rules) await inNs(nodeA, r.tool, ['-w', '-D', 'FORWARD', ...r.args]).catch(() => undefined);
    }
  });

  test("replies are checked as in ACCEPT mode: a pod sending with another pod's address into that pod's established flow is dropped", async () => {
    await c.reset();
    const through = await spoofIntoEstablishedFlow(c, A1, B1, [A2, c.cluster.external!.key]);
    assert.deepEqual(Object.fromEntries(through), { [A2]: 0, [c.cluster.external!.key]: 0 });
    await c.expect(() => true, 'a1 and b1 themselves are unaffected');
  });
});
