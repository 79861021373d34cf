// The upstream Kubernetes e2e NetworkPolicy specs (k8s.io/kubernetes/test/e2e/network/netpol,
// built from the pinned module by scripts/cluster.sh build) against the real cluster with Weir
// installed by its chart. Each upstream spec is one test here, passed, failed or skipped with
// its reason. Every spec the cluster can run, by default (about 13 minutes on 2 cores);
// WEIR_E2E=subset runs the few below, for a quicker loop while developing.

import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { clusterUp, e2eBinary, installWeir, type RealCluster, run } from './harness.ts';

/** One spec per behaviour the e2e suite checks, chosen to cover every peer, port and
 *  direction kind at least once, and the OR/AND pitfall. */
const SUBSET = [
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

const WORKERS = Number(process.env.WEIR_E2E_WORKERS ?? 3);
const full = process.env.WEIR_E2E !== 'subset';

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

  test(full ? 'every spec the cluster can run' : 'the subset', async (t) => {
    const bin = await e2eBinary();
    const all = await listSpecs(bin, cluster.kubeconfig, dir);
    const cannot = (s: SpecReport) => CANNOT_RUN.find((c) => c.match.test(fullName(s)));
    const chosen = all.filter((s) => !cannot(s) && (full || SUBSET.includes(specText(s))));
    assert.ok(chosen.length >= (full ? 40 : SUBSET.length), `the dry run listed ${all.length} specs, ${chosen.length} chosen`);
    // Workers run side by side, each taking the next spec as it finishes one: each spec makes
    // its own namespaces, and most of its time is spent waiting for pods and for probes that
    // time out. Specs of one name (TCP and UDP variants) run in one invocation.
    const queue = [...new Set(chosen.map((s) => s.LeafNodeText))].sort();
    const skip = CANNOT_RUN.map((c) => c.match.source).join('|');
    const results = new Map<string, SpecReport>();
    const started = Date.now();
    let done = 0;
    const worker = async () => {
      for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
        const report = join(dir, `spec-${done++}.json`);
        const args = [`--kubeconfig=${cluster.kubeconfig}`, `--ginkgo.focus=${escapeRegExp(name)}`, `--ginkgo.skip=${skip}`, `--ginkgo.json-report=${report}`, '--ginkgo.no-color'];
        const r = await run(bin, args);
        const suites = JSON.parse(await readFile(report, 'utf8').catch(() => '[]')) as { SpecReports: SpecReport[] }[];
        if (suites.length === 0) throw new Error(`e2e of "${name}" wrote no report (exit ${r.code}):\n${r.stdout.slice(-4000)}${r.stderr.slice(-2000)}`);
        for (const s of suites[0]!.SpecReports) if (s.LeafNodeType === 'It' && s.State !== 'skipped') results.set(fullName(s), s);
      }
    };
    await Promise.all(Array.from({ length: WORKERS }, worker));
    t.diagnostic(`${results.size} specs in ${Math.round((Date.now() - started) / 1000)} s, ${WORKERS} at a time`);
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
