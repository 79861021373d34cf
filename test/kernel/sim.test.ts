// The simulated Flannel cluster: full connectivity with no policy, bridged same-node frames
// really traversing the node namespace's FORWARD chain (br_netfilter), pods coming and going,
// and complete cleanup (destroy, and Ctrl-C on a program holding a cluster).
// Everything happens inside namespaces named with a fresh unique prefix.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import type { Family } from '../../src/model/types.ts';
import { familyOf } from '../../src/model/types.ts';
import { type Cluster, type ClusterSpec, type PodSpec, createCluster, EXTERNAL_KEY } from '../../src/sim/cluster.ts';
import { deleteAllNs, inNs, listNs } from '../../src/sim/netns.ts';
import { type Cell, type MatrixCluster, type MatrixOptions, diffMatrix, expectMatrix, openProbeClient, probeMatrix, renderMatrix } from '../../src/sim/prober.ts';

const needsRoot = process.getuid?.() !== 0 ? 'needs root (network namespaces)' : false;

const SPEC = {
  tag: 'wsimt',
  nodes: [
    { name: 'node-a', podCIDRs: ['10.244.1.0/24', 'fd00:10:244:1::/64'] },
    { name: 'node-b', podCIDRs: ['10.244.2.0/24', 'fd00:10:244:2::/64'] },
  ],
  pods: [
    { namespace: 'ns1', name: 'a', node: 'node-a', ips: ['10.244.1.2', 'fd00:10:244:1::2'] },
    { namespace: 'ns1', name: 'b', node: 'node-a', ips: ['10.244.1.3', 'fd00:10:244:1::3'] },
    { namespace: 'ns2', name: 'c', node: 'node-a', ips: ['10.244.1.4'] },
    { namespace: 'ns1', name: 'd', node: 'node-b', ips: ['10.244.2.2', 'fd00:10:244:2::2'] },
    { namespace: 'ns2', name: 'e', node: 'node-b', ips: ['10.244.2.3', 'fd00:10:244:2::3'] },
    { namespace: 'ns2', name: 'f', node: 'node-b', ips: ['10.244.2.4', 'fd00:10:244:2::4'] },
  ],
} satisfies ClusterSpec;

const key = (p: PodSpec) => `${p.namespace}/${p.name}`;
const ipOf = (p: PodSpec, f: Family) => p.ips.find((ip) => familyOf(ip) === f)!;
const [A, B, , D] = SPEC.pods;

const allAllowed = () => true;
const except = (blocked: Partial<Cell>) => (c: Cell) => !Object.entries(blocked).every(([k, v]) => c[k as keyof Cell] === v);

async function assertMatrix(cluster: Cluster, opts: MatrixOptions, allowed: (c: Cell) => boolean): Promise<void> {
  const actual = await probeMatrix(cluster, opts);
  const diff = diffMatrix(expectMatrix(cluster, opts, allowed), actual);
  assert.deepEqual(diff, [], `${diff.join('\n')}\n\n${renderMatrix(actual)}`);
}

/** Whether pid still runs after up to `waitMs`. Orphaned servers become zombies of PID 1, which
 *  may reap them late, so a zombie counts as gone. */
async function runningAfter(pid: number, waitMs: number): Promise<boolean> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    if (stat === '' || state === 'Z' || state === 'X') return false;
    if (Date.now() > deadline) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('matrix planning, rendering and diff', () => {
  // A stand-in cluster: planning needs only endpoints, no namespaces.
  const endpoint = (k: string, ips: string[]) => ({ key: k, kind: 'pod' as const, netns: '', ips, socketPath: '', pid: 0 });
  const fake: MatrixCluster = {
    ports: [80, 81],
    external: { ...endpoint(EXTERNAL_KEY, ['172.31.0.200', 'fd00:172:31::200']), kind: 'external' },
    pods: () => [
      { ...endpoint('x/p', ['10.0.0.2', 'fd00::2']), namespace: 'x', name: 'p', node: 'n' },
      { ...endpoint('x/q', ['10.0.0.3']), namespace: 'x', name: 'q', node: 'n' },
    ],
    endpoint: (k) => [fake.external!, ...fake.pods()].find((e) => e.key === k),
  };

  const cases: { name: string; opts: MatrixOptions; allowed: (c: Cell) => boolean; text: string }[] = [
    {
      name: 'single-stack targets and sources are left out of the family they lack',
      opts: {},
      allowed: allAllowed,
      text: [
        'IPv4  ports 80 81, letters T=tcp U=udp, .=blocked',
        '          x/p    x/q',
        'x/p       TU TU  TU TU',
        'x/q       TU TU  TU TU',
        'external  TU TU  TU TU',
        '',
        'IPv6  ports 80 81, letters T=tcp U=udp, .=blocked',
        '          x/p',
        'x/p       TU TU',
        'external  TU TU',
      ].join('\n'),
    },
    {
      name: 'blocked cells show a dot in their protocol slot of their port group',
      opts: { families: [4], sources: ['x/q', EXTERNAL_KEY] },
      allowed: (c) => !(c.target === 'x/p' && ((c.proto === 'udp' && c.port === 80) || c.source === EXTERNAL_KEY)),
      text: ['IPv4  ports 80 81, letters T=tcp U=udp, .=blocked', '          x/p    x/q', 'x/q       T. TU  TU TU', 'external  .. ..  TU TU'].join('\n'),
    },
  ];
  for (const c of cases) {
    test(`renders: ${c.name}`, () => {
      assert.equal(renderMatrix(expectMatrix(fake, c.opts, c.allowed)), c.text);
    });
  }

  test('diff names every disagreeing cell with both verdicts', () => {
    const expected = expectMatrix(fake, {}, except({ source: 'x/q', target: 'x/p', proto: 'tcp', port: 81 }));
    const actual = expectMatrix(fake, {}, except({ source: EXTERNAL_KEY, target: 'x/p', family: 6, proto: 'udp', port: 80 }));
    assert.deepEqual(diffMatrix(expected, actual), ['x/q -> x/p tcp/81 v4: expected DROP, got ALLOW', 'external -> x/p udp/80 v6: expected ALLOW, got DROP']);
    assert.deepEqual(diffMatrix(expected, expectMatrix(fake, { families: [4] }, allAllowed)).slice(-1), ['external -> x/p udp/81 v6: expected ALLOW, got not probed']);
  });
});

