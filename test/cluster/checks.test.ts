// Weir on a real cluster, beyond the upstream specs: what only a real kubelet, container
// runtime and flanneld can do to a node (restart a container, restart flanneld, hand a freed
// address to a new pod), and an uninstall that must leave the nodes as they were, by itself. Each check
// fails without Weir (the denied flow connects) or with a Weir that gets it wrong.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { join } from 'node:path';
import { agentsReady, agnhostPod, clusterUp, connects, eventually, expectConnects, installWeir, NODES, ok, type RealCluster, REPO, run, runPods } from './harness.ts';
import { ECHO_CLIENT, ECHO_SERVER, NsProcess } from '../conformance/echo.ts';
import { longestOutage, podNetns, startProber } from './prober.ts';

const NS = 'checks';

/** Each node's netfilter state, as the operator would compare it: rules and sets, no counters. */
async function nodeState(c: RealCluster): Promise<Record<string, string>> {
  const state: Record<string, string> = {};
  for (const node of NODES) {
    const parts: string[] = [];
    for (const cmd of [['iptables-save'], ['ip6tables-save'], ['iptables-legacy-save'], ['ipset', 'list', '-n']]) {
      const out = ok(`${cmd[0]} on ${node}`, await c.onNode(node, cmd));
      parts.push(
        out
          .split('\n')
          .filter((l) => !l.startsWith('#'))
          .map((l) => l.replace(/\[\d+:\d+\]/, ''))
          .join('\n'),
      );
    }
    state[node] = parts.join('\n');
  }
  return state;
}

const denyAllBut = (name: string, podLabel: Record<string, string>, from: Record<string, string>) => ({
  apiVersion: 'networking.k8s.io/v1',
  kind: 'NetworkPolicy',
  metadata: { name, namespace: NS },
  spec: { podSelector: { matchLabels: podLabel }, policyTypes: ['Ingress'], ingress: [{ from: [{ podSelector: { matchLabels: from } }] }] },
});

/** Every process of the agent container on a node, as that node's containerd counts them
 *  (the task's cgroup): its program and the kernel's seccomp mode (0 none, 2 filter). */
async function agentProcesses(c: RealCluster, node: string): Promise<{ pid: string; program: string; seccomp: string }[]> {
  const id = (
    await c.k([
      '-n',
      'kube-system',
      'get',
      'pods',
      '-l',
      'app.kubernetes.io/name=weir',
      '--field-selector',
      `spec.nodeName=${node}`,
      '-o',
      'jsonpath={.items[0].status.containerStatuses[0].containerID}',
    ])
  ).replace('containerd://', '');
  assert.match(id, /^[0-9a-f]{64}$/, `the agent container on ${node}`);
  const pids = ok('ctr tasks ps', await c.onNode(node, ['ctr', '-a', '/run/containerd/containerd.sock', '-n', 'k8s.io', 'tasks', 'ps', id]))
    .split('\n')
    .slice(1)
    .map((l) => l.trim().split(/\s+/)[0]!)
    .filter((p) => /^\d+$/.test(p));
  // One read of them all; a command the fork server ran may have exited in between.
  const read = 'for p in "$@"; do s=$(cat /proc/$p/status 2>/dev/null) && e=$(readlink /proc/$p/exe) && printf "%s %s %s\\n" "$p" "$(basename "$e")" "$(echo "$s" | sed -n "s/^Seccomp:\\t//p")"; done';
  const out = ok('read /proc/PID/status', await c.onNode(node, ['sh', '-c', read, 'sh', ...pids]));
  return out
    .trim()
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [pid, program, seccomp] = l.split(' ') as [string, string, string];
      return { pid, program, seccomp };
    });
}

/** A denied flow stays denied: `times` attempts, each of which must time out. */
async function staysDenied(c: RealCluster, from: string, ip: string, times = 3): Promise<void> {
  for (let i = 0; i < times; i++) assert.equal(await connects(c, NS, from, ip, 80, 1), false, `${from} → ${ip} connected (attempt ${i + 1})`);
}

