// The chart's `helm test`: a test hook Pod in the agent's image with an account of its own, and
// the check it runs (node, with the script the Pod carries) against a loopback HTTPS API server
// that serves Nodes and NodePolicyStatus objects as the API server does.

import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:https';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { buildNodeStatus } from '../../../src/status/node-status.ts';
import { run } from '../../support/run.ts';
import { find, type Obj, render } from './helm.ts';

const T0 = Date.parse('2025-06-01T12:00:00Z');
const HOOK = 'helm.sh/hook';
const TOKEN = 'test-token';

/** The certificate of the loopback API server is made with openssl, when it is installed. */
const OPENSSL = (await run('sh', ['-c', 'command -v openssl'])).stdout.trim();

const testPod = (docs: readonly Obj[]): Obj | undefined => docs.find((d) => d.kind === 'Pod' && d.metadata.annotations?.[HOOK] === 'test');

/** A NodePolicyStatus as an agent writes it: Ready and Programmed, or an apply failing. */
function nodeStatus(node: string, applied: boolean): Obj {
  const status = buildNodeStatus(
    {
      synced: true,
      lastApply: applied ? { ok: true } : { ok: false, message: 'iptables-restore: line 7 failed' },
      lastSyncTime: applied ? T0 : null,
      counts: { localPods: 1, policies: 0, sets: 0, chains: 0, rules: 0 },
      policies: [],
    },
    undefined,
    T0,
  );
  return { apiVersion: 'weir.dev/v1alpha1', kind: 'NodePolicyStatus', metadata: { name: node }, status: JSON.parse(JSON.stringify(status)) };
}

const linuxNode = (name: string): Obj => ({ metadata: { name, labels: { 'kubernetes.io/os': 'linux' } } });