describe('simulated Flannel cluster', { skip: needsRoot }, () => {
  let cluster: Cluster;
  let createMs = 0;

  before(async () => {
    const t0 = performance.now();
    cluster = await createCluster(SPEC);
    createMs = performance.now() - t0;
  });
  after(async () => {
    await cluster?.destroy();
  });

  test('node namespaces have v4 and v6 forwarding and both bridge-nf-call switches on', async () => {
    for (const node of cluster.nodes) {
      const out = await inNs(node.netns, 'sysctl', ['-n', 'net.ipv4.ip_forward', 'net.ipv6.conf.all.forwarding', 'net.bridge.bridge-nf-call-iptables', 'net.bridge.bridge-nf-call-ip6tables']);
      assert.deepEqual(out.split('\n'), ['1', '1', '1', '1'], node.netns);
    }
  });

  test('with no policy every source reaches every pod, same node and across nodes, v4 and v6', async (t) => {
    const t0 = performance.now();
    const m = await probeMatrix(cluster);
    const matrixMs = performance.now() - t0;
    t.diagnostic(`cluster creation ${createMs.toFixed(0)} ms (2 nodes, 6 pods, external host); full matrix ${matrixMs.toFixed(0)} ms (${m.cells.size} probes)`);
    assert.deepEqual(diffMatrix(expectMatrix(cluster, {}, allAllowed), m), [], renderMatrix(m));
    // The covered cells follow from the spec: sources (pods + external) x target pods having
    // the family, x 2 protocols x 2 ports.
    const cells = ([4, 6] as const).reduce((sum, f) => {
      const pods = SPEC.pods.filter((p) => p.ips.some((ip) => familyOf(ip) === f)).length;
      return sum + (pods + 1) * pods * 2 * 2;
    }, 0);
    assert.equal(m.cells.size, cells);
    assert.equal([...m.cells.values()].filter(Boolean).length, cells);
  });

  const dropCases = [
    { name: 'IPv4 tcp/81', tool: 'iptables', family: 4, proto: 'tcp', port: 81 },
    { name: 'IPv6 udp/80', tool: 'ip6tables', family: 6, proto: 'udp', port: 80 },
  ] as const;
  for (const c of dropCases) {
    test(`a FORWARD drop in the node namespace blocks a bridged same-node flow (${c.name})`, async () => {
      const nodeNs = cluster.nodes[0].netns;
      // NEW only: replies of the reverse direction still pass, so exactly one directed flow dies.
      const rule = ['FORWARD', '-s', ipOf(A, c.family), '-d', ipOf(B, c.family), '-p', c.proto, '--dport', String(c.port), '-m', 'conntrack', '--ctstate', 'NEW', '-j', 'DROP'];
      await inNs(nodeNs, c.tool, ['-w', '-I', ...rule]);
      try {
        await assertMatrix(cluster, {}, except({ source: key(A), target: key(B), family: c.family, proto: c.proto, port: c.port }));
      } finally {
        await inNs(nodeNs, c.tool, ['-w', '-D', ...rule]);
      }
      await assertMatrix(cluster, { sources: [key(A)], targets: [key(B)] }, allAllowed);
    });
  }

  test('with bridge-nf-call-iptables off the node FORWARD chain sees routed but not bridged frames', async () => {
    const nodeNs = cluster.nodes[0].netns;
    const hostValue = () => readFile('/proc/sys/net/bridge/bridge-nf-call-iptables', 'utf8');
    const hostBefore = await hostValue();
    const rules = [
      ['FORWARD', '-s', ipOf(A, 4), '-d', ipOf(B, 4), '-j', 'DROP'], // same node: bridged
      ['FORWARD', '-s', ipOf(A, 4), '-d', ipOf(D, 4), '-j', 'DROP'], // other node: routed
    ];
    await inNs(nodeNs, 'sysctl', ['-q', '-w', 'net.bridge.bridge-nf-call-iptables=0']);
    try {
      for (const r of rules) await inNs(nodeNs, 'iptables', ['-w', '-I', ...r]);
      await assertMatrix(cluster, { sources: [key(A)], targets: [key(B), key(D)], families: [4] }, (c) => c.target !== key(D));
    } finally {
      for (const r of rules) await inNs(nodeNs, 'iptables', ['-w', '-D', ...r]).catch(() => {});
      await inNs(nodeNs, 'sysctl', ['-q', '-w', 'net.bridge.bridge-nf-call-iptables=1']);
    }
    assert.equal(await hostValue(), hostBefore, 'the switch is per namespace: the host value must not move');
  });

  test('pods added at run time answer at once; removed pods leave nothing behind', async () => {
    const g = { namespace: 'ns3', name: 'g', node: 'node-b', ips: ['10.244.2.9', 'fd00:10:244:2::9'] };
    const pod = await cluster.addPod(g);
    await assertMatrix(cluster, { targets: [key(g)] }, allAllowed);
    await assertMatrix(cluster, { sources: [key(g)] }, allAllowed);

    await cluster.removePod(key(g));
    assert.equal(cluster.endpoint(key(g)), undefined);
    assert.ok(!(await listNs(cluster.prefix)).includes(pod.netns), 'pod namespace deleted');
    assert.equal(await runningAfter(pod.pid, 0), false, 'pod server stopped');
    const client = await openProbeClient(cluster.endpoint(key(A))!);
    try {
      const res = await client.probe({ proto: 'tcp', ip: g.ips[0], port: 80, timeoutMs: 250 });
      assert.equal(res.ok, false, 'nobody answers on the removed pod IP');
    } finally {
      client.close();
    }

    // Same name and IPs again, as when a pod is re-created: reachable straight away.
    await cluster.addPod(g);
    await assertMatrix(cluster, { targets: [key(g)] }, allAllowed);
    await cluster.removePod(key(g));
  });

  test('destroy deletes every namespace with the prefix and every server; twice is fine', async () => {
    const pids = [...cluster.pods(), cluster.external!].map((e) => e.pid);
    assert.ok((await listNs(cluster.prefix)).length >= 2 + 1 + 1 + SPEC.pods.length);
    await cluster.destroy();
    assert.deepEqual(await listNs(cluster.prefix), []);
    for (const pid of pids) assert.equal(await runningAfter(pid, 0), false, `server pid ${pid}`);
    await cluster.destroy();
  });
});

