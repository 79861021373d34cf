// The integration control plane is a real API server: it stores and serves policies and pods,
// keeps status behind its subresource, enforces RBAC, works with @kubernetes/client-node, and
// survives an API server restart. The first run builds kube-apiserver (many minutes, cached).

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { closeSync, copyFileSync, existsSync, fsyncSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CoreV1Api, KubeConfig, Watch } from '@kubernetes/client-node';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

const SCRIPT = fileURLToPath(new URL('../../scripts/control-plane.sh', import.meta.url));

const NS = 'weir-it';

const NAMESPACE_AND_POLICY = `
apiVersion: v1
kind: Namespace
metadata:
  name: ${NS}
  labels: {team: a}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-from-team-a
  namespace: ${NS}
spec:
  podSelector:
    matchLabels: {app: web}
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {team: a}
    ports:
    - {protocol: TCP, port: 80}
`;

const POD = {
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: { name: 'web-1', namespace: NS, labels: { app: 'web' } },
  spec: { nodeName: 'node-a', containers: [{ name: 'web', image: 'example.invalid/web:1' }] },
};

const RUNNING = { phase: 'Running', podIP: '10.244.1.5', podIPs: [{ ip: '10.244.1.5' }, { ip: 'fd00:10:244:1::5' }] };

interface PodJson {
  metadata: { name: string; labels?: Record<string, string> };
  status?: { phase?: string; podIP?: string; podIPs?: { ip: string }[] };
}

