// A changed CRD reaching an installed cluster, on a real API server. Helm installs the chart's
// crds/ on the first install and never again, so docs/install.md ("Upgrading") has the
// operator apply them first, server-side, then upgrade the release. Here: the chart as it was
// at commit 5d941bb installed, status objects created under its CRDs, `helm upgrade` alone
// shown to leave those CRDs as they were and not to install the one the chart gained
// (ClusterNetworkPolicy), then the documented steps: the served CRDs must be the files in
// charts/weir/crds/ (compared with the files, whatever fields they gain), and the old objects
// still there, unchanged.

import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { load } from 'js-yaml';
import { type ControlPlane, startControlPlane } from './controlplane.ts';
import { buildHelm, CHART, helm, type Obj, ok, REPO, run } from './helm-harness.ts';

/** The chart an installed cluster may still run: the release before the CRDs changed. */
const OLD_COMMIT = '5d941bb';
const NS = 'kube-system';

/** What of a CRD the API server serves as given: each version's name, flags, subresources,
 *  printer columns and schema. */
const versions = (crd: Obj) =>
  (crd.spec.versions as Obj[]).map((v) => ({
    name: v.name,
    served: v.served,
    storage: v.storage,
    subresources: v.subresources,
    additionalPrinterColumns: v.additionalPrinterColumns,
    schema: v.schema,
  }));

/** The CRDs of a chart's crds/ folder, by name. */
async function crdFiles(chart: string): Promise<Map<string, Obj>> {
  const dir = join(chart, 'crds');
  const crds = new Map<string, Obj>();
  for (const f of (await readdir(dir)).filter((n) => n.endsWith('.yaml')).sort()) {
    const crd = load(await readFile(join(dir, f), 'utf8')) as Obj;
    crds.set(crd.metadata.name, crd);
  }
  return crds;
}

const condition = (type: string) => ({ type, status: 'True', lastTransitionTime: '2026-01-01T00:00:00Z', reason: 'Measured', message: `${type} before the upgrade` });