describe('exit cleanup', { skip: needsRoot }, () => {
  test('SIGINT to a program holding a cluster deletes its namespaces and ends it by SIGINT', async () => {
    const clusterUrl = new URL('../../src/sim/cluster.ts', import.meta.url).href;
    const script = `
      import { createCluster } from ${JSON.stringify(clusterUrl)};
      const c = await createCluster({ tag: 'wsimx', nodes: [{ name: 'n', podCIDRs: ['10.244.7.0/24'] }],
        pods: [{ namespace: 'x', name: 'p', node: 'n', ips: ['10.244.7.2'] }] });
      console.log(JSON.stringify({ prefix: c.prefix, pids: [c.external.pid, ...c.pods().map((p) => p.pid)] }));
      setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    let prefix = '';
    let pids: number[] = [];
    try {
      const [line] = (await once(child.stdout, 'data')) as [Buffer];
      ({ prefix, pids } = JSON.parse(line.toString()) as { prefix: string; pids: number[] });
      assert.match(prefix, /^wsimx[0-9a-f]{4}-$/);
      assert.equal(pids.length, 2);
      assert.equal((await listNs(prefix)).length, 4); // underlay, node, pod, external
      const exited = once(child, 'exit');
      child.kill('SIGINT');
      const [code, signal] = await exited;
      assert.deepEqual({ code, signal }, { code: null, signal: 'SIGINT' });
      assert.deepEqual(await listNs(prefix), []);
      for (const pid of pids) assert.equal(await runningAfter(pid, 2000), false, `server pid ${pid}`);
    } finally {
      // On failure: the child and its servers were all started by this test.
      for (const pid of [child.pid, ...pids]) {
        try {
          if (pid !== undefined) process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      if (prefix) await deleteAllNs(prefix);
    }
  });
});
