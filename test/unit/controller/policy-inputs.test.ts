import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import { ControllerModel } from '../../../src/controller/policy-inputs.ts';
import { ClusterState } from '../../../src/model/cluster.ts';
import { compilePolicy } from '../../../src/model/policy.ts';
import type { ModelEvent, Pod, RawClusterNetworkPolicy, RawNetworkPolicy } from '../../../src/model/types.ts';
import { rng } from '../../support/rng.ts';

const NAMESPACES = ['a', 'b', 'c'];
const NODES = ['n1', 'n2', 'n3', 'n4', ''];
const SPECS: unknown[] = [
  { podSelector: {}, policyTypes: ['Ingress'] },
  { podSelector: { matchLabels: { tier: 'db' } }, ingress: [{ from: [{ podSelector: { matchLabels: { tier: 'api' } } }] }] },
  { podSelector: { matchExpressions: [{ key: 'tier', operator: 'NotIn', values: ['web'] }] }, egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8' } }] }] },
  { podSelector: { matchExpressions: [{ key: 'app', operator: 'Exists' }] }, ingress: [{ from: [{ namespaceSelector: {} }] }] },
  // Invalid: still enforced (its pods isolated), so its nodes count the same way.
  { podSelector: { matchLabels: { tier: 'api' } }, ingress: [{ ports: [{ port: 0 }] }] },
];

/**
 * The controller's lean model answers what the agents' ClusterState would (its nodesEnforcing,
 * with whole compiled policies) through random churn: pods created, relabelled, moved, finished,
 * on the host network or without an address, deleted; policies created, edited, deleted.
 */
test('the controller model gives every policy the nodes and validation the full cluster model gives it', () => {
  for (const seed of [1, 2, 3, 4]) {
    const random = rng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)];
    const model = new ControllerModel();
    const full = new ClusterState();
    const apply = (e: ModelEvent): void => {
      model.apply([e]);
      if (e.kind === 'Pod') {
        if (e.op === 'upsert') full.upsertPod(e.object);
        else full.deletePod(e.uid);
      } else if (e.kind === 'NetworkPolicy') {
        if (e.op === 'upsert') full.upsertPolicy(compilePolicy(e.object));
        else full.deletePolicy(`${e.namespace}/${e.name}`);
      } else if (e.kind === 'Namespace' && e.op === 'upsert') full.upsertNamespace(e.object);
    };
    const generations = new Map<string, number>();
    for (const ns of NAMESPACES) apply({ kind: 'Namespace', op: 'upsert', object: { name: ns, labels: { team: ns } } });
    for (let step = 0; step < 400; step++) {
      const r = random();
      if (r < 0.6) {
        const uid = `pod-${Math.floor(random() * 40)}`;
        if (random() < 0.15) apply({ kind: 'Pod', op: 'delete', uid });
        else {
          const pod: Pod = {
            uid,
            namespace: pick(NAMESPACES),
            name: uid,
            labels: random() < 0.3 ? { tier: pick(['web', 'api', 'db']) } : { tier: pick(['web', 'api', 'db']), app: 'x' },
            nodeName: pick(NODES),
            hostNetwork: random() < 0.1,
            phase: pick(['Running', 'Running', 'Running', 'Pending', 'Succeeded', 'Failed']),
            terminating: random() < 0.1,
            ips: random() < 0.1 ? [] : ['10.0.0.1'],
            ports: [],
          };
          apply({ kind: 'Pod', op: 'upsert', object: pod });
        }
      } else {
        const namespace = pick(NAMESPACES);
        const name = `pol-${Math.floor(random() * 8)}`;
        const key = `${namespace}/${name}`;
        if (random() < 0.2) {
          apply({ kind: 'NetworkPolicy', op: 'delete', namespace, name });
          generations.delete(key);
        } else {
          const generation = (generations.get(key) ?? 0) + 1;
          generations.set(key, generation);
          // A re-created policy (a new uid) now and then.
          const raw: RawNetworkPolicy = { namespace, name, uid: `${key}#${random() < 0.1 ? step : 0}`, generation, spec: pick(SPECS) };
          apply({ kind: 'NetworkPolicy', op: 'upsert', object: raw });
        }
      }
      const got = model.statusInputs().map((p) => ({ key: `${p.namespace}/${p.name}`, uid: p.uid, generation: p.generation, ok: p.accepted.ok, nodes: p.desiredNodes }));
      const want = [...full.policies.values()].map((p) => ({ key: p.key, uid: p.uid, generation: p.generation, ok: p.errors.length === 0, nodes: full.nodesEnforcing(p) }));
      const byKey = (x: { key: string }, y: { key: string }) => (x.key < y.key ? -1 : x.key > y.key ? 1 : 0);
      assert.deepEqual(got.sort(byKey), want.sort(byKey), `seed ${seed}, step ${step}`);
      for (const p of full.policies.values()) assert.equal(model.policyByUid(p.uid)?.key, p.key, `seed ${seed}, step ${step}: policyByUid`);
    }
    assert.ok(
      [...full.policies.values()].some((p) => p.errors.length > 0),
      `seed ${seed}: an invalid policy took part`,
    );
  }
});

