// Weir's conformance scenarios (test/conformance/*.test.ts) run through a real API server
// against any enforcer of the bench. conformance-hooks.ts makes those test files import this
// module instead of test/conformance/harness.ts; it has the same exports and the same cast,
// but every change goes through kube-apiserver (the enforcer's only source), and the enforcer
// named by WEIR_PEERS_ENFORCER (kube-router or weir) runs in each node's namespace.
//
// What differs from the manifest harness, on purpose:
// - settle() cannot wait for a manifest revision: it waits for each enforcer to end a sync
//   after the last write (at most 5 s), and expect() then probes until the truth table
//   matches, for up to WEIR_PEERS_CONVERGE_MS (default 10 s).
// - a mismatch does not stop the test: it is recorded with every cell that differs, the test
//   goes on (each later step sets its own state), and the test fails at its end listing them.
// - what cannot go through an API server throws NotApplicable: files that do not parse, objects
//   the API server rejects (invalid policies, other apiVersions), and, for an enforcer other
//   than Weir, reading or changing Weir's own rules (nodeNetns()).

import { appendFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadAll } from 'js-yaml';
import type { Cluster } from '../../src/sim/cluster.ts';
import { diffMatrix, expectMatrix, type Matrix, type MatrixOptions, probeMatrix } from '../../src/sim/prober.ts';
import { basePods, baseNamespaces, type Cell, EXTERNAL, type PodDef } from '../../test/conformance/harness.ts';
import { forgetProbeFlows } from '../../test/support/conntrack.ts';
import { ApiError, type KubeObject } from './api.ts';
import { type EnforcerName, type EnforcerProcess, type EnforcerSpec, prepareEnforcers } from './enforcers.ts';
import { BenchEnv, podObject, Turn } from './env.ts';

export { A1, A2, B1, B2, baseNamespaces, basePods, EXTERNAL, G1, NODES, np, nsOf } from '../../test/conformance/harness.ts';
export type { Cell, PodDef };

export class NotApplicable extends Error {
  constructor(why: string) {
    super(`not applicable through an API server: ${why}`);
  }
}

const ENFORCER = (process.env.WEIR_PEERS_ENFORCER ?? 'kube-router') as EnforcerName;
const OUT = process.env.WEIR_PEERS_CONFORMANCE_OUT;
const CONVERGE_MS = Number(process.env.WEIR_PEERS_CONVERGE_MS ?? 10_000);
const SETTLE_MS = 5_000;

// Which test is running, and what it disagreed on: the test fails at its end with all of it.
let currentTest = '';
let mismatches: string[] = [];
beforeEach((t) => {
  currentTest = t.fullName;
  mismatches = [];
});
afterEach(() => {
  const found = mismatches;
  mismatches = [];
  if (found.length) throw new Error(`${ENFORCER} disagrees with the expected truth table:\n${found.join('\n')}`);
});

function record(what: string, cells: string[]): void {
  mismatches.push(`${what || 'expect'}: ${cells.length} cells differ:\n  ${cells.join('\n  ')}`);
  if (OUT) appendFileSync(OUT, `${JSON.stringify({ enforcer: ENFORCER, file: process.argv[1], test: currentTest, what, cells })}\n`);
}

const podKey = (p: { namespace: string; name: string }) => `${p.namespace}/${p.name}`;

function rejected(e: unknown): never {
  if (e instanceof ApiError && (e.status === 422 || e.status === 400 || e.status === 404)) throw new NotApplicable(`the API server rejects it (${e.message.slice(0, 300)})`);
  throw e;
}

export class Conformance {
  readonly cluster: Cluster;
  readonly dir: string;
  pods = new Map<string, PodDef>();
  namespaces: Record<string, Record<string, string>> = {};
  policies: unknown[] = [];
  readonly #env: BenchEnv;
  readonly #turn: Turn;
  /** What the API holds, as last written by this harness (JSON per object key). */
  readonly #written = { namespaces: new Map<string, string>(), pods: new Map<string, { spec: string; labels: string; status: string }>(), policies: new Map<string, string>() };
  readonly #raw = new Map<string, KubeObject[]>();
  #lastWrite = 0;

  private constructor(env: BenchEnv, turn: Turn, dir: string) {
    this.#env = env;
    this.#turn = turn;
    this.cluster = turn.cluster;
    this.dir = dir;
  }

