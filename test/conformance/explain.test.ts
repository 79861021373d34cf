// Conformance: `weir explain` agrees with real packets. Each scenario of explain-scenarios.ts
// (ClusterNetworkPolicy tiers, isolation, peers, selectors, phases, ports, named ports,
// ipBlocks, invalid and large policies, host-networked and unknown pods, --allow-action RETURN)
// is set on a simulated two-node cluster whose agents run with the scenario's flags (one
// cluster per set of flags), its truth tables probed with real packets (and checked against
// the scenario's hand-written tables), and explain, fed the manifests the agents enforce with
// the agents' flags, must give every probed cell the verdict the packet met.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { runExplain } from '../../src/cli/explain.ts';
import { netnsRunner, processRunner } from '../../src/dataplane/index.ts';
import type { Explanation } from '../../src/explain/explain.ts';
import type { NodeCheck } from '../../src/explain/node-check.ts';
import { loadOnce } from '../../src/cli/render.ts';
import { explainer } from '../../src/explain/explain.ts';
import { silentLogger } from '../../src/log.ts';
import { applyStep, EXPLAIN_SCENARIOS, explainCell, explainConfigOf, probeStep, cleanUp, type Scenario } from './explain-scenarios.ts';
import { A1, B1, B2, type Cell, Conformance } from './harness.ts';

const execFileP = promisify(execFile);

describe('conformance: weir explain agrees with the probes', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wexpl');
  });
  after(async () => {
    await c?.stop();
  });

  test('--node-check on each node confirms the kernel holds what explain judged by, and names a set member someone removed', async () => {
    await c.reset();
    const step = EXPLAIN_SCENARIOS.find((x) => x.name.startsWith('a connection needs'))!.steps[1];
    await c.setPolicies(...step.policies!);
    await c.settledTidy(10_000);
    // One command runner (and its fork server) for every check, run in the node's namespace.
    const base = processRunner();
    const check = async (node: string, src: string, dst: string) => {
      let out = '';
      let err = '';
      const code = await runExplain(
        [src, dst, '--port', '80', '--manifests', c.dir, '--node-name', node, '--node-check', '-o', 'json'],
        {},
        { stdout: (t) => void (out += t), stderr: (t) => void (err += t) },
        { runner: netnsRunner(c.nodeNetns(node), base) },
      );
      return { code, err, x: out ? (JSON.parse(out) as Explanation & { nodeCheck: NodeCheck[] }) : undefined };
    };
    // b1 -> b2 crosses nodes (egress on node-a, ingress on node-b); a1 -> b1 stays on node-a.
    for (const [node, src, dst] of [
      ['node-a', B1, B2],
      ['node-b', B1, B2],
      ['node-a', A1, B1],
    ] as const) {
      const r = await check(node, src, dst);
      assert.equal(r.code, 0, `${node} ${src} -> ${dst}: ${r.err}\n${JSON.stringify(r.x?.nodeCheck, null, 1)}`);
      assert.ok(r.x && r.x.nodeCheck.length > 0 && r.x.nodeCheck.every((n) => n.same && n.chains.length > 3));
    }
    // b2 admits a1 by a set holding a1's address: take it out of node-b's kernel.
    const r = await check('node-b', A1, B2);
    const lookup = r.x!.nodeCheck.flatMap((n) => n.sets).find((s) => s.member === '10.244.1.11' && s.expected)!;
    assert.ok(lookup, JSON.stringify(r.x!.nodeCheck));
    const ns = c.nodeNetns('node-b');
    await execFileP('ip', ['netns', 'exec', ns, 'ipset', 'del', lookup.set, '10.244.1.11']);
    try {
      const drifted = await check('node-b', A1, B2);
      assert.equal(drifted.code, 3, drifted.err);
      const set = drifted.x!.nodeCheck.find((n) => n.family === 4)!.sets.find((s) => s.set === lookup.set)!;
      assert.deepEqual([set.same, set.expected, set.kernel, set.examples], [false, true, false, ['missing 10.244.1.11']]);
    } finally {
      await execFileP('ip', ['netns', 'exec', ns, 'ipset', 'add', '-exist', lookup.set, '10.244.1.11']);
    }
  });

  for (const scenario of EXPLAIN_SCENARIOS.filter((x) => (x.agentArgs ?? []).length === 0)) test(scenario.name, () => agreeOn(() => c, scenario));
});

/** Every set of agent flags the scenarios ask for beside the harness's, with its scenarios. */
const flagged = Map.groupBy(
  EXPLAIN_SCENARIOS.filter((x) => (x.agentArgs ?? []).length > 0),
  (x) => (x.agentArgs ?? []).join(' '),
);
for (const [flags, scenarios] of flagged) {
  describe(`conformance: weir explain agrees with the probes, agents run with ${flags}`, () => {
    let c: Conformance;
    before(async () => {
      c = await Conformance.start('wexplf', scenarios[0].agentArgs);
    });
    after(async () => {
      await c?.stop();
    });
    for (const scenario of scenarios) test(scenario.name, () => agreeOn(() => c, scenario));
  });
}

/** Plays a scenario on the cluster, step by step: its tables probed, then every probed cell
 *  explained from the manifests the agents enforce. */
async function agreeOn(cluster: () => Conformance, scenario: Scenario): Promise<void> {
  const c = cluster();
  await c.reset();
  const cfg = explainConfigOf(scenario);
  try {
    for (const step of scenario.steps) {
      await applyStep(c, step);
      const probed = await probeStep(c, step);
      const ex = explainer((await loadOnce(c.dir, silentLogger())).events, cfg);
      const ipsOf = (key: string) => c.cluster.endpoint(key)?.ips ?? [];
      const wrong: string[] = [];
      let cells = 0;
      for (const m of probed) {
        for (const [key, passed] of m.cells) {
          const [source, target, family, proto, port] = key.split('|');
          const cell: Cell = { source, target, family: Number(family) as 4 | 6, proto: proto as 'tcp' | 'udp', port: Number(port) };
          const got = explainCell(ex, ipsOf, cell);
          cells++;
          if (got.allowed !== undefined && got.allowed !== passed) {
            wrong.push(`${key}: explain says ${got.allowed ? 'allowed' : 'denied'} (${got.why}), the packet ${passed ? 'passed' : 'was dropped'}`);
          }
          for (const d of got.disagreements) wrong.push(`${key}: ${d}`);
        }
      }
      assert.ok(cells > 0, `${step.what}: no cell probed`);
      assert.deepEqual(wrong, [], `${step.what}: explain and the probes differ in ${wrong.length} of ${cells} cells`);
    }
  } finally {
    await cleanUp(c, scenario);
  }
}
