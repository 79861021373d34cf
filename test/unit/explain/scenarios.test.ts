// weir explain over every cell (source, target, family, protocol, port) of the conformance
// scenarios of explain-scenarios.ts, each state written as the manifests the agents read and
// explained with the agents' flags: every verdict must equal the scenario's truth table, and
// the chains must never disagree with the policies' own rules. The conformance tier's
// explain.test.ts checks the same against real packets.

import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadOnce } from '../../../src/cli/render.ts';
import { explainer } from '../../../src/explain/explain.ts';
import { silentLogger } from '../../../src/log.ts';
import { type Cell, cellKey, type MatrixCluster, planMatrix } from '../../../src/sim/prober.ts';
import { clusterManifest, EXPLAIN_SCENARIOS, explainCell, explainConfigOf, type Scenario } from '../../conformance/explain-scenarios.ts';
import { baseNamespaces, basePods, EXTERNAL, type PodDef } from '../../conformance/harness.ts';

/** A scenario's state as it goes from step to step, like the harness's. */
class State {
  pods = new Map(basePods().map((p) => [`${p.namespace}/${p.name}`, p]));
  /** In the cluster, named by no manifest. */
  unknown = new Map<string, PodDef>();
  /** Raw manifest files beside the cast's, by name. */
  files = new Map<string, string>();
  namespaces = baseNamespaces();
  policies: readonly unknown[] = [];

  apply(step: Scenario['steps'][number]): void {
    for (const p of step.unknownPods ?? []) this.unknown.set(`${p.namespace}/${p.name}`, p);
    for (const [name, content] of Object.entries(step.files ?? {})) {
      if (content === null) this.files.delete(name);
      else this.files.set(name, content);
    }
    if (step.policies) this.policies = step.policies;
    for (const [key, labels] of Object.entries(step.podLabels ?? {})) this.#pod(key).labels = labels;
    for (const [ns, labels] of Object.entries(step.namespaceLabels ?? {})) this.namespaces[ns] = labels;
    for (const [key, phase] of Object.entries(step.podPhases ?? {})) this.#pod(key).phase = phase;
    for (const [key, on] of Object.entries(step.hostNetwork ?? {})) this.#pod(key).hostNetwork = on;
    for (const p of step.addPods ?? []) this.pods.set(`${p.namespace}/${p.name}`, { ...p, labels: { ...p.labels } });
    for (const key of step.removePods ?? []) this.pods.delete(key);
  }

  /** The addresses the cluster gives a pod, whether the manifests name it or not. */
  ipsOf(key: string): readonly string[] {
    return (this.pods.get(key) ?? this.unknown.get(key))?.ips ?? [];
  }

  /** The cells the conformance harness probes: every pod of the cluster and the external host
   *  to every pod, and, when asked, every pod to the external host. */
  cells(toExternal: boolean): Cell[] {
    const pods = [...this.pods.values(), ...[...this.unknown.values()].filter((p) => !this.pods.has(`${p.namespace}/${p.name}`))];
    const cluster = {
      pods: () => pods.map((p) => ({ key: `${p.namespace}/${p.name}`, ips: p.ips })),
      external: { key: EXTERNAL, ips: ['172.31.0.200', 'fd00:172:31::200'] },
      endpoint: (key: string) => (key === EXTERNAL ? cluster.external : cluster.pods().find((p) => p.key === key)),
      ports: [80, 81],
    } as unknown as MatrixCluster;
    const probes = planMatrix(cluster, toExternal ? { sources: pods.map((p) => `${p.namespace}/${p.name}`), targets: [EXTERNAL] } : {}).probes;
    return probes.map((p) => p.cell);
  }

  #pod(key: string): PodDef {
    const p = this.pods.get(key);
    if (!p) throw new Error(`no pod ${key}`);
    return p;
  }
}

describe('weir explain agrees with the conformance truth tables', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weir-explain-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  for (const scenario of EXPLAIN_SCENARIOS) {
    test(scenario.name, async () => {
      const cfg = explainConfigOf(scenario);
      const state = new State();
      let cells = 0;
      for (const step of scenario.steps) {
        state.apply(step);
        // Named as the harness names its file, so raw files are read after it.
        await rm(dir, { recursive: true, force: true });
        await mkdir(dir);
        await writeFile(join(dir, '00-cluster.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items: clusterManifest([...state.pods.values()], state.namespaces, state.policies) }));
        for (const [name, content] of state.files) await writeFile(join(dir, name), content);
        const ex = explainer((await loadOnce(dir, silentLogger())).events, cfg);
        const ipsOf = (key: string) => state.ipsOf(key);
        const wrong: string[] = [];
        const tables = [...(step.expect ? [[state.cells(false), step.expect] as const] : []), ...(step.toExternal ? [[state.cells(true), step.toExternal] as const] : [])];
        for (const [cellsOf, expected] of tables) {
          for (const cell of cellsOf) {
            const got = explainCell(ex, ipsOf, cell);
            cells++;
            if (got.allowed !== undefined && got.allowed !== expected(cell))
              wrong.push(`${cellKey(cell)}: explain says ${got.allowed ? 'allowed' : 'denied'} (${got.why}), the table ${expected(cell) ? 'allowed' : 'denied'}`);
            for (const d of got.disagreements) wrong.push(`${cellKey(cell)}: ${d}`);
          }
        }
        assert.deepEqual(wrong, [], `${step.what}: ${wrong.length} cells wrong`);
      }
      assert.ok(cells > 100, `only ${cells} cells`);
    });
  }
});