  static async start(tag = 'wconf', agentArgs: readonly string[] = []): Promise<Conformance> {
    const log = (s: string) => process.stderr.write(`${s}\n`);
    const specs = await prepareEnforcers({ weirDist: process.env.WEIR_PEERS_WEIR_DIST, log });
    const base = specs[ENFORCER];
    // Weir runs with the flags its own harness gives it (a 5 s resync, the test's own flags).
    const spec: EnforcerSpec = ENFORCER === 'weir' ? { ...base, argv: (node, kc) => [...base.argv(node, kc)!, '--resync-interval', '5', ...agentArgs] } : base;
    const env = await BenchEnv.start(log);
    const dir = mkdtempSync(join(tmpdir(), 'weir-peers-conf-'));
    try {
      const pods = basePods();
      for (const [name, labels] of Object.entries(baseNamespaces())) await env.ensureNamespace(name, labels);
      for (const p of pods) await env.addSimPod({ ...p, labels: { ...p.labels } });
      const turn = await Turn.start(env, spec, { tag });
      const c = new Conformance(env, turn, dir);
      c.pods = new Map(pods.map((p) => [podKey(p), p]));
      c.namespaces = baseNamespaces();
      for (const [name, labels] of Object.entries(c.namespaces)) c.#written.namespaces.set(name, JSON.stringify(labels));
      for (const p of pods) c.#written.pods.set(podKey(p), Conformance.#podState(p));
      await c.settle();
      return c;
    } catch (e) {
      await env.stop();
      rmSync(dir, { recursive: true, force: true });
      throw e;
    }
  }