test('a policy edited under a new uid is found by its new uid only; a deleted one by neither', () => {
  const model = new ControllerModel();
  const raw = (uid: string, generation: number): RawNetworkPolicy => ({ namespace: 'a', name: 'p', uid, generation, spec: SPECS[0] });
  model.apply([{ kind: 'NetworkPolicy', op: 'upsert', object: raw('u1', 1) }]);
  const [changed] = model.apply([{ kind: 'NetworkPolicy', op: 'upsert', object: raw('u2', 1) }]);
  assert.equal(changed.uid, 'u2');
  assert.equal(model.policyByUid('u1'), undefined);
  assert.equal(model.policyByUid('u2')?.generation, 1);
  model.apply([{ kind: 'NetworkPolicy', op: 'delete', namespace: 'a', name: 'p' }]);
  assert.equal(model.policyByUid('u2'), undefined);
  assert.deepEqual(model.statusInputs(), []);
});

const CNP_SUBJECTS: unknown[] = [
  { namespaces: {} },
  { namespaces: { matchLabels: { team: 'a' } } },
  { pods: { namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'In', values: ['b', 'c'] }] }, podSelector: { matchLabels: { tier: 'db' } } } },
  { pods: { namespaceSelector: {}, podSelector: { matchExpressions: [{ key: 'app', operator: 'DoesNotExist' }] } } },
  // Invalid: both kinds set. The policy still fails closed on the pods its subject reads as.
  { namespaces: {}, pods: { podSelector: {} } },
];

/**
 * What the controller's Enforced waits for and what each agent reports as held must be the same
 * set of nodes, or a ClusterNetworkPolicy is never realized (or realized too soon). Through
 * random churn (pods on three nodes moving, relabelled, finishing, on the host network;
 * namespaces relabelled and deleted; policies of both tiers created, edited, deleted), each
 * policy's desired nodes are exactly the nodes whose agent's calc reports it.
 */