describe(`CRDs of an installed release (the chart at ${OLD_COMMIT}) upgraded by the steps of docs/install.md`, () => {
  let cp: ControlPlane;
  let dir: string;
  let oldChart: string;
  let oldCrds: Map<string, Obj>;
  let newCrds: Map<string, Obj>;
  /** The status objects as first read back, before any upgrade. */
  const made: Obj[] = [];

  before(async () => {
    [cp] = await Promise.all([startControlPlane(), buildHelm()]);
    dir = await mkdtemp(join(tmpdir(), 'weir-crd-upgrade-'));
    const archive = await run('git', ['-C', REPO, 'archive', '--format=tar', '-o', join(dir, 'old.tar'), OLD_COMMIT, 'charts/weir']);
    ok(`git archive ${OLD_COMMIT} charts/weir`, archive);
    ok('tar -x', await run('tar', ['-x', '-f', join(dir, 'old.tar'), '-C', dir]));
    oldChart = join(dir, 'charts/weir');
    oldCrds = await crdFiles(oldChart);
    newCrds = await crdFiles(CHART);
  });

  after(async () => {
    await cp?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const kubectl = (args: readonly string[], input?: string) => cp.kubectl(args, input);
  const helmHere = (args: readonly string[]) => helm([...args, '--kubeconfig', cp.kubeconfig]);
  const served = async (name: string) => JSON.parse(await kubectl(['get', 'crd', name, '-o', 'json'])) as Obj;
  const readBack = async (o: Obj) => {
    const ns = o.metadata.namespace ? ['-n', o.metadata.namespace] : [];
    return JSON.parse(await kubectl(['get', `${o.kind.toLowerCase()}.weir.dev`, o.metadata.name, ...ns, '-o', 'json'])) as Obj;
  };
  /** What an upgrade must keep of an object: its identity, spec and status. */
  const kept = (o: Obj) => ({ kind: o.kind, name: o.metadata.name, namespace: o.metadata.namespace, uid: o.metadata.uid, labels: o.metadata.labels, spec: o.spec, status: o.status });

  test('the CRDs changed since then (else this test proves nothing), and the chart has the same as crds/: the old ones and ClusterNetworkPolicy', async () => {
    assert.deepEqual([...newCrds.keys()].sort(), [...oldCrds.keys(), 'clusternetworkpolicies.policy.networking.k8s.io'].sort());
    const changed = [...oldCrds.keys()].filter((name) => JSON.stringify(versions(newCrds.get(name)!)) !== JSON.stringify(versions(oldCrds.get(name)!)));
    assert.notDeepEqual(changed, [], `no CRD of charts/weir/crds/ differs from ${OLD_COMMIT}'s`);
    assert.deepEqual([...(await crdFiles(REPO)).keys()].sort(), [...newCrds.keys()].sort());
  });

  test(`helm install of the chart at ${OLD_COMMIT} serves its CRDs; status objects are made under them`, async () => {
    const r = await helmHere(['install', 'weir', oldChart, '--namespace', NS]);
    assert.equal(r.code, 0, r.stderr);
    for (const [name, crd] of oldCrds) assert.deepEqual(versions(await served(name)), versions(crd), name);

    await kubectl(['create', 'namespace', 'shop']);
    const objects: Obj[] = [
      { apiVersion: 'weir.dev/v1alpha1', kind: 'NodePolicyStatus', metadata: { name: 'node-a', labels: { 'example.com/kept': 'yes' } } },
      { apiVersion: 'weir.dev/v1alpha1', kind: 'NetworkPolicyStatus', metadata: { name: 'web', namespace: 'shop' } },
    ];
    const statuses = [{ conditions: [condition('Ready'), condition('Programmed')] }, { conditions: [condition('Accepted')] }];
    for (const [i, o] of objects.entries()) {
      await kubectl(['create', '-f', '-'], JSON.stringify(o));
      const ns = o.metadata.namespace ? ['-n', o.metadata.namespace] : [];
      await kubectl(['patch', `${o.kind.toLowerCase()}.weir.dev`, o.metadata.name, ...ns, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: statuses[i] })]);
      const back = await readBack(o);
      assert.deepEqual(back.status, statuses[i], `${o.kind} keeps its status under the old CRD`);
      made.push(back);
    }
  });

  test('helm upgrade alone leaves the CRDs as the old chart installed them (why the documented step exists)', async () => {
    const r = await helmHere(['upgrade', 'weir', CHART, '--namespace', NS]);
    assert.equal(r.code, 0, r.stderr);
    for (const [name, crd] of oldCrds) assert.deepEqual(versions(await served(name)), versions(crd), `${name} changed by helm upgrade`);
    // Nor does it install a CRD the chart gained: without it the agents see no ClusterNetworkPolicy.
    await assert.rejects(served('clusternetworkpolicies.policy.networking.k8s.io'), /NotFound|not found/);
  });

  test('the documented upgrade (kubectl apply --server-side --force-conflicts -f charts/weir/crds/, then helm upgrade): the new CRDs are served, the old objects kept', async () => {
    // docs/install.md "Upgrading", as written, from the repository's root.
    const applied = await kubectl(['apply', '--server-side', '--force-conflicts', '-f', join(CHART, 'crds')]);
    assert.match(applied, /customresourcedefinition\.apiextensions\.k8s\.io\/nodepolicystatuses\.weir\.dev serverside-applied/);
    const r = await helmHere(['upgrade', 'weir', CHART, '--namespace', NS]);
    assert.equal(r.code, 0, r.stderr);

    for (const [name, crd] of newCrds) {
      const now = await served(name);
      assert.deepEqual(versions(now), versions(crd), `${name} as served differs from charts/weir/crds/`);
      // The API server took the new schema: it serves it, no condition says otherwise.
      const bad = (now.status?.conditions ?? []).filter((c: Obj) => (c.type === 'Established' && c.status !== 'True') || (c.type === 'NonStructuralSchema' && c.status === 'True'));
      assert.deepEqual(bad, [], name);
    }
    for (const o of made) assert.deepEqual(kept(await readBack(o)), kept(o), `${o.kind}/${o.metadata.name} after the upgrade`);
    // Helm still does not own them, so helm uninstall leaves them and every status object.
    const manifest = ok('helm get manifest', await helmHere(['get', 'manifest', 'weir', '--namespace', NS]));
    assert.doesNotMatch(manifest, /kind: CustomResourceDefinition/);
  });

  test('the documented step is idempotent: applied again, nothing changes and nothing conflicts', async () => {
    const before_ = await Promise.all([...newCrds.keys()].map(async (n) => (await served(n)).metadata.generation));
    await kubectl(['apply', '--server-side', '--force-conflicts', '-f', join(CHART, 'crds')]);
    const after_ = await Promise.all([...newCrds.keys()].map(async (n) => (await served(n)).metadata.generation));
    assert.deepEqual(after_, before_);
    // Without --force-conflicts too: after the first forced apply kubectl owns every field.
    await kubectl(['apply', '--server-side', '-f', join(CHART, 'crds')]);
  });
});
