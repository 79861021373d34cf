// Conformance: `weir explain` agrees with real packets. Each scenario of explain-scenarios.ts
// (ClusterNetworkPolicy tiers, isolation, peers, selectors, phases) is set on the simulated
// two-node cluster, its truth table probed with real packets (and checked against the
// scenario's hand-written table), and explain, fed the manifests the agents enforce with the
// agents' flags, must give every probed cell the verdict the packet met.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { explainConfig } from '../../src/cli/explain.ts';
import { toConfig } from '../../src/cli/flags.ts';
import { loadOnce } from '../../src/cli/render.ts';
import { explainer } from '../../src/explain/explain.ts';
import { silentLogger } from '../../src/log.ts';
import type { Matrix } from '../../src/sim/prober.ts';
import { EXPLAIN_SCENARIOS, explainCell } from './explain-scenarios.ts';
import { type Cell, Conformance } from './harness.ts';

describe('conformance: weir explain agrees with the probes', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wexpl');
  });
  after(async () => {
    await c?.stop();
  });

  for (const scenario of EXPLAIN_SCENARIOS) {
    test(scenario.name, async () => {
      await c.reset();
      for (const step of scenario.steps) {
        for (const key of step.removePods ?? []) await c.removePod(key);
        for (const pod of step.addPods ?? []) await c.addPod({ ...pod, labels: { ...pod.labels } });
        for (const [key, labels] of Object.entries(step.podLabels ?? {})) await c.setPodLabels(key, labels);
        for (const [ns, labels] of Object.entries(step.namespaceLabels ?? {})) await c.setNamespaceLabels(ns, labels);
        for (const [key, phase] of Object.entries(step.podPhases ?? {})) await c.setPodPhase(key, phase);
        if (step.policies) await c.setPolicies(...step.policies);
        const probed: Matrix[] = [await c.expect(step.expect, step.what)];
        if (step.toExternal) probed.push(await c.expectToExternal(step.toExternal, step.what));

        // The agents run with the harness's flags: the chains' shape is the defaults'.
        const cfg = explainConfig(toConfig({ manifests: c.dir }, { nodeName: false, manifestsDir: true }));
        const ex = explainer((await loadOnce(c.dir, silentLogger())).events, cfg);
        const ipsOf = (key: string) => c.pods.get(key)?.ips ?? [];
        const wrong: string[] = [];
        let cells = 0;
        for (const m of probed) {
          for (const [key, passed] of m.cells) {
            const [source, target, family, proto, port] = key.split('|');
            const cell: Cell = { source, target, family: Number(family) as 4 | 6, proto: proto as 'tcp' | 'udp', port: Number(port) };
            const got = explainCell(ex, ipsOf, cell);
            cells++;
            if (got.allowed !== passed) wrong.push(`${key}: explain says ${got.allowed ? 'allowed' : 'denied'} (${got.why}), the packet ${passed ? 'passed' : 'was dropped'}`);
            for (const d of got.disagreements) wrong.push(`${key}: ${d}`);
          }
        }
        assert.ok(cells > 0, `${step.what}: no cell probed`);
        assert.deepEqual(wrong, [], `${step.what}: explain and the probes differ in ${wrong.length} of ${cells} cells`);
      }
    });
  }
});