describe('Weir on a real cluster (kubelet, containerd, Flannel, kube-proxy), installed by its chart', { timeout: 20 * 60_000 }, () => {
  let c: RealCluster;
  let before_: Record<string, string>;
  let ips: Record<string, string>;

  before(async () => {
    c = await clusterUp();
    before_ = await nodeState(c);
    await installWeir(c);
    await c.k(['create', 'namespace', NS]);
    ips = await runPods(c, NS, [
      agnhostPod('server', NS, 'node-2', { app: 'server' }, { udp: true }),
      agnhostPod('friend', NS, 'node-1', { role: 'friend' }),
      agnhostPod('stranger', NS, 'node-1', { role: 'stranger' }),
    ]);
  });

  after(async () => {
    await c?.down();
  });

  // The chart asks for the runtime's default seccomp filter (containerd's): every process the
  // agent starts inherits it. What is refused under it fails silently (EPERM or ENOSYS), so the
  // audit reader (tcpdump on NFLOG, started by setpriv as its own user) is proven by a line it wrote;
  // the fork server, iptables-restore, ipset, conntrack and nsenter by the checks below.
  test('the agents run under seccomp RuntimeDefault, every process of their containers, and their audit log still writes', async () => {
    for (const node of NODES) {
      const procs = await agentProcesses(c, node);
      assert.deepEqual(
        procs.filter((p) => p.seccomp !== '2'),
        [],
        `processes of the agent on ${node} without a seccomp filter`,
      );
      // The agent, its fork server (sh is dash) and the audit reader.
      const programs = new Set(procs.map((p) => p.program));
      for (const program of ['node', 'dash', 'tcpdump']) assert.ok(programs.has(program), `no ${program} among the agent's processes on ${node}: ${[...programs].join(', ')}`);
    }
    const policy = denyAllBut('audited', { app: 'server' }, { role: 'friend' });
    await c.k(['apply', '-f', '-'], JSON.stringify({ ...policy, metadata: { ...policy.metadata, annotations: { 'weir.dev/audit': 'all' } } }));
    await expectConnects(c, NS, 'stranger', ips.server!, false, 'the audited policy denies stranger');
    // The server's node logs the drop (ingress is policed where the pod lives).
    await eventually(
      "node-2's audit log names the drop",
      async () => (await c.onNode('node-2', ['cat', '/var/log/weir/audit.log'])).stdout,
      (log) =>
        log
          .split('\n')
          .filter((l) => l !== '')
          .some((l) => {
            const e = JSON.parse(l) as { verdict: string; src: { pod: string }; dst: { pod: string } };
            return e.verdict === 'deny' && e.src.pod === 'stranger' && e.dst.pod === 'server';
          }),
      20_000,
    );
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'audited']);
  });

  test('a policy applied with kubectl isolates a pod the kubelet made, and deleting it opens the pod again', async () => {
    await expectConnects(c, NS, 'stranger', ips.server!, true, 'stranger reaches server before any policy');
    await c.k(['apply', '-f', '-'], JSON.stringify(denyAllBut('only-friends', { app: 'server' }, { role: 'friend' })));
    await expectConnects(c, NS, 'stranger', ips.server!, false, 'the policy denies stranger');
    await staysDenied(c, 'stranger', ips.server!);
    await expectConnects(c, NS, 'friend', ips.server!, true, 'the policy allows friend');
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'only-friends']);
    await expectConnects(c, NS, 'stranger', ips.server!, true, 'deleting the policy opens server again');
  });

  test('a pod whose container restarts keeps its policy', async () => {
    await c.k(['apply', '-f', '-'], JSON.stringify(denyAllBut('only-friends', { app: 'server' }, { role: 'friend' })));
    await expectConnects(c, NS, 'stranger', ips.server!, false, 'the policy denies stranger');
    const id = (await c.k(['-n', NS, 'get', 'pod', 'server', '-o', 'jsonpath={.status.containerStatuses[0].containerID}'])).replace('containerd://', '');
    ok('ctr tasks kill', await c.onNode('node-2', ['ctr', '-a', '/run/containerd/containerd.sock', '-n', 'k8s.io', 'tasks', 'kill', '-s', 'SIGKILL', id]));
    await eventually(
      'the kubelet restarts the container',
      () => c.k(['-n', NS, 'get', 'pod', 'server', '-o', 'jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].ready}']),
      (s) => /^[1-9]\d* true$/.test(s),
      60_000,
    );
    assert.equal(await c.k(['-n', NS, 'get', 'pod', 'server', '-o', 'jsonpath={.status.podIP}']), ips.server, 'the sandbox, and so the address, outlives the container');
    await expectConnects(c, NS, 'friend', ips.server!, true, 'friend still reaches the restarted server');
    await staysDenied(c, 'stranger', ips.server!);
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'only-friends']);
  });

  test("Flannel's FORWARD accept rules and masquerade do not open what Weir denies, also after flanneld restarts", async () => {
    await c.k(['apply', '-f', '-'], JSON.stringify(denyAllBut('only-friends', { app: 'server' }, { role: 'friend' })));
    await expectConnects(c, NS, 'stranger', ips.server!, false, 'the policy denies stranger');
    for (const node of NODES) {
      const rules = ok('iptables-save', await c.onNode(node, ['iptables-save', '-t', 'filter']));
      assert.match(rules, /-A FORWARD .*-j FLANNEL-FWD/, `Flannel accepts pod traffic in FORWARD on ${node}`);
      // Flannel puts its rules back when they go missing; make it do so while Weir's rule is in place.
      ok('iptables -D', await c.onNode(node, ['iptables', '-D', 'FORWARD', '-m', 'comment', '--comment', 'flanneld forward', '-j', 'FLANNEL-FWD']));
      await c.restart(node, 'flanneld');
    }
    for (const node of NODES) {
      await eventually(
        `flanneld puts its FORWARD rule back on ${node}`,
        async () => ok('iptables-save', await c.onNode(node, ['iptables-save', '-t', 'filter'])),
        (r) => /-A FORWARD .*-j FLANNEL-FWD/.test(r),
        60_000,
      );
    }
    await staysDenied(c, 'stranger', ips.server!);
    await expectConnects(c, NS, 'friend', ips.server!, true, 'friend still reaches server across the VXLAN after the restart');
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'only-friends']);
  });

  test("a deleted pod's address, given to a new pod, carries none of the old pod's allowances or tracked flows", async () => {
    await c.k(['apply', '-f', '-'], JSON.stringify(denyAllBut('only-friends', { app: 'server' }, { role: 'friend' })));
    const old = (await runPods(c, NS, [agnhostPod('old-friend', NS, 'node-1', { role: 'friend' })]))['old-friend']!;
    await expectConnects(c, NS, 'old-friend', ips.server!, true, 'old-friend is allowed');
    // A UDP exchange leaves a flow the kernel tracks for 30 s (a closed TCP flow goes in 10).
    assert.equal(await connects(c, NS, 'old-friend', ips.server!, 81, 2, 'udp'), true, 'old-friend exchanges a datagram with server');
    const tracked = async () => (await c.onNode('node-1', ['conntrack', '-L', '-p', 'udp', '-s', old])).stdout.trim();
    assert.notEqual(await tracked(), '', "node-1 tracks old-friend's UDP flow");
    await c.k(['-n', NS, 'delete', 'pod', 'old-friend', '--grace-period=0', '--wait=true']);
    // The address's tracked flows go with the pod, long before they would expire.
    await eventually(`node-1 tracks no flow of ${old}`, tracked, (s) => s === '', 8_000);
    // host-local hands out the address after the last one it reserved: point it just before
    // the freed one, so the next pod on node-1 gets it.
    const [a, b, d, e] = old.split('.').map(Number) as [number, number, number, number];
    ok('reserve', await c.onNode('node-1', ['sh', '-c', `echo ${a}.${b}.${d}.${e - 1} > /var/lib/cni/networks/cbr0/last_reserved_ip.0`]));
    const heir = (await runPods(c, NS, [agnhostPod('heir', NS, 'node-1', { role: 'heir' })])).heir!;
    assert.equal(heir, old, 'the new pod got the freed address');
    await expectConnects(c, NS, 'heir', ips.server!, false, "the heir of a friend's address is denied");
    await staysDenied(c, 'heir', ips.server!);
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'only-friends']);
    await c.k(['-n', NS, 'delete', 'pod', 'heir', '--grace-period=0']);
  });

  test("helm test: the chart's test hook finds every node Ready and Programmed", async () => {
    const out = ok('helm test', await c.helm(['test', 'weir', '-n', 'kube-system', '--logs', '--timeout', '180s']));
    assert.match(out, new RegExp(`every node \\(${NODES.length}\\) is Ready and Programmed`), out);
  });

  test('weir.dev/cut-existing: a policy applied with kubectl cuts the established connections it denies between pods the kubelet made, also through a Service, and keeps the ones it allows', async () => {
    // Echo processes entered into the pods' namespaces on their nodes, as the prober is.
    const inPod = async (node: string, ip: string, script: string, env: Record<string, string>) =>
      NsProcess.inNetns(await podNetns(c, node, ip), script, env, [join(REPO, 'scripts/cluster.sh'), 'node-exec', node], c.env);
    const procs: NsProcess[] = [];
    const echoes = async (p: NsProcess, line: string) => {
      p.send(line);
      return p.waitFor(`echo:${line}`, 1_500).then(
        () => true,
        () => false,
      );
    };
    try {
      // One connection of each client straight to the pod's port 8080, one through a Service
      // to its port 8081 (kube-proxy's DNAT: the cut judges it by the endpoint behind it, as the
      // rules do; another port, so that it is judged on its own).
      for (const port of ['8080', '8081']) {
        const server = await inPod('node-2', ips.server!, ECHO_SERVER, { PORT: port });
        procs.push(server);
        await server.waitFor('ready', 10_000);
      }
      const service = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'echo', namespace: NS }, spec: { selector: { app: 'server' }, ports: [{ port: 8080, targetPort: 8081 }] } };
      await c.k(['apply', '-f', '-'], JSON.stringify(service));
      const serviceIp = await c.k(['-n', NS, 'get', 'service', 'echo', '-o', 'jsonpath={.spec.clusterIP}']);
      const connect = async (name: string, host: string) => {
        const p = await inPod('node-1', ips[name]!, ECHO_CLIENT, { HOST: host, PORT: '8080', CONNECT_MS: '5000' });
        procs.push(p);
        await p.waitFor('connected', 10_000);
        assert.equal(await echoes(p, 'before'), true, `${name}'s connection to ${host} carries data`);
        return p;
      };
      // kube-proxy takes a moment to program a new Service.
      const friends = [
        await connect('friend', ips.server!),
        await eventually(
          'a connection through the Service',
          () => connect('friend', serviceIp),
          () => true,
        ),
      ];
      const strangers = [await connect('stranger', ips.server!), await connect('stranger', serviceIp)];
      const policy = denyAllBut('cut', { app: 'server' }, { role: 'friend' });
      await c.k(['apply', '-f', '-'], JSON.stringify({ ...policy, metadata: { ...policy.metadata, annotations: { 'weir.dev/cut-existing': 'true' } } }));
      await expectConnects(c, NS, 'stranger', ips.server!, false, 'the policy denies new connections of stranger');
      let n = 0;
      for (const [i, stranger] of strangers.entries()) {
        await eventually(
          `stranger's established connection ${i} cut`,
          () => echoes(stranger, `after${n++}`),
          (echoed) => !echoed,
          15_000,
        );
        assert.equal(await echoes(stranger, 'later'), false, `stranger's connection ${i} carries data again`);
      }
      for (const [i, friend] of friends.entries()) assert.equal(await echoes(friend, 'after'), true, `friend's connection ${i}, still allowed, was cut`);

      // At the client's node a connection through the Service has the Service's address as its
      // original destination: judged by the pod behind it, it stays under an egress policy that
      // allows the server pods alone, while friend's connection to another pod goes.
      const other = await inPod('node-1', ips.stranger!, ECHO_SERVER, { PORT: '8080' });
      procs.push(other);
      await other.waitFor('ready', 10_000);
      const sideways = await connect('friend', ips.stranger!);
      const egress = {
        apiVersion: 'networking.k8s.io/v1',
        kind: 'NetworkPolicy',
        metadata: { name: 'friend-egress', namespace: NS, annotations: { 'weir.dev/cut-existing': 'true' } },
        spec: { podSelector: { matchLabels: { role: 'friend' } }, policyTypes: ['Egress'], egress: [{ to: [{ podSelector: { matchLabels: { app: 'server' } } }] }] },
      };
      await c.k(['apply', '-f', '-'], JSON.stringify(egress));
      await eventually(
        "friend's connection to stranger cut",
        () => echoes(sideways, `sideways${n++}`),
        (echoed) => !echoed,
        15_000,
      );
      for (const [i, friend] of friends.entries()) assert.equal(await echoes(friend, 'after-egress'), true, `friend's connection ${i}, allowed by its egress policy, was cut`);
    } finally {
      for (const p of procs) await p.stop();
    }
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'cut', 'friend-egress']);
    await c.k(['-n', NS, 'delete', 'service', 'echo']);
  });

  test('helm upgrade to a rebuilt image rolls the agents while a denied flow never opens and an allowed one never stops for a second', async () => {
    await c.k(['apply', '-f', '-'], JSON.stringify(denyAllBut('only-friends', { app: 'server' }, { role: 'friend' })));
    await expectConnects(c, NS, 'stranger', ips.server!, false, 'the policy denies stranger');
    await expectConnects(c, NS, 'friend', ips.server!, true, 'the policy allows friend');
    // The image under a new tag: to the kubelet and the runtime, a new image.
    const archive = ok('image.sh build', await run(join(REPO, 'scripts/image.sh'), ['build']))
      .trim()
      .split('\n')
      .pop()!;
    await c.loadImage(archive, 'weir:0.1.0-rebuilt');
    const target = `${ips.server}:80`;
    const friend = await startProber(c, 'node-1', ips.friend!, [target]);
    const stranger = await startProber(c, 'node-1', ips.stranger!, [target]);
    try {
      await new Promise((r) => setTimeout(r, 2000));
      const from = Date.now();
      ok('helm upgrade', await c.helm(['upgrade', 'weir', join(REPO, 'charts/weir'), '-n', 'kube-system', '--reuse-values', '--set', 'image.tag=0.1.0-rebuilt', '--wait', '--timeout', '180s']));
      ok('rollout', await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/weir', '--timeout=180s']));
      const images = await c.k(['-n', 'kube-system', 'get', 'pods', '-l', 'app.kubernetes.io/name=weir', '-o', 'jsonpath={.items[*].spec.containers[0].image}']);
      assert.deepEqual(
        images.split(' '),
        NODES.map(() => 'weir:0.1.0-rebuilt'),
        'every agent runs the rebuilt image',
      );
      await agentsReady(c);
      await new Promise((r) => setTimeout(r, 2000));
      const to = Date.now();
      const opened = stranger.attempts.filter((a) => a.connected);
      assert.deepEqual(opened, [], 'the denied flow connected during the upgrade');
      assert.ok(stranger.attempts.length > (to - from) / 200, `the stranger's prober ran (${stranger.attempts.length} attempts)`);
      const outage = longestOutage(friend.attempts, target, from, to);
      assert.ok(outage < 1000, `the allowed flow stopped for ${outage} ms during the upgrade`);
    } finally {
      await friend.stop();
      await stranger.stop();
    }
    await c.k(['-n', NS, 'delete', 'networkpolicy', 'only-friends']);
  });

  test('helm uninstall: its hook has every agent remove its rules, so each node is as it was before the install, with nothing run by hand', async () => {
    ok('helm uninstall', await c.helm(['uninstall', 'weir', '-n', 'kube-system', '--wait', '--timeout', '180s']));
    // The hook's report stays in its Job's log (docs/install.md#uninstall).
    const report = await c.k(['-n', 'kube-system', 'logs', 'job/weir-uninstall']);
    assert.match(report, new RegExp(`${NODES.length} of ${NODES.length} nodes removed Weir's rules`), report);
    assert.doesNotMatch(report, /did not confirm/, report);
    const now = await nodeState(c);
    for (const node of NODES) assert.equal(now[node], before_[node], `${node}'s rules and sets differ from before the install`);
    await expectConnects(c, NS, 'stranger', ips.server!, true, 'pods talk without Weir');
    // A pod started after the uninstall, on every node, is not dropped as unknown.
    const late = await runPods(
      c,
      NS,
      NODES.map((node) => agnhostPod(`late-${node}`, NS, node, { role: 'late' })),
    );
    for (const node of NODES) await expectConnects(c, NS, 'stranger', late[`late-${node}`]!, true, `a pod started on ${node} after the uninstall can be reached`);
  });
});
