import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ControllerModel } from '../../../src/controller/policy-inputs.ts';
import { ClusterState } from '../../../src/model/cluster.ts';
import { compilePolicy } from '../../../src/model/policy.ts';
import type { ModelEvent, Pod, RawNetworkPolicy } from '../../../src/model/types.ts';
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