test("the controller gives every ClusterNetworkPolicy exactly the nodes whose agents' calc report it", () => {
  const AGENT_NODES = ['n1', 'n2', 'n3'];
  for (const seed of [1, 2, 3]) {
    const random = rng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)];
    const model = new ControllerModel();
    const agents = new Map(AGENT_NODES.map((node) => [node, new Calculator({ nodeName: node, names: makeNames('cali'), families: [4], marks: { accept: 0x10000, pass: 0x20000 } })]));
    const apply = (e: ModelEvent): void => {
      model.apply([e]);
      for (const calc of agents.values()) calc.applyEvents([e]);
    };
    let sawInvalid = false;
    for (let step = 0; step < 300; step++) {
      const r = random();
      if (r < 0.5) {
        const uid = `pod-${Math.floor(random() * 30)}`;
        if (random() < 0.15) apply({ kind: 'Pod', op: 'delete', uid });
        else {
          const n = Math.floor(random() * 250) + 1;
          apply({
            kind: 'Pod',
            op: 'upsert',
            object: {
              uid,
              namespace: pick(NAMESPACES),
              name: uid,
              labels: random() < 0.5 ? { tier: pick(['web', 'db']) } : { tier: pick(['web', 'db']), app: 'x' },
              nodeName: pick([...AGENT_NODES, '']),
              hostNetwork: random() < 0.1,
              phase: pick(['Running', 'Running', 'Pending', 'Succeeded']),
              terminating: false,
              ips: random() < 0.1 ? [] : [`10.0.${Math.floor(n / 250)}.${n}`],
              ports: [],
            },
          });
        }
      } else if (r < 0.65) {
        const name = pick(NAMESPACES);
        if (random() < 0.2) apply({ kind: 'Namespace', op: 'delete', name });
        else apply({ kind: 'Namespace', op: 'upsert', object: { name, labels: { team: pick(NAMESPACES) } } });
      } else {
        const name = `cnp-${Math.floor(random() * 6)}`;
        if (random() < 0.15) apply({ kind: 'ClusterNetworkPolicy', op: 'delete', name });
        else {
          const object: RawClusterNetworkPolicy = {
            name,
            uid: `${name}#${step}`,
            generation: step,
            spec: { tier: pick(['Admin', 'Baseline']), priority: Math.floor(random() * 3), subject: pick(CNP_SUBJECTS), ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] },
          };
          apply({ kind: 'ClusterNetworkPolicy', op: 'upsert', object });
        }
      }
      const reported = new Map<string, { uid: string; generation: number; ok: boolean; nodes: string[] }>();
      for (const [node, calc] of agents) {
        for (const p of calc.enforcedClusterPolicyReports()) {
          const entry = reported.get(p.name) ?? { uid: p.uid, generation: p.generation, ok: p.errors.length === 0, nodes: [] };
          entry.nodes.push(node);
          reported.set(p.name, entry);
        }
      }
      for (const p of model.clusterStatusInputs()) {
        sawInvalid ||= !p.accepted.ok && p.desiredNodes.length > 0;
        const want = reported.get(p.name);
        assert.deepEqual(p.desiredNodes, want?.nodes ?? [], `seed ${seed}, step ${step}: ${p.name}`);
        if (want) assert.deepEqual({ uid: p.uid, generation: p.generation, ok: p.accepted.ok }, { uid: want.uid, generation: want.generation, ok: want.ok }, `seed ${seed}, step ${step}: ${p.name}`);
        reported.delete(p.name);
      }
      assert.deepEqual([...reported.keys()], [], `seed ${seed}, step ${step}: reported by agents, unknown to the controller`);
    }
    assert.ok(sawInvalid, `seed ${seed}: an invalid policy selecting pods took part`);
  }
});

test('an invalid ClusterNetworkPolicy is not accepted, with every field path at fault', () => {
  const model = new ControllerModel();
  model.apply([
    {
      kind: 'ClusterNetworkPolicy',
      op: 'upsert',
      object: { name: 'bad', uid: 'u-bad', generation: 4, spec: { tier: 'Admin', priority: 2000, subject: { namespaces: {} } }, annotations: { 'weir.dev/enforcement': 'audit' } },
    },
  ]);
  const [p] = model.clusterStatusInputs();
  assert.deepEqual({ name: p.name, uid: p.uid, generation: p.generation, accepted: p.accepted.ok }, { name: 'bad', uid: 'u-bad', generation: 4, accepted: false });
  assert.match(p.accepted.message, /^metadata\.annotations\["weir\.dev\/enforcement"\]: audit-only mode is for NetworkPolicies.*; spec\.priority: must be an integer from 0 to 1000, got 2000$/);
  model.apply([{ kind: 'ClusterNetworkPolicy', op: 'delete', name: 'bad' }]);
  assert.deepEqual(model.clusterStatusInputs(), []);
  assert.deepEqual(model.statusInputs(), [], 'never a NetworkPolicy');
});
