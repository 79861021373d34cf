// The upstream ClusterNetworkPolicy conformance tests (sigs.k8s.io/network-policy-api v0.3.0,
// its conformance/ package, built from hack/npapi by scripts/cluster.sh build) against the real
// cluster with Weir installed by its chart: the standard profile (every test whose features are
// ClusterNetworkPolicy's alone). Each upstream test is one test here and each of its cases a
// subtest, passed, failed or skipped with its reason. This kernel has no SCTP: the four SCTP
// tests are skipped, and the SCTP probes inside the other tests are left out (--sctp=false, see
// hack/npapi), each case saying how many. WEIR_NPAPI_RUN (a `go test -run` pattern, e.g.
// 'TestConformance/CNPAdminTierGress$') runs fewer, for a quicker loop while developing.

import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { clusterUp, installWeir, npapiBinary, type RealCluster, run } from './harness.ts';

/** Tests that cannot run here, each with the reason. */
const CANNOT_RUN: readonly { match: RegExp; reason: string }[] = [{ match: /SCTP$/, reason: 'SCTP connectivity: the pods of this cluster cannot open SCTP sockets (no sctp module in this kernel)' }];
/** What hack/npapi/overlay/sctp_probes.go logs for each SCTP probe it leaves out. */
const SCTP_LEFT_OUT = 'SCTP probe left out (--sctp=false):';

const TOP = 'TestConformance';

interface GoTest {
  state?: 'PASS' | 'FAIL' | 'SKIP';
  /** What the test printed (t.Log, testify's failure report), in order. */
  output: string[];
}

/** The tests of a `go test -test.v` run by full name (TestConformance/CNPAdminTierGress/Should_...),
 *  with their results and what each printed. The suite's tests run one at a time, so each line
 *  belongs to the test its last `=== RUN`/`=== NAME` marker named. */
