// `weir explain` as a command: its flags beside the agent's, text and JSON output, exit codes,
// and the cluster as its source through a kubeconfig (a loopback fake of the API server).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { makeNames } from '../../../src/calc/index.ts';
import { runExplain } from '../../../src/cli/explain.ts';
import type { Explanation } from '../../../src/explain/explain.ts';
import { FakeApiServer } from '../sources/kube-fake-api.ts';

const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
const EXAMPLES = fileURLToPath(new URL('../../../examples/', import.meta.url));

async function run(argv: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await runExplain(argv, env, { stdout: (s) => void (out += s), stderr: (s) => void (err += s) });
  return { code, out, err };
}

describe('weir explain over a manifests directory', () => {
  test('the text answer: per family the verdict, per direction what decided it, its chain, position and sets', async () => {
    const r = await run(['backend/api-1', 'db/db-1', '--port', '80', '--manifests', EXAMPLES]);
    assert.equal(r.code, 0, r.err);
    const lines = r.out.split('\n');
    assert.equal(lines[0], 'backend/api-1 (node-a) -> db/db-1 (node-a), TCP 80');
    assert.equal(lines[1], 'IPv4 10.244.1.20 -> 10.244.1.30: allowed');
    assert.match(r.out, /\n {2}ingress at node-a, db\/db-1: allowed by db\/allow-backend-to-db ingress rule 0\n/);
    assert.match(r.out, /passed on by ClusterNetworkPolicy db-only-from-backend \(Admin\) rule 0 "backend-decides-by-networkpolicy" \(Pass\)/);
    assert.match(r.out, /rule: cali-tw-\S+ #\d+ "merged peers of ingress policies": source in set cali40s:\S+, TCP port 80, then set mark 0x10000/);
    assert.match(r.out, /set cali40s:\S+ holds 10\.244\.1\.20/);
    assert.match(r.out, /path: cali-FORWARD #\d+ > cali-to-wl-dispatch #\d+ > /);
    assert.match(r.out, /\nIPv6 fd00:10:244:1::20 -> fd00:10:244:1::30: allowed\n/);
  });

  test('-o json for scripts; the agent flags shape the chains, from the command line or WEIR_* variables', async () => {
    const r = await run(['frontend/web-1', 'db/db-1', '--port', '80', '--protocol', 'tcp', '--family', '4', '-o', 'json'], { WEIR_MANIFESTS: EXAMPLES, WEIR_CHAIN_PREFIX: 'weir' });
    assert.equal(r.code, 0, r.err);
    const x = JSON.parse(r.out) as Explanation;
    assert.deepEqual(
      x.families.map((f) => [f.family, f.verdict]),
      [[4, 'denied']],
    );
    const ingress = x.families[0].directions[1];
    assert.deepEqual([ingress.direction, ingress.reason, ingress.clusterRule?.name, ingress.clusterRule?.ruleName], ['ingress', 'cluster-policy', 'db-only-from-backend', 'no-other-pod']);
    assert.equal(ingress.rule?.chain, makeNames('weir').tierChain('admin', 'ingress', 'db/db-1'));
    assert.doesNotMatch(r.out, /cali-/);
  });

  test('bad input exits 2 saying what is wrong, and nothing on standard output', async () => {
    for (const [argv, message] of [
      [['frontend/web-9', 'db/db-1', '--port', '80'], /source: there is no pod frontend\/web-9; namespace frontend holds web-1, web-2/],
      [['frontend/web-1', 'db/db-1'], /--port is required/],
      [['frontend/web-1', 'db/db-1', '--port', '70000'], /--port must be a number from 1 to 65535, got "70000"/],
      [['frontend/web-1', '--port', '80'], /expected SRC and DST/],
      [['frontend/web-1', 'db/db-1', '--port', '80', '--protocol', 'icmp'], /--protocol must be tcp, udp or sctp, got "icmp"/],
      [['frontend/web-1', 'db/db-1', '--port', '80', '-o', 'yaml'], /--output \(-o\) must be text or json/],
      [['frontend/web-1', 'db/db-1', '--port', '80', '--metrics-addr', ':9'], /Unknown option '--metrics-addr'/],
      [['frontend/web-1', 'db/db-1', '--port', '80', '--node-check'], /--node-check needs --node-name/],
      [['192.0.2.1', '198.51.100.7', '--port', '80'], /neither end is a pod/],
      [['frontend/web-1', 'db/db-1', '--port', '80', '--mark-mask', '0x4000'], /mark/],
    ] as const) {
      const r = await run([...argv, '--manifests', EXAMPLES]);
      assert.equal(r.code, 2, `${argv.join(' ')}: ${r.err}`);
      assert.match(r.err, message);
      assert.equal(r.out, '');
    }
  });

  test('--help lists its own flags and the agent flags that shape the chains', async () => {
    const r = await run(['--help']);
    assert.equal(r.code, 0);
    assert.match(r.out, /^Usage: weir explain SRC DST --port N/);
    assert.match(r.out, /--chain-prefix\s+WEIR_CHAIN_PREFIX/);
    assert.match(r.out, /--output\s+text \(default/);
  });

  test('weir explain is a command of weir', () => {
    const r = spawnSync(process.execPath, [MAIN, 'explain', 'web-1', 'api-1', '--port', '80', '--family', '4', '--manifests', EXAMPLES], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^frontend\/web-1 \(node-a\) -> backend\/api-1 \(node-a\), TCP 80\nIPv4 10\.244\.1\.10 -> 10\.244\.1\.20: allowed\n/);
    const bad = spawnSync(process.execPath, [MAIN, 'explain', 'web', 'api-1', '--port', '80', '--manifests', EXAMPLES], { encoding: 'utf8' });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /^weir explain: source: no pod is named web in any namespace/);
  });
});

describe('weir explain over the cluster', () => {
  const api = new FakeApiServer();
  let dir: string;
  let kubeconfig: string;
  before(async () => {
    await api.start();
    dir = mkdtempSync(join(tmpdir(), 'weir-explain-cli-'));
    kubeconfig = join(dir, 'kubeconfig.json');
    writeFileSync(kubeconfig, api.kubeConfig().exportConfig());
    api.set('Namespace', { metadata: { name: 'shop', labels: { 'kubernetes.io/metadata.name': 'shop' } } });
    api.set('Node', { metadata: { name: 'node-a' }, spec: { podCIDRs: ['10.244.1.0/24'] } });
    api.set('Node', { metadata: { name: 'node-b' }, spec: { podCIDRs: ['10.244.2.0/24'] } });
    const pod = (name: string, node: string, ip: string, app: string) => ({
      metadata: { name, namespace: 'shop', labels: { app } },
      spec: { nodeName: node, containers: [{ name: 'c' }] },
      status: { phase: 'Running', podIP: ip, podIPs: [{ ip }] },
    });
    api.set('Pod', pod('web', 'node-a', '10.244.1.5', 'web'));
    api.set('Pod', pod('db', 'node-b', '10.244.2.6', 'db'));
    api.set('NetworkPolicy', {
      metadata: { name: 'db-from-web', namespace: 'shop' },
      spec: { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'web' } } }], ports: [{ port: 5432 }] }] },
    });
  });
  after(async () => {
    await api.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('lists pods, namespaces, policies and every Node through the kubeconfig, as the agent reads it', async () => {
    const r = await run(['shop/web', 'shop/db', '--port', '5432', '--kubeconfig', kubeconfig, '-o', 'json']);
    assert.equal(r.code, 0, r.err);
    const x = JSON.parse(r.out) as Explanation;
    assert.deepEqual(
      x.families[0].directions.map((d) => [d.direction, d.node, d.verdict, d.allowedBy]),
      [
        ['egress', 'node-a', 'not isolated', undefined],
        ['ingress', 'node-b', 'allowed', [{ namespace: 'shop', name: 'db-from-web', rule: 0 }]],
      ],
    );
    // The Nodes' pod CIDRs place an address no pod holds.
    const unknown = await run(['10.244.1.77', 'shop/db', '--port', '5432', '--kubeconfig', kubeconfig]);
    assert.equal(unknown.code, 0, unknown.err);
    assert.match(unknown.out, /egress at node-a, an address no pod holds: denied \(no pod node-a knows sends or receives with that address: fail closed\)/);
  });

  test('without Nodes it warns and places addresses by pods alone', async () => {
    api.fault('Node', 'list', { status: 403, reason: 'Forbidden' });
    const r = await run(['10.244.1.77', 'shop/db', '--port', '5432', '--kubeconfig', kubeconfig]);
    assert.equal(r.code, 0, r.err);
    assert.match(r.err, /^weir explain: warning: cannot list Nodes \(.*\): addresses are placed by pods alone/);
    assert.match(r.out, /^10\.244\.1\.77 \(no pod holds it, and it is in no node's pod CIDR/);
  });

  test('a cluster that does not answer in --timeout seconds exits 1 saying so', async () => {
    let release = () => {};
    api.fault('Pod', 'list', { hold: new Promise<void>((r) => (release = r)) });
    try {
      const r = await run(['shop/web', 'shop/db', '--port', '5432', '--kubeconfig', kubeconfig, '--timeout', '1']);
      assert.equal(r.code, 1);
      assert.match(r.err, /were not listed within 1 s/);
    } finally {
      release();
    }
  });
});
