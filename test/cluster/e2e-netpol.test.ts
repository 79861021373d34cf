// The upstream Kubernetes e2e NetworkPolicy specs (k8s.io/kubernetes/test/e2e/network/netpol,
// built from the pinned module by scripts/cluster.sh build) against the real cluster with Weir
// installed by its chart. Each upstream spec is one test here, passed, failed or skipped with
// its reason. CI runs the subset below (docs/real-cluster.md says why these); WEIR_E2E=full runs
// every spec the cluster can run (about 25 minutes).

import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { clusterUp, e2eBinary, installWeir, type RealCluster, run } from './harness.ts';

/** One spec per behaviour the e2e suite checks, chosen to cover every peer, port and
 *  direction kind at least once, and the OR/AND pitfall. */
const CI_SUBSET = [
  "should support a 'default-deny-ingress' policy",
  "should support a 'default-deny-all' policy",
  'should enforce policy based on PodSelector or NamespaceSelector',
  'should enforce policy based on PodSelector and NamespaceSelector',
  'should enforce policy based on Ports',
  'should allow ingress access on one named port',
  'should allow egress access on one named port',
  'should enforce except clause while egress access to server in CIDR block',
  'should enforce updated policy',
  'should stop enforcing policies after they are deleted',
  'should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)',
  "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
  'should support creating NetworkPolicy API operations',
];

/** Specs that cannot run here, each with the reason. */
const CANNOT_RUN: readonly { match: RegExp; reason: string }[] = [
  { match: /\[Feature:SCTPConnectivity\]/, reason: 'SCTP connectivity: the pods of this cluster cannot open SCTP sockets (no sctp module in this kernel)' },
];

const SHARDS = Number(process.env.WEIR_E2E_SHARDS ?? 3);
const full = process.env.WEIR_E2E === 'full';

interface SpecReport {
  LeafNodeType: string;
  LeafNodeText: string;
  ContainerHierarchyTexts: string[];
  State: string;
  RunTime: number;
  Failure?: { Message: string; Location?: { FileName: string; LineNumber: number } };
}

const fullName = (s: SpecReport) => [...s.ContainerHierarchyTexts, s.LeafNodeText].join(' ');
/** The spec's own words, without the labels the framework appends (` [Feature:NetworkPolicy]`). */
const specText = (s: SpecReport) => s.LeafNodeText.replace(/( \[[^\]]+\])+$/, '');
const escapeRegExp = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The suite's specs as its dry run lists them. */
async function listSpecs(bin: string, kubeconfig: string, dir: string): Promise<SpecReport[]> {
  const report = join(dir, 'dry-run.json');
  await run(bin, [`--kubeconfig=${kubeconfig}`, '--ginkgo.dry-run', `--ginkgo.json-report=${report}`, '--ginkgo.focus=Netpol', '--ginkgo.no-color']);
  const suites = JSON.parse(await readFile(report, 'utf8')) as { SpecReports: SpecReport[] }[];
  return suites[0]!.SpecReports.filter((s) => s.LeafNodeType === 'It');
}

describe('the upstream e2e NetworkPolicy specs on a real cluster, Weir installed by its chart', { timeout: 60 * 60_000 }, () => {
  let cluster: RealCluster;
  let dir: string;

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weir-e2e-'));
    cluster = await clusterUp();
    await installWeir(cluster);
  });

  after(async () => {
    await cluster?.down();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test(full ? 'every spec' : 'the CI subset', async (t) => {
    const bin = await e2eBinary();
    const all = await listSpecs(bin, cluster.kubeconfig, dir);
    const cannot = (s: SpecReport) => CANNOT_RUN.find((c) => c.match.test(fullName(s)));
    const chosen = all.filter((s) => !cannot(s) && (full || CI_SUBSET.includes(specText(s))));
    assert.ok(chosen.length >= (full ? 40 : CI_SUBSET.length), `the dry run listed ${all.length} specs, ${chosen.length} chosen`);
    // Shards run side by side: each spec makes its own namespaces, and most of a spec's time
    // is spent waiting for pods and for probes that time out.
    const names = [...new Set(chosen.map((s) => s.LeafNodeText))].sort();
    const shards = Array.from({ length: SHARDS }, (_, i) => names.filter((_, j) => j % SHARDS === i)).filter((s) => s.length > 0);
    const skip = CANNOT_RUN.map((c) => c.match.source).join('|');
    const results = new Map<string, SpecReport>();
    const started = Date.now();
    await Promise.all(
      shards.map(async (shard, i) => {
        const report = join(dir, `shard-${i}.json`);
        const focus = shard.map(escapeRegExp).join('|');
        const r = await run(bin, [
          `--kubeconfig=${cluster.kubeconfig}`,
          `--ginkgo.focus=${focus}`,
          `--ginkgo.skip=${skip}`,
          `--ginkgo.json-report=${report}`,
          '--ginkgo.no-color',
          '--ginkgo.timeout=50m',
        ]);
        const suites = JSON.parse(await readFile(report, 'utf8').catch(() => '[]')) as { SpecReports: SpecReport[] }[];
        if (suites.length === 0) throw new Error(`e2e shard ${i} wrote no report (exit ${r.code}):\n${r.stdout.slice(-4000)}${r.stderr.slice(-2000)}`);
        for (const s of suites[0]!.SpecReports) if (s.LeafNodeType === 'It' && s.State !== 'skipped') results.set(fullName(s), s);
      }),
    );
    t.diagnostic(`${results.size} specs in ${Math.round((Date.now() - started) / 1000)} s over ${shards.length} shards`);
    for (const s of all) {
      const reason = cannot(s)?.reason;
      if (reason !== undefined) {
        await t.test(fullName(s), { skip: reason }, () => {});
        continue;
      }
      if (!chosen.includes(s)) continue;
      await t.test(fullName(s), () => {
        const got = results.get(fullName(s));
        assert.equal(got?.State, 'passed', `${got?.State ?? 'did not run'}: ${got?.Failure?.Message?.slice(0, 3000) ?? ''}`);
      });
    }
  });
});