/** A zombie (killed, not yet reaped by whoever adopted it) has an empty command line. */
function running(pid: number | undefined): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`).length > 0;
  } catch {
    return false;
  }
}

function pidsOf(cp: ControlPlane): Map<string, number> {
  const lines = readFileSync(join(cp.dir, 'pids'), 'utf8').trim().split('\n');
  return new Map(
    lines.map((line) => {
      const [name, pid] = line.split(' ');
      return [name, Number(pid)];
    }),
  );
}

describe('integration control plane', () => {
  let cp: ControlPlane;

  before(async () => {
    cp = await startControlPlane();
  });
  after(async () => {
    await cp?.stop();
  });

  it('serves /readyz over TLS to the admin token', async (t) => {
    t.diagnostic(`control plane started in ${(cp.startMs / 1000).toFixed(1)}s at ${cp.server}`);
    const version = JSON.parse(await cp.kubectl(['version', '-o', 'json'])) as { serverVersion: { gitVersion: string } };
    assert.match(version.serverVersion.gitVersion, /^v1\.\d+\.\d+$/);
    assert.equal(await cp.kubectl(['get', '--raw', '/readyz']), 'ok');
    assert.match(cp.server, /^https:\/\/127\.0\.0\.1:\d+$/);
    assert.match(cp.token, /^[0-9a-f]{64}$/);
  });

  it('kubectl apply stores a Namespace and a NetworkPolicy that get -o json returns', async () => {
    await cp.kubectl(['apply', '-f', '-'], NAMESPACE_AND_POLICY);
    const list = JSON.parse(await cp.kubectl(['get', 'networkpolicy', '-n', NS, '-o', 'json'])) as {
      items: { metadata: { name: string }; spec: unknown }[];
    };
    assert.deepEqual(
      list.items.map((p) => p.metadata.name),
      ['web-from-team-a'],
    );
    assert.deepEqual(list.items[0].spec, {
      podSelector: { matchLabels: { app: 'web' } },
      policyTypes: ['Ingress'],
      ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } } }], ports: [{ protocol: 'TCP', port: 80 }] }],
    });
    const ns = JSON.parse(await cp.kubectl(['get', 'namespace', NS, '-o', 'json'])) as { metadata: { labels?: Record<string, string> } };
    assert.equal(ns.metadata.labels?.team, 'a');
  });

  it('a pod takes its status only through the status subresource', async () => {
    await cp.kubectl(['create', '-f', '-'], JSON.stringify(POD));
    // A status in a patch of the pod itself is dropped by the real API server.
    await cp.kubectl(['patch', 'pod', 'web-1', '-n', NS, '--type=merge', '-p', JSON.stringify({ status: RUNNING })]);
    const before = JSON.parse(await cp.kubectl(['get', 'pod', 'web-1', '-n', NS, '-o', 'json'])) as PodJson;
    assert.notEqual(before.status?.phase, 'Running');
    assert.equal(before.status?.podIPs, undefined);

    await cp.kubectl(['patch', 'pod', 'web-1', '-n', NS, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: RUNNING })]);
    const pod = JSON.parse(await cp.kubectl(['get', 'pod', 'web-1', '-n', NS, '-o', 'json'])) as PodJson;
    assert.equal(pod.status?.phase, 'Running');
    assert.equal(pod.status?.podIP, RUNNING.podIP);
    assert.deepEqual(pod.status?.podIPs, RUNNING.podIPs);
  });

  it('@kubernetes/client-node lists the pods with their status', async () => {
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
    const core = kc.makeApiClient(CoreV1Api);
    const pods = await core.listNamespacedPod({ namespace: NS });
    assert.deepEqual(
      pods.items.map((p) => ({ name: p.metadata?.name, phase: p.status?.phase, ips: p.status?.podIPs?.map((i) => i.ip) })),
      [{ name: 'web-1', phase: 'Running', ips: RUNNING.podIPs.map((i) => i.ip) }],
    );
  });

  it('a client-node watch sees a pod created after it started, with the status written later', async () => {
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
    const events: string[] = [];
    let seen: () => void = () => {};
    const sawRunning = new Promise<void>((resolve) => {
      seen = resolve;
    });
    const watch = await new Watch(kc).watch(
      `/api/v1/namespaces/${NS}/pods`,
      { fieldSelector: 'metadata.name=web-2' },
      (type, pod: PodJson) => {
        events.push(`${type} ${pod.status?.phase ?? '-'}`);
        if (pod.status?.phase === 'Running') seen();
      },
      () => {},
    );
    try {
      await cp.kubectl(['create', '-f', '-'], JSON.stringify({ ...POD, metadata: { ...POD.metadata, name: 'web-2' } }));
      await cp.kubectl(['patch', 'pod', 'web-2', '-n', NS, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: RUNNING })]);
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no Running event in 15s; saw ${events.join(', ')}`)), 15_000);
      });
      await Promise.race([sawRunning, timedOut]).finally(() => clearTimeout(timer));
      assert.deepEqual(events, ['ADDED Pending', 'MODIFIED Running']);
    } finally {
      watch.abort();
      // No kubelet finishes a graceful delete: remove it at once.
      await cp.kubectl(['delete', 'pod', 'web-2', '-n', NS, '--force', '--grace-period=0']);
    }
  });

  it('RBAC lets a service account do only what a binding grants', async () => {
    await cp.kubectl(['create', 'serviceaccount', 'agent', '-n', NS]);
    const token = (await cp.kubectl(['create', 'token', 'agent', '-n', NS])).trim();
    const asAgent = (args: string[]): Promise<string> => cp.kubectl(['--token', token, ...args]);
    await assert.rejects(asAgent(['get', 'pods', '-n', NS]), /forbidden/i);

    await cp.kubectl(['create', 'role', 'pod-reader', '-n', NS, '--verb=get,list,watch', '--resource=pods']);
    await cp.kubectl(['create', 'rolebinding', 'agent-reads-pods', '-n', NS, '--role=pod-reader', `--serviceaccount=${NS}:agent`]);
    assert.match(await asAgent(['get', 'pods', '-n', NS, '-o', 'name']), /^pod\/web-1$/m);
    await assert.rejects(asAgent(['patch', 'pod', 'web-1', '-n', NS, '--subresource=status', '--type=merge', '-p', '{"status":{"phase":"Failed"}}']), /forbidden/i);
  });

  it('serves again after kube-apiserver restarts, with the same objects', async () => {
    const oldPid = pidsOf(cp).get('kube-apiserver');
    await cp.restartApiServer();
    const newPid = pidsOf(cp).get('kube-apiserver');
    assert.notEqual(newPid, oldPid);
    assert.equal(running(oldPid), false);
    const pod = JSON.parse(await cp.kubectl(['get', 'pod', 'web-1', '-n', NS, '-o', 'json'])) as PodJson;
    assert.equal(pod.status?.phase, 'Running');
    assert.match(await cp.kubectl(['get', 'networkpolicy', '-n', NS, '-o', 'name']), /web-from-team-a/);
  });

  it('stop kills exactly the processes it started', async () => {
    const pids = [...pidsOf(cp).values()];
    assert.equal(pids.length, 2);
    for (const pid of pids) assert.equal(running(pid), true, `pid ${pid} runs before stop`);
    await cp.stop();
    for (const pid of pids) assert.equal(running(pid), false, `pid ${pid} gone after stop`);
    assert.equal(existsSync(cp.dir), false);
  });
});

/** A TCP listener on 127.0.0.1 (port 0: any free one), holding its port until closed. */
async function listen(port = 0): Promise<{ server: Server; port: number }> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  const addr = server.address();
  if (addr === null || typeof addr === 'string') throw new Error('no TCP address');
  return { server, port: addr.port };
}

/** A port free right now (taken and released). */
async function freePort(): Promise<number> {
  const { server, port } = await listen();
  await new Promise((r) => server.close(r));
  return port;
}