  static #podState(p: PodDef): { spec: string; labels: string; status: string } {
    return {
      spec: JSON.stringify([p.node, p.hostNetwork ?? false, p.ports]),
      labels: JSON.stringify(p.labels),
      status: JSON.stringify([p.phase ?? 'Running', p.ips]),
    };
  }

  async reset(): Promise<void> {
    for (const key of [...this.pods.keys()]) if (!basePods().some((p) => podKey(p) === key)) await this.removePod(key, false);
    this.pods = new Map(basePods().map((p) => [podKey(p), p]));
    this.namespaces = baseNamespaces();
    this.policies = [];
    for (const name of [...this.#raw.keys()]) await this.#deleteRaw(name);
    await this.#sync();
    await this.settle();
  }

  async setPolicies(...policies: unknown[]): Promise<void> {
    this.policies = policies;
    await this.#sync();
    await this.settle();
  }

  async setPodLabels(key: string, labels: Record<string, string>): Promise<void> {
    this.#pod(key).labels = labels;
    await this.#sync();
    await this.settle();
  }

  async setPodPhase(key: string, phase: string): Promise<void> {
    this.#pod(key).phase = phase;
    await this.#sync();
    await this.settle();
  }

  async setNamespaceLabels(ns: string, labels: Record<string, string>): Promise<void> {
    this.namespaces[ns] = labels;
    await this.#sync();
    await this.settle();
  }

  async addPod(def: PodDef): Promise<void> {
    await this.cluster.addPod({ namespace: def.namespace, name: def.name, node: def.node, ips: def.ips });
    this.pods.set(podKey(def), def);
    await this.#sync();
    await this.settle();
  }

  async removePod(key: string, write = true): Promise<void> {
    this.pods.delete(key);
    if (write) {
      await this.#sync();
      await this.settle();
    }
    await this.cluster.removePod(key);
  }

  async writeRaw(name: string, content: string): Promise<void> {
    let docs: unknown[];
    try {
      docs = loadAll(content).filter((d) => d !== null && d !== undefined);
    } catch (e) {
      throw new NotApplicable(`${name} does not parse (${String(e).slice(0, 200)})`);
    }
    await this.#deleteRaw(name);
    const objects = docs as KubeObject[];
    this.#raw.set(name, objects);
    for (const o of objects) await this.#env.api.apply(o).catch(rejected);
    this.#lastWrite = performance.now();
    await this.settle();
  }

  writeBrokenRaw(name: string, _content: string): Promise<void> {
    return Promise.reject(new NotApplicable(`${name}: a file that does not parse never reaches an API server`));
  }

  async removeRaw(name: string): Promise<void> {
    await this.#deleteRaw(name);
    await this.settle();
  }

  async #deleteRaw(name: string): Promise<void> {
    for (const o of this.#raw.get(name) ?? []) await this.#env.api.delete(o.kind, o.metadata.namespace, o.metadata.name).catch(() => {});
    if (this.#raw.delete(name)) this.#lastWrite = performance.now();
  }

  /** Probes until the truth table matches or CONVERGE_MS passes; a mismatch is recorded (the
   *  test fails at its end), not thrown. */
  async expect(allowed: (c: Cell) => boolean, what = '', opts: MatrixOptions = {}): Promise<Matrix> {
    await this.settle();
    const expected = expectMatrix(this.cluster, opts, allowed);
    const deadline = performance.now() + CONVERGE_MS;
    for (;;) {
      await forgetProbeFlows(this.cluster);
      const actual = await probeMatrix(this.cluster, opts);
      const diff = diffMatrix(expected, actual);
      if (diff.length === 0) return actual;
      if (performance.now() > deadline) {
        record(what, diff);
        return actual;
      }
      await sleep(200);
    }
  }

  expectToExternal(allowed: (c: Cell) => boolean, what = ''): Promise<Matrix> {
    return this.expect(allowed, `${what} (pod -> external)`, { sources: this.cluster.pods().map((p) => p.key), targets: [EXTERNAL] });
  }

  /** Waits until every enforcer has ended a sync after the last write and stayed quiet 300 ms,
   *  for at most 5 s (an enforcer may rightly do nothing for a write). */
  async settle(): Promise<void> {
    const deadline = performance.now() + SETTLE_MS;
    const procs = () => [...this.#turn.procs.values()].filter((p) => !p.exited);
    while (performance.now() < deadline) {
      const now = performance.now();
      if (procs().every((p) => p.lastSyncAt > this.#lastWrite && now - p.lastSyncAt > 300)) return;
      await sleep(50);
    }
  }

  revision(): Promise<string> {
    return Promise.resolve(String(this.#lastWrite));
  }

  async writeManifests(): Promise<void> {
    await this.#sync();
    await this.settle();
  }

  async stopAgent(node: string): Promise<void> {
    await this.#turn.procs.get(node)?.stop();
    this.#turn.procs.delete(node);
  }

  startAgent(node: string, args?: readonly string[]): EnforcerProcess {
    if (args) throw new NotApplicable("starting an agent with Weir's own flags");
    const p = this.#turn.startEnforcer(node);
    if (!p) throw new NotApplicable('no enforcer process to start');
    return p;
  }

  agentErrors(): string[] {
    return [...this.#turn.procs.values()].flatMap((p) => p.log.filter((l) => /"level":(5|6)0|^E\d{4} /.test(l)).map((l) => `${p.node}: ${l}`));
  }

  nodeNetns(node: string): string {
    if (ENFORCER !== 'weir') throw new NotApplicable("the scenario reads or changes Weir's own rules on the node");
    return this.#turn.netns(node);
  }

  async stop(): Promise<void> {
    await this.#turn.stop();
    await this.#env.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }

  #pod(key: string): PodDef {
    const p = this.pods.get(key);
    if (!p) throw new Error(`no pod ${key}`);
    return p;
  }

  /** Makes the API hold the harness's namespaces, pods and policies: only what changed is written. */
  async #sync(): Promise<void> {
    const env = this.#env;
    const api = env.api;
    const w = this.#written;
    let wrote = false;
    for (const [name, labels] of Object.entries(this.namespaces)) {
      const j = JSON.stringify(labels);
      if (w.namespaces.get(name) === j) continue;
      await env.ensureNamespace(name, labels);
      w.namespaces.set(name, j);
      wrote = true;
    }
    for (const key of [...w.pods.keys()]) {
      if (this.pods.has(key)) continue;
      const [namespace, name] = key.split('/');
      await api.delete('Pod', namespace, name);
      w.pods.delete(key);
      wrote = true;
    }
    for (const [key, p] of this.pods) {
      const want = Conformance.#podState(p);
      const have = w.pods.get(key);
      if (have && have.spec === want.spec && have.labels === want.labels && have.status === want.status) continue;
      // A pod's spec cannot change in the API: a pod with another spec is a new pod.
      if (have && have.spec !== want.spec) await api.delete('Pod', p.namespace, p.name);
      if (!have || have.spec !== want.spec || have.labels !== want.labels) await api.apply(podObject({ ...p })).catch(rejected);
      if (!have || have.spec !== want.spec || have.status !== want.status) await env.setPodStatus(p, env.hostIPOf(p.node));
      w.pods.set(key, want);
      wrote = true;
    }
    const policies = this.policies.map((p) => ({ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', ...(p as object) }) as KubeObject);
    const wantKeys = new Set(policies.map((p) => podKey({ namespace: p.metadata.namespace ?? 'default', name: p.metadata.name })));
    for (const key of [...w.policies.keys()]) {
      if (wantKeys.has(key)) continue;
      const [namespace, name] = key.split('/');
      await api.delete('NetworkPolicy', namespace, name);
      w.policies.delete(key);
      wrote = true;
    }
    for (const p of policies) {
      const key = podKey({ namespace: p.metadata.namespace ?? 'default', name: p.metadata.name });
      const j = JSON.stringify(p);
      if (w.policies.get(key) === j) continue;
      // Replaced whole, never applied: see Api.replace (policyTypes is defaulted afresh).
      await api.replace(p).catch(rejected);
      w.policies.set(key, j);
      wrote = true;
    }
    if (wrote) this.#lastWrite = performance.now();
  }
}