describe('the chart: helm test', () => {
  test('on by default, so `helm test` works after a plain install; off on request', async () => {
    assert.ok(testPod(await render()));
    assert.equal(testPod(await render(['--set', 'helmTest.enabled=false'])), undefined);
  });

  test('the test Pod matches no selector of the agents or the controller: a DaemonSet adopts a pod its selector matches, and deletes it', async () => {
    const docs = await render();
    const labels: Record<string, string> = testPod(docs)!.metadata.labels;
    for (const kind of ['DaemonSet', 'Deployment']) {
      for (const d of docs.filter((x) => x.kind === kind)) {
        const selector: Record<string, string> = d.spec.selector.matchLabels;
        assert.ok(!Object.entries(selector).every(([k, v]) => labels[k] === v), `${kind} ${d.metadata.name} selects the test Pod`);
      }
    }
  });

  test('enabled: a test hook Pod running node in the agent image, as nobody, on an account that may only list Nodes and NodePolicyStatus', async () => {
    const docs = await render(['--set', 'helmTest.enabled=true', '--set', 'helmTest.timeoutSeconds=90']);
    const pod = testPod(docs);
    assert.ok(pod, 'a Pod with helm.sh/hook: test');
    assert.equal(pod.metadata.namespace, 'kube-system');
    // Kept after a run for `helm test --logs` and kubectl logs; replaced by the next run.
    assert.equal(pod.metadata.annotations['helm.sh/hook-delete-policy'], 'before-hook-creation');
    const spec = pod.spec;
    assert.equal(spec.restartPolicy, 'Never');
    assert.equal(spec.hostNetwork, true);
    assert.equal(spec.activeDeadlineSeconds, 150);
    assert.deepEqual(spec.securityContext, { runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, seccompProfile: { type: 'RuntimeDefault' } });
    const [c] = spec.containers;
    assert.equal(c.image, find(docs, 'DaemonSet')!.spec.template.spec.containers[0].image);
    assert.deepEqual(c.command, ['node']);
    assert.equal(c.args[0], '-e');
    assert.deepEqual(c.securityContext, { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
    assert.deepEqual(c.env, [
      { name: 'NODE_SELECTOR', value: 'kubernetes.io/os=linux' },
      { name: 'TIMEOUT_SECONDS', value: '90' },
    ]);

    // Its own account, made for the test just before the Pod, and gone once the test passed.
    const name = spec.serviceAccountName;
    assert.equal(name, 'weir-test');
    const account = [find(docs, 'ServiceAccount', name), find(docs, 'ClusterRole', name), find(docs, 'ClusterRoleBinding', name)];
    for (const o of account) {
      assert.ok(o, `${name} account objects`);
      assert.equal(o.metadata.annotations[HOOK], 'test');
      assert.equal(o.metadata.annotations['helm.sh/hook-delete-policy'], 'before-hook-creation,hook-succeeded');
      assert.ok(Number(o.metadata.annotations['helm.sh/hook-weight']) < Number(pod.metadata.annotations['helm.sh/hook-weight'] ?? 0));
    }
    assert.deepEqual(account[1]!.rules, [
      { apiGroups: [''], resources: ['nodes'], verbs: ['list'] },
      { apiGroups: ['weir.dev'], resources: ['nodepolicystatuses'], verbs: ['list'] },
    ]);
    assert.deepEqual(account[2]!.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name });
    assert.deepEqual(account[2]!.subjects, [{ kind: 'ServiceAccount', name, namespace: 'kube-system' }]);

    const pinned = testPod(await render(['--set', 'helmTest.enabled=true', '--set', `image.digest=sha256:${'a'.repeat(64)}`]))!;
    assert.equal(pinned.spec.containers[0].image, `weir@sha256:${'a'.repeat(64)}`);
  });

  describe('the check', { skip: OPENSSL === '' ? 'openssl is not installed: no certificate for the loopback API server' : false }, () => {
    let dir: string;
    let server: Server;
    let pod: Obj;
    /** What the fake API server holds, and the requests it answered. */
    let nodes: Obj[] = [];
    let statuses: Obj[] = [];
    let onRequest: () => void = () => {};
    const requests: string[] = [];

    before(async () => {
      dir = await mkdtemp(join(tmpdir(), 'weir-helm-test-'));
      const made = await run(OPENSSL, [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '1',
        '-subj',
        '/CN=127.0.0.1',
        '-addext',
        'subjectAltName=IP:127.0.0.1',
        '-keyout',
        join(dir, 'key.pem'),
        '-out',
        join(dir, 'ca.crt'),
      ]);
      assert.equal(made.code, 0, made.stderr);
      await writeFile(join(dir, 'token'), `${TOKEN}\n`);
      server = createServer({ key: await readFile(join(dir, 'key.pem')), cert: await readFile(join(dir, 'ca.crt')) }, (req, res) => {
        const url = new URL(req.url ?? '/', 'https://127.0.0.1');
        requests.push(`${url.pathname}${url.search}`);
        onRequest();
        const send = (code: number, body: unknown) => {
          res.writeHead(code, { 'content-type': 'application/json' });
          res.end(JSON.stringify(body));
        };
        if (req.headers.authorization !== `Bearer ${TOKEN}`) return send(401, { kind: 'Status', code: 401 });
        if (url.pathname === '/api/v1/nodes') {
          const wanted = (url.searchParams.get('labelSelector') ?? '').split(',').filter(Boolean);
          const items = nodes.filter((n) => wanted.every((w) => n.metadata.labels?.[w.split('=')[0]] === w.split('=')[1]));
          return send(200, { kind: 'NodeList', items });
        }
        if (url.pathname === '/apis/weir.dev/v1alpha1/nodepolicystatuses') return send(200, { kind: 'NodePolicyStatusList', items: statuses });
        send(404, { kind: 'Status', code: 404 });
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      pod = testPod(await render(['--set', 'helmTest.enabled=true']))!;
    });
    after(async () => {
      if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
      if (dir) await rm(dir, { recursive: true, force: true });
    });

    /** Runs the Pod's command as the kubelet would (its env, the API server's address), with
     *  this machine's node and the service account's files from `dir`. */
    async function check(timeoutSeconds: number) {
      const c = pod.spec.containers[0];
      const env: NodeJS.ProcessEnv = { ...process.env };
      for (const e of c.env as { name: string; value: string }[]) env[e.name] = e.value;
      Object.assign(env, {
        TIMEOUT_SECONDS: String(timeoutSeconds),
        KUBERNETES_SERVICE_HOST: '127.0.0.1',
        KUBERNETES_SERVICE_PORT: String((server.address() as AddressInfo).port),
        SERVICE_ACCOUNT_DIR: dir,
      });
      requests.length = 0;
      return run(process.execPath, c.args, { env });
    }

    test('every node the agents select Ready and Programmed: it passes, naming each', async () => {
      nodes = [linuxNode('node-b'), linuxNode('node-a'), { metadata: { name: 'win-1', labels: { 'kubernetes.io/os': 'windows' } } }];
      statuses = [nodeStatus('node-a', true), nodeStatus('node-b', true)];
      const r = await check(0);
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.deepEqual(r.stdout.trim().split('\n'), ['node-a: Ready True, Programmed True', 'node-b: Ready True, Programmed True', 'every node (2) is Ready and Programmed']);
      assert.deepEqual(requests, ['/api/v1/nodes?labelSelector=kubernetes.io%2Fos%3Dlinux', '/apis/weir.dev/v1alpha1/nodepolicystatuses']);
    });

    test('a node not Programmed, or without a NodePolicyStatus: it fails, naming each with the reason', async () => {
      nodes = [linuxNode('node-a'), linuxNode('node-b'), linuxNode('node-c')];
      statuses = [nodeStatus('node-a', true), nodeStatus('node-b', false)];
      const r = await check(0);
      assert.equal(r.code, 1, r.stdout + r.stderr);
      assert.deepEqual(r.stdout.trim().split('\n'), [
        'node-a: Ready True, Programmed True',
        'node-b: Ready False, Programmed False (ApplyFailed: the kernel may not hold the latest policy state: iptables-restore: line 7 failed)',
        'node-c: no NodePolicyStatus (is its agent running?)',
        '2 of 3 nodes are not Ready and Programmed',
      ]);
    });

    test('no node selected, or the API server refusing: it fails, saying so', async () => {
      nodes = [];
      statuses = [];
      const none = await check(0);
      assert.equal(none.code, 1);
      assert.match(none.stdout, /no node matches the agents' nodeSelector kubernetes\.io\/os=linux/);
      await writeFile(join(dir, 'token'), 'another-token\n');
      try {
        const refused = await check(0);
        assert.equal(refused.code, 1);
        assert.match(refused.stdout, /GET \/api\/v1\/nodes\?labelSelector=kubernetes\.io%2Fos%3Dlinux: HTTP 401/);
      } finally {
        await writeFile(join(dir, 'token'), `${TOKEN}\n`);
      }
    });

    test('it waits, up to its timeout, for a node to become Ready and Programmed', async () => {
      nodes = [linuxNode('node-a')];
      statuses = [nodeStatus('node-a', false)];
      // The agent's next apply succeeds while the check waits: its second try sees it.
      onRequest = () => {
        if (requests.length === 3) statuses = [nodeStatus('node-a', true)];
      };
      try {
        const r = await check(30);
        assert.equal(r.code, 0, r.stdout + r.stderr);
        assert.equal(requests.length, 4, 'one more try');
        assert.match(r.stdout, /^node-a: Ready True, Programmed True\n/);
      } finally {
        onRequest = () => {};
      }
    });
  });
});