/** Runs the script itself (stdout and stderr kept apart); never rejects. */
function runScript(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(SCRIPT, args, { maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, stdout, stderr });
    });
  });
}

/** Bytes of FILE in the page cache (util-linux fincore). */
function cachedBytes(file: string): number {
  return Number(execFileSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', file]).toString().trim());
}

/** Sets environment variables for the scripts startControlPlane runs, for the span of fn. */
async function withEnv<T>(vars: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const old = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  Object.assign(process.env, vars);
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(old)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

describe('control plane start-up', () => {
  // What failed a CI run on a fresh machine ("etcd exited before it was healthy", with no etcd
  // line): while a binary not yet in the page cache is being exec'd, /proc/PID/cmdline reads
  // empty for milliseconds, and the start took that for etcd's exit.
  it('an etcd binary that is not in the page cache starts every time', async () => {
    const work = mkdtempSync(join(tmpdir(), 'weir-etcd-cold-'));
    try {
      const etcd = join(work, 'etcd');
      copyFileSync(execFileSync('bash', ['-c', 'command -v etcd']).toString().trim(), etcd);
      const fd = openSync(etcd, 'r');
      fsyncSync(fd); // only clean pages can be dropped from the cache
      closeSync(fd);
      const starts = 3;
      for (let i = 0; i < starts; i++) {
        execFileSync('dd', [`if=${etcd}`, 'iflag=nocache', 'count=0', 'status=none']);
        assert.equal(cachedBytes(etcd), 0, 'the etcd binary is out of the page cache before the start');
        const cp = await withEnv({ WEIR_ETCD: etcd }, () => startControlPlane());
        try {
          assert.equal(await cp.kubectl(['get', '--raw', '/readyz']), 'ok');
        } finally {
          await cp.stop();
        }
      }
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  });

  it("a fresh start whose etcd port is taken tries fresh ports, quoting etcd's bind error", async () => {
    const taken = await listen();
    const dir = mkdtempSync(join(tmpdir(), 'weir-controlplane-'));
    try {
      // A fresh DIR's ports.env is a first choice (the CI run: two starts chose the same port).
      writeFileSync(join(dir, 'ports.env'), `etcd_client_port=${taken.port}\netcd_peer_port=${await freePort()}\napiserver_port=${await freePort()}\n`);
      const r = await runScript(['start', dir]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stderr, new RegExp(`listen tcp 127\\.0\\.0\\.1:${taken.port}: bind: address already in use`));
      assert.match(r.stderr, /retrying with fresh ports/);
      const ports = readFileSync(join(dir, 'ports.env'), 'utf8');
      assert.doesNotMatch(ports, new RegExp(`=${taken.port}$`, 'm'));
      assert.match(readFileSync(join(dir, 'kubeconfig'), 'utf8'), new RegExp(`server: https://127\\.0\\.0\\.1:${/^apiserver_port=(\d+)$/m.exec(ports)?.[1]}\n`));
    } finally {
      await runScript(['stop', dir]);
      rmSync(dir, { recursive: true, force: true });
      taken.server.close();
    }
  });

  it('a fresh start whose API server port is taken tries another port', async () => {
    const taken = await listen();
    const dir = mkdtempSync(join(tmpdir(), 'weir-controlplane-'));
    try {
      writeFileSync(join(dir, 'ports.env'), `etcd_client_port=${await freePort()}\netcd_peer_port=${await freePort()}\napiserver_port=${taken.port}\n`);
      const r = await runScript(['start', dir]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stderr, new RegExp(`127\\.0\\.0\\.1:${taken.port}: bind: address already in use`));
      const port = /^apiserver_port=(\d+)$/m.exec(readFileSync(join(dir, 'ports.env'), 'utf8'))?.[1];
      assert.notEqual(Number(port), taken.port);
      const kubectl = join(execFileSync(SCRIPT, ['build']).toString().trim(), 'kubectl');
      assert.equal(execFileSync(kubectl, ['--kubeconfig', join(dir, 'kubeconfig'), 'get', '--raw', '/readyz']).toString(), 'ok');
    } finally {
      await runScript(['stop', dir]);
      rmSync(dir, { recursive: true, force: true });
      taken.server.close();
    }
  });

  it("a start whose etcd fails rejects with etcd's own last log lines", async () => {
    // etcd refuses an ETCD_* variable that a flag shadows: a real etcd failure, every time.
    await assert.rejects(
      withEnv({ ETCD_NAME: 'shadowed' }, () => startControlPlane()),
      (err: Error) => {
        assert.match(err.message, /conflicting environment variable "ETCD_NAME" is shadowed/);
        assert.match(err.message, /etcd exited with status 1 before it was healthy/);
        return true;
      },
    );
  });
});