function parseGoTest(out: string): Map<string, GoTest> {
  const tests = new Map<string, GoTest>();
  let current: GoTest | undefined;
  for (const line of out.split('\n')) {
    const marker = /^=== (?:RUN|NAME|CONT|PAUSE)\s+(\S+)\s*$/.exec(line);
    if (marker) {
      const name = marker[1]!;
      current = tests.get(name) ?? { output: [] };
      tests.set(name, current);
      continue;
    }
    const result = /^\s*--- (PASS|FAIL|SKIP): (\S+) \(/.exec(line);
    if (result) {
      const t = tests.get(result[2]!) ?? { output: [] };
      t.state = result[1] as GoTest['state'];
      tests.set(result[2]!, t);
      continue;
    }
    current?.output.push(line);
  }
  return tests;
}

/** Go writes a test's spaces as underscores; the upstream titles have none of their own. */
const title = (goName: string) => goName.slice(goName.lastIndexOf('/') + 1).replaceAll('_', ' ');
const childrenOf = (tests: Map<string, GoTest>, parent: string) => [...tests.keys()].filter((n) => n.startsWith(`${parent}/`) && !n.slice(parent.length + 1).includes('/'));

/** The probe a failed case stopped at: the last one the suite logged as failing (a probe that
 *  never gives the expected result ends its case). */
const stoppedAt = (t: GoTest) =>
  t.output
    .filter((l) => l.includes('FAILED Command was'))
    .map((l) => l.replace(/^.*FAILED Command was /, '').trim())
    .at(-1);

describe('the upstream ClusterNetworkPolicy conformance tests on a real cluster, Weir installed by its chart', { timeout: 60 * 60_000 }, () => {
  let cluster: RealCluster;
  let dir: string;

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weir-npapi-'));
    cluster = await clusterUp();
    // clusterUp applies crds/, where the ClusterNetworkPolicy CRD is kept beside Weir's own.
    await cluster.k(['get', 'crd', 'clusternetworkpolicies.policy.networking.k8s.io']);
    await installWeir(cluster);
  });

  after(async () => {
    await cluster?.down();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('the standard profile', async (t) => {
    const bin = await npapiBinary();
    const env = { ...process.env, KUBECONFIG: cluster.kubeconfig };
    const common = [`-kubeconfig=${cluster.kubeconfig}`, '-test.v', '-test.count=1'];

    // With its one standard feature exempt, the suite skips every test at once: a list of them.
    const listing = await run(bin, [...common, `-test.run=^${TOP}$`, '-exempt-features=ClusterNetworkPolicy'], { env });
    const listed = childrenOf(parseGoTest(listing.stdout), TOP);
    assert.ok(listed.length >= 30, `the listing run found ${listed.length} tests (exit ${listing.code}):\n${listing.stdout.slice(-3000)}${listing.stderr}`);

    const cannot = (name: string) => CANNOT_RUN.find((c) => c.match.test(title(name)));
    const pattern = process.env.WEIR_NPAPI_RUN ?? `^${TOP}$`;
    const skip = `${TOP}/(${listed.filter(cannot).map(title).join('|')})$`;
    const started = Date.now();
    const r = await run(bin, [...common, `-test.run=${pattern}`, `-test.skip=${skip}`, '-test.timeout=50m', '-sctp=false'], { env });
    const seconds = Math.round((Date.now() - started) / 1000);
    const tests = parseGoTest(r.stdout);
    // The whole run's output outlives the cluster, for the failure a case's excerpt cuts short.
    const log = join(tmpdir(), 'weir-npapi-conformance.log');
    await writeFile(log, r.stdout + r.stderr);
    const top = tests.get(TOP);
    assert.ok(top?.state !== undefined, `the suite did not finish (exit ${r.code}):\n${r.stdout.slice(-4000)}${r.stderr.slice(-2000)}`);
    const setUp = top.output.filter((l) => /Error Trace:|Error:/.test(l));
    assert.equal(setUp.length, 0, `the suite's set-up failed:\n${top.output.join('\n').slice(-4000)}`);
    const ran = childrenOf(tests, TOP).filter((n) => tests.get(n)?.state !== 'SKIP').length;
    t.diagnostic(`${ran} upstream tests run in ${seconds} s, one at a time (output: ${log})`);

    for (const name of listed) {
      const reason = cannot(name)?.reason;
      const got = tests.get(name);
      if (reason !== undefined) {
        await t.test(title(name), { skip: reason }, () => {});
        continue;
      }
      if (got === undefined) continue; // left out by WEIR_NPAPI_RUN
      if (got.state === 'SKIP') {
        const why = got.output.find((l) => /Skipping/.test(l))?.trim() ?? 'skipped by the suite';
        await t.test(title(name), { skip: `upstream: ${why.replace(/^\S+\.go:\d+: /, '')}` }, () => {});
        continue;
      }
      await t.test(title(name), async (tt) => {
        const cases = childrenOf(tests, name);
        for (const c of cases) {
          const kase = tests.get(c)!;
          await tt.test(title(c), (ct) => {
            const leftOut = kase.output.filter((l) => l.includes(SCTP_LEFT_OUT)).length;
            if (leftOut > 0) ct.diagnostic(`${leftOut} SCTP probes left out (no sctp module in this kernel)`);
            const probe = stoppedAt(kase);
            assert.equal(kase.state, 'PASS', `${kase.state ?? 'did not finish'}${probe ? ` at ${probe}` : ''}:\n${kase.output.join('\n').slice(-3000)}`);
          });
        }
        // A failure outside its cases: the test's manifests, or its own checks.
        const ownFailure = got.state === 'FAIL' && cases.every((c) => tests.get(c)!.state !== 'FAIL');
        assert.ok(!ownFailure, `${name} failed outside its cases:\n${got.output.join('\n').slice(-3000)}`);
        assert.ok(got.state !== undefined, `${name} did not finish (exit ${r.code}; log ${log})`);
      });
    }
  });
});
