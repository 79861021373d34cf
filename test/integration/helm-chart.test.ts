// charts/weir as files: `helm lint --strict` and `helm template` with the default values and
// with ci/all-on-values.yaml, what the DaemonSet asks of a node, the values schema's messages,
// every operator flag of `weir agent` reachable through values (read back by the agent's own
// flag parser), and the copies that must not drift: deploy/ rendered from the chart, the
// chart's crds/ equal to crds/. helm.test.ts installs it on a real API server.

import assert from 'node:assert/strict';
import { cp, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { defaultConfig } from '../../src/agent/config.ts';
import { FLAGS, parse, toConfig, toControllerConfig, toUninstallConfig } from '../../src/cli/flags.ts';
import { parseHostPort } from '../../src/metrics/server.ts';
import { CHART, find, helm, type Obj, ok, parseDocs, REPO, render, run } from './helm-harness.ts';
import { containerArgv, containerEnv, daemonSetPod, deploymentPod } from './helm-kubelet.ts';

const ALL_ON = join(CHART, 'ci/all-on-values.yaml');

/** Flags an operator does not set through values, and why. */
const NOT_VALUES: Record<string, string> = {
  'node-name': 'the downward API gives it (spec.nodeName)',
  manifests: 'the manifest source, for clusterless use',
  kubeconfig: 'in-cluster configuration',
  identity: 'controller only: the Deployment passes the pod name',
  'lease-namespace': 'controller only: the Deployment passes its namespace',
  'lease-name': 'controller only: the Deployment passes the name its Role and admission policy allow',
  'uninstall-timeout': 'uninstall only: the hook Job passes uninstall.timeoutSeconds',
  'cleanup-image': 'uninstall only: the hook Job passes the image',
  examples: 'demo only',
  once: 'demo only',
  help: 'not a setting',
};

const agentContainer = (docs: readonly Obj[]): Obj => find(docs, 'DaemonSet')!.spec.template.spec.containers[0];

/** The DaemonSet's container as the agent reads it on a node: env resolved (node-a, the given
 *  host IP), args expanded, then the agent's own flag parser. */
function agentConfig(docs: readonly Obj[], hostIP = '172.31.0.1') {
  const ds = find(docs, 'DaemonSet')!;
  const created = daemonSetPod({ ...ds, metadata: { ...ds.metadata, uid: 'u' } }, 'node-a');
  const pod = { ...created, metadata: { ...created.metadata, name: 'weir-abcde' }, status: { hostIP, podIP: hostIP } };
  const container = agentContainer(docs);
  const env = containerEnv(pod, container, new Map());
  // node, its flags, the CLI's path, then the command and its flags.
  const argv = containerArgv(container, env);
  const [command, ...flags] = argv.slice(argv.findIndex((a) => a.endsWith('/cli/main.ts')) + 1);
  return { command, flags, config: toConfig(parse(flags, Object.fromEntries(env)).values, { nodeName: true, manifestsDir: false }) };
}

/** The controller Deployment's container as it runs: env resolved, then the CLI's parser. */
function controllerConfig(docs: readonly Obj[], hostIP = '172.31.0.1') {
  const deployment = find(docs, 'Deployment')!;
  const created = deploymentPod({ ...deployment, metadata: { ...deployment.metadata, uid: 'u' } }, 'node-a');
  const pod = { ...created, metadata: { ...created.metadata, name: 'weir-controller-abcde' }, status: { hostIP, podIP: hostIP } };
  const container = deployment.spec.template.spec.containers[0];
  const env = containerEnv(pod, container, new Map());
  const argv = containerArgv(container, env);
  const [command, ...flags] = argv.slice(argv.findIndex((a) => a.endsWith('/cli/main.ts')) + 1);
  assert.equal(command, 'controller');
  return toControllerConfig(parse(flags, Object.fromEntries(env)).values, 'the-host');
}

describe('charts/weir rendered by helm', () => {
  test('helm lint --strict passes with the default values and with every option on', async () => {
    for (const values of [[], ['-f', ALL_ON]]) {
      const r = await helm(['lint', '--strict', CHART, ...values]);
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.doesNotMatch(r.stdout, /\[(WARNING|ERROR)\]/);
    }
  });

  test('the default values render the agent, its RBAC, the admission policies and the helm test hook, and nothing optional', async () => {
    const docs = await render();
    assert.deepEqual(docs.map((d) => `${d.kind}/${d.metadata.namespace ?? ''}/${d.metadata.name}`).sort(), [
      'ClusterRole//weir-agent',
      'ClusterRole//weir-controller',
      'ClusterRole//weir-test',
      'ClusterRole//weir-uninstall',
      'ClusterRoleBinding//weir-agent',
      'ClusterRoleBinding//weir-controller',
      'ClusterRoleBinding//weir-test',
      'ClusterRoleBinding//weir-uninstall',
      'DaemonSet/kube-system/weir',
      'Deployment/kube-system/weir-controller',
      'Job/kube-system/weir-uninstall',
      'Pod/kube-system/weir-test',
      'Role/kube-system/weir-controller-lease',
      'Role/kube-system/weir-uninstall',
      'Role/kube-system/weir-uninstall-signal',
      'RoleBinding/kube-system/weir-controller-lease',
      'RoleBinding/kube-system/weir-uninstall',
      'RoleBinding/kube-system/weir-uninstall-signal',
      'ServiceAccount/kube-system/weir',
      'ServiceAccount/kube-system/weir-controller',
      'ServiceAccount/kube-system/weir-test',
      'ServiceAccount/kube-system/weir-uninstall',
      'ValidatingAdmissionPolicy//weir-agent-own-node-status',
      'ValidatingAdmissionPolicy//weir-controller-lease',
      'ValidatingAdmissionPolicyBinding//weir-agent-own-node-status',
      'ValidatingAdmissionPolicyBinding//weir-controller-lease',
    ]);
  });

  test('the DaemonSet: host network, node-critical, every node, least privilege, the host paths iptables needs, probes on a named port', async () => {
    const docs = await render();
    const ds = find(docs, 'DaemonSet')!;
    const pod = ds.spec.template.spec;
    assert.equal(pod.hostNetwork, true);
    assert.equal(pod.priorityClassName, 'system-node-critical');
    assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
    assert.deepEqual(pod.nodeSelector, { 'kubernetes.io/os': 'linux' });
    assert.deepEqual(ds.spec.updateStrategy, { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 0 } });
    assert.equal(pod.serviceAccountName, 'weir');
    const c = agentContainer(docs);
    assert.equal(c.image, 'weir:0.1.0');
    assert.deepEqual(c.securityContext, {
      privileged: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ['ALL'], add: ['NET_ADMIN', 'NET_RAW', 'SYS_ADMIN', 'SETUID', 'SETGID'] },
      seccompProfile: { type: 'RuntimeDefault' },
    });
    assert.equal(ds.spec.template.metadata.annotations, undefined, 'no AppArmor exception: source binding mounts nothing');
    const volumes = Object.fromEntries(pod.volumes.map((v: Obj) => [v.name, v.hostPath ?? v]));
    assert.deepEqual(volumes, {
      tmp: { name: 'tmp', emptyDir: {} },
      'xtables-lock': { path: '/run/xtables.lock', type: 'FileOrCreate' },
      'lib-modules': { path: '/lib/modules' },
      netns: { path: '/var/run/netns', type: 'DirectoryOrCreate' },
      'audit-log': { path: '/var/log/weir', type: 'DirectoryOrCreate' },
    });
    assert.deepEqual(c.volumeMounts, [
      { name: 'tmp', mountPath: '/tmp' },
      { name: 'xtables-lock', mountPath: '/run/xtables.lock' },
      { name: 'lib-modules', mountPath: '/lib/modules', readOnly: true },
      { name: 'netns', mountPath: '/var/run/netns', mountPropagation: 'HostToContainer', readOnly: true },
      { name: 'audit-log', mountPath: '/var/log/weir' },
    ]);
    assert.deepEqual(c.env[0], { name: 'WEIR_NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } });
    assert.deepEqual(c.ports, [{ name: 'metrics', containerPort: 9476, protocol: 'TCP' }]);
    assert.deepEqual(c.livenessProbe.httpGet, { path: '/healthz', port: 'metrics' });
    assert.deepEqual(c.readinessProbe.httpGet, { path: '/readyz', port: 'metrics' });
    assert.deepEqual(c.resources, { requests: { cpu: '100m', memory: '256Mi' }, limits: { memory: '768Mi' } });
  });

  test('with source binding off the agent gets neither CAP_SYS_ADMIN nor the host network namespaces', async () => {
    const docs = await render(['--set', 'agent.sourceBinding=false']);
    const c = agentContainer(docs);
    assert.deepEqual(c.securityContext, {
      privileged: false,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ['ALL'], add: ['NET_ADMIN', 'NET_RAW', 'SETUID', 'SETGID'] },
      seccompProfile: { type: 'RuntimeDefault' },
    });
    assert.ok(!c.volumeMounts.some((m: Obj) => m.name === 'netns'));
    assert.ok(!find(docs, 'DaemonSet')!.spec.template.spec.volumes.some((v: Obj) => v.name === 'netns'));
    assert.ok(c.args.includes('--source-binding=off'));
  });

  test('agent.cutExisting passes --cut-existing; by default the agents cut only for pods opted in by annotation', async () => {
    assert.ok(!agentContainer(await render()).args.includes('--cut-existing'));
    assert.ok(agentContainer(await render(['--set', 'agent.cutExisting=true'])).args.includes('--cut-existing'));
  });

  test("with the audit log off the agent gets neither CAP_SETUID/CAP_SETGID (tcpdump's drop to its own user) nor the host's log directory", async () => {
    const docs = await render(['--set', 'audit.enabled=false', '--set', 'agent.sourceBinding=false']);
    const c = agentContainer(docs);
    assert.deepEqual(c.securityContext.capabilities, { drop: ['ALL'], add: ['NET_ADMIN', 'NET_RAW'] });
    assert.ok(!c.volumeMounts.some((m: Obj) => m.name === 'audit-log'));
    assert.ok(!find(docs, 'DaemonSet')!.spec.template.spec.volumes.some((v: Obj) => v.name === 'audit-log'));
    assert.ok(c.args.includes('--audit=off'));
    assert.equal(agentConfig(docs).config.audit.enabled, false);
  });

  test('the audit log directory is the host path given, mounted at the same path, and the file is in it', async () => {
    const docs = await render(['--set', 'audit.hostPath=/var/log/weir/audit/', '--set', 'audit.file=conn.log']);
    const c = agentContainer(docs);
    assert.deepEqual(find(docs, 'DaemonSet')!.spec.template.spec.volumes.find((v: Obj) => v.name === 'audit-log').hostPath, { path: '/var/log/weir/audit', type: 'DirectoryOrCreate' });
    assert.deepEqual(
      c.volumeMounts.find((m: Obj) => m.name === 'audit-log'),
      { name: 'audit-log', mountPath: '/var/log/weir/audit' },
    );
    assert.equal(agentConfig(docs).config.audit.file, '/var/log/weir/audit/conn.log');
  });

  test('the audit host path, mounted read-write into a root container, is a directory under /var/log and nowhere else', async () => {
    for (const path of ['/var/log/weir', '/var/log/weir/', '/var/log/a/b', '/var/log/.weir', '/var/log/..weir', '/var/log/weir..']) {
      const r = await helm(['template', 'weir', CHART, '--set-string', `audit.hostPath=${path}`]);
      assert.equal(r.code, 0, `${path}: ${r.stderr}`);
    }
    // /var/log itself would hand the agent every log of the host; a dot segment, an empty one
    // or a blank could lead out of it or be read differently by the kubelet.
    for (const path of [
      '/var/log',
      '/var/log/',
      '/etc/weir',
      '/',
      '/var/logs/weir',
      'var/log/weir',
      '/var/log/../../etc',
      '/var/log/weir/..',
      '/var/log/./weir',
      '/var/log/.',
      '/var/log//weir',
      '/var/log/a b',
      '/srv/weir',
    ]) {
      for (const cmd of [
        ['template', 'weir'],
        ['lint', '--strict'],
      ]) {
        const r = await helm([...cmd, CHART, '--set-string', `audit.hostPath=${path}`]);
        assert.notEqual(r.code, 0, `helm ${cmd[0]} accepted ${path}`);
        assert.match(r.stdout + r.stderr, /at '\/audit\/hostPath': '.*' does not match pattern/, path);
      }
    }
  });

  test('seccomp RuntimeDefault by default; another profile, or none, when asked; a Localhost profile must be named', async () => {
    assert.deepEqual(agentContainer(await render()).securityContext.seccompProfile, { type: 'RuntimeDefault' });
    assert.deepEqual(agentContainer(await render(['--set', 'seccompProfile.type=Unconfined'])).securityContext.seccompProfile, { type: 'Unconfined' });
    assert.deepEqual(agentContainer(await render(['--set', 'seccompProfile.type=Localhost', '--set', 'seccompProfile.localhostProfile=profiles/weir.json'])).securityContext.seccompProfile, {
      type: 'Localhost',
      localhostProfile: 'profiles/weir.json',
    });
    // null removes the default: the kubelet's own default then applies.
    assert.equal(agentContainer(await render(['--set', 'seccompProfile=null'])).securityContext.seccompProfile, undefined);
    const cases: [string[], RegExp][] = [
      [['--set', 'seccompProfile.type=Localhost'], /at '\/seccompProfile': missing property 'localhostProfile'/],
      [['--set', 'seccompProfile.type=runtime/default'], /at '\/seccompProfile\/type': value must be one of 'RuntimeDefault', 'Unconfined', 'Localhost'/],
      [['--set', 'seccompProfile.localhostProfile=weir.json'], /at '\/seccompProfile\/localhostProfile': false schema/],
      [['--set', 'seccompProfile.profile=weir.json'], /at '\/seccompProfile': additional properties 'profile' not allowed/],
    ];
    for (const [args, message] of cases) {
      const r = await helm(['template', 'weir', CHART, ...args]);
      assert.notEqual(r.code, 0, args.join(' '));
      assert.match(r.stderr, message);
    }
    const samePort = await helm(['template', 'weir', CHART, '--set', 'controller.metricsPort=9476']);
    assert.notEqual(samePort.code, 0);
    assert.match(samePort.stderr, /controller\.metricsPort \(9476\) must differ from metrics\.port/);
  });

  test("AppArmor: no profile by default (the runtime's default applies), the one given on Kubernetes 1.30 or newer, none before", async () => {
    const byDefault = await render();
    assert.equal(agentContainer(byDefault).securityContext.appArmorProfile, undefined);
    assert.deepEqual(
      byDefault.filter((d) => Object.keys(d.spec?.template?.metadata?.annotations ?? {}).some((a) => a.includes('apparmor'))),
      [],
    );
    const set = ['--set', 'appArmorProfile.type=Localhost', '--set', 'appArmorProfile.localhostProfile=weir-agent'];
    assert.deepEqual(agentContainer(await render([...set, '--kube-version', '1.30.0'])).securityContext.appArmorProfile, { type: 'Localhost', localhostProfile: 'weir-agent' });
    assert.equal(agentContainer(await render([...set, '--kube-version', '1.29.0'])).securityContext.appArmorProfile, undefined);
    const r = await helm(['template', 'weir', CHART, '--set', 'appArmorProfile.type=Localhost']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /at '\/appArmorProfile': missing property 'localhostProfile'/);
  });

  test('image.digest: the image is repository@digest, the tag ignored; anything but sha256:<64 hex> is refused', async () => {
    const digest = `sha256:${'0123456789abcdef'.repeat(4)}`;
    const c = agentContainer(await render(['--set', 'image.repository=registry.example/weir', '--set', 'image.tag=0.1.0', '--set', `image.digest=${digest}`]));
    assert.equal(c.image, `registry.example/weir@${digest}`);
    assert.equal(agentContainer(await render(['--set', 'image.digest='])).image, 'weir:0.1.0');
    for (const bad of ['0123456789abcdef', `sha256:${'0123456789ABCDEF'.repeat(4)}`, `sha256:${'0'.repeat(63)}`, `sha512:${'0'.repeat(64)}`, `weir@sha256:${'0'.repeat(64)}`]) {
      const r = await helm(['template', 'weir', CHART, '--set-string', `image.digest=${bad}`]);
      assert.notEqual(r.code, 0, bad);
      assert.match(r.stderr, /at '\/image\/digest': '.*' does not match pattern/, bad);
    }
  });

  test('every object carries helm.sh/chart and managed-by; no selector and no pod template does', async () => {
    const docs = await render(['-f', ALL_ON]);
    for (const d of docs) {
      assert.equal(d.metadata.labels?.['helm.sh/chart'], 'weir-0.1.0', `${d.kind}/${d.metadata.name}`);
      assert.equal(d.metadata.labels?.['app.kubernetes.io/managed-by'], 'Helm', `${d.kind}/${d.metadata.name}`);
    }
    // A DaemonSet's selector cannot change after creation, so a label that changes with the
    // chart's version there would make every upgrade fail.
    const ds = find(docs, 'DaemonSet')!;
    const selectors = {
      daemonSet: ds.spec.selector.matchLabels,
      podTemplate: ds.spec.template.metadata.labels,
      service: find(docs, 'Service')!.spec.selector,
      podMonitor: find(docs, 'PodMonitor')!.spec.selector.matchLabels,
      serviceMonitor: find(docs, 'ServiceMonitor')!.spec.selector.matchLabels,
    };
    for (const [where, labels] of Object.entries(selectors)) {
      assert.deepEqual(
        Object.keys(labels).filter((l) => l === 'helm.sh/chart' || l === 'app.kubernetes.io/managed-by'),
        [],
        where,
      );
    }
    assert.deepEqual(ds.spec.selector.matchLabels, { 'app.kubernetes.io/name': 'weir', 'app.kubernetes.io/instance': 'weir' });
  });

  test("helm.sh/chart is a valid label value for a version with a build suffix ('+' becomes '_')", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'weir-chart-version-'));
    try {
      await cp(CHART, join(dir, 'weir'), { recursive: true });
      const chartYaml = join(dir, 'weir', 'Chart.yaml');
      await writeFile(chartYaml, (await readFile(chartYaml, 'utf8')).replace(/^version: .*$/m, 'version: 0.1.0-rc.1+build.7'));
      const r = await helm(['template', 'weir', join(dir, 'weir'), '--namespace', 'kube-system']);
      assert.equal(r.code, 0, r.stderr);
      const labels = parseDocs(r.stdout).map((d) => d.metadata.labels['helm.sh/chart']);
      assert.deepEqual([...new Set(labels)], ['weir-0.1.0-rc.1_build.7']);
      // What the API server accepts as a label value.
      assert.match(labels[0], /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('before Kubernetes 1.30, or when turned off, no admission policies', async () => {
    const old = await render(['--kube-version', '1.29.0']);
    assert.deepEqual(
      old.filter((d) => d.kind.startsWith('ValidatingAdmissionPolicy')),
      [],
    );
    const off = await render(['--set', 'admissionPolicies.enabled=false']);
    assert.deepEqual(
      off.filter((d) => d.kind.startsWith('ValidatingAdmissionPolicy')),
      [],
    );
  });

  test('every option on: metrics Service, PodMonitor and ServiceMonitor on the metrics port; a ServiceMonitor alone brings its Service', async () => {
    const docs = await render(['-f', ALL_ON]);
    const svc = find(docs, 'Service')!;
    assert.equal(svc.spec.clusterIP, 'None');
    assert.deepEqual(svc.spec.ports, [{ name: 'metrics', port: 9477, targetPort: 'metrics', protocol: 'TCP' }]);
    assert.deepEqual(svc.spec.selector, find(docs, 'DaemonSet')!.spec.selector.matchLabels);
    assert.deepEqual(find(docs, 'PodMonitor')!.spec.podMetricsEndpoints, [
      { port: 'metrics', path: '/metrics', interval: '15s', relabelings: [{ sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' }] },
    ]);
    assert.equal(find(docs, 'PodMonitor')!.metadata.labels.release, 'prometheus');
    assert.deepEqual(find(docs, 'ServiceMonitor')!.spec.endpoints, [
      { port: 'metrics', path: '/metrics', interval: '20s', relabelings: [{ sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' }] },
    ]);
    assert.equal(agentContainer(docs).ports[0].containerPort, 9477);
    const onlySm = await render(['--set', 'metrics.serviceMonitor.enabled=true']);
    assert.ok(find(onlySm, 'Service'));
    assert.equal(find(onlySm, 'PodMonitor'), undefined);
  });

  test("every operator flag of weir agent is set through values, and the defaults are the agent's own", async () => {
    const docs = await render();
    const args: string[] = agentContainer(docs).args;
    const allArgs: string[] = agentContainer(await render(['-f', ALL_ON])).args;
    const operatorFlags = Object.keys(FLAGS).filter((f) => !(f in NOT_VALUES));
    // A string flag is always passed, with its value; a boolean flag (--audit-stdout) takes
    // none, so it is passed when on (every option on) and left out when off, the agent's default.
    const passed = (f: string) => (FLAGS[f as keyof typeof FLAGS].type === 'boolean' ? allArgs.includes(`--${f}`) && !args.includes(`--${f}`) : args.some((a) => a.startsWith(`--${f}=`)));
    assert.deepEqual(
      operatorFlags.filter((f) => !passed(f)),
      [],
      'flags the chart does not pass',
    );
    const { command, config } = agentConfig(docs);
    assert.equal(command, 'agent');
    // The one default the chart changes: it turns the audit log on (its levels stay off until
    // an annotation or audit.defaultLevel asks), so that annotations work once installed.
    assert.equal(config.audit.enabled, true);
    assert.deepEqual({ ...config, metricsAddr: '', audit: { ...config.audit, enabled: false } }, { ...defaultConfig(), nodeName: 'node-a', daemonSet: 'kube-system/weir' });
    assert.equal(config.metricsAddr, '[172.31.0.1]:9476');

    const all = agentConfig(await render(['-f', ALL_ON])).config;
    assert.deepEqual(
      {
        logLevel: all.logLevel,
        markMask: all.markMask,
        allowAction: all.allowAction,
        debounceMs: all.debounceMs,
        resyncIntervalMs: all.resyncIntervalMs,
        hookCheckIntervalMs: all.hookCheckIntervalMs,
        watchIdleTimeoutMs: all.watchIdleTimeoutMs,
        relistIntervalMs: all.relistIntervalMs,
        favourMemory: all.favourMemory,
        cutExisting: all.cutExisting,
        metricsAddr: all.metricsAddr,
        audit: all.audit,
      },
      {
        logLevel: 'debug',
        markMask: 0x0fff0000,
        allowAction: 'RETURN',
        debounceMs: 25, // extraArgs come last and win
        resyncIntervalMs: 10_000,
        hookCheckIntervalMs: 2_000,
        watchIdleTimeoutMs: 120_000,
        relistIntervalMs: 600_000,
        favourMemory: true,
        cutExisting: true,
        metricsAddr: '[172.31.0.1]:9477',
        audit: { enabled: true, defaultLevel: 'deny', nflogGroup: 78, rate: 2000, ratePerSource: 300, file: '/var/log/weir-audit/connections.log', maxSize: 1_048_576, maxFiles: 3, stdout: true },
      },
    );
  });

  test('the metrics address is one the kubelet reaches: the node IP of either family by default, or the host given', async () => {
    const byDefault = await render();
    const hostIP = agentContainer(byDefault).env.find((e: Obj) => e.name === 'HOST_IP');
    assert.deepEqual(hostIP.valueFrom, { fieldRef: { fieldPath: 'status.hostIP' } });
    assert.deepEqual(parseHostPort(agentConfig(byDefault, 'fd00:172:31::1').config.metricsAddr), { host: 'fd00:172:31::1', port: 9476 });
    assert.deepEqual(parseHostPort(agentConfig(byDefault, '172.31.0.1').config.metricsAddr), { host: '172.31.0.1', port: 9476 });
    for (const [host, want] of [
      ['0.0.0.0', '0.0.0.0'],
      ['::', '::'],
    ]) {
      const docs = await render(['--set-string', `metrics.host=${host}`]);
      assert.equal(
        agentContainer(docs).env.find((e: Obj) => e.name === 'HOST_IP'),
        undefined,
      );
      assert.deepEqual(parseHostPort(agentConfig(docs).config.metricsAddr), { host: want, port: 9476 });
    }
  });

  test('a release in another namespace: its service accounts, the Lease and its Role there, the admission policies naming them', async () => {
    const r = await helm(['template', 'weir', CHART, '--namespace', 'weir-system']);
    assert.equal(r.code, 0, r.stderr);
    const docs = parseDocs(r.stdout);
    for (const sa of docs.filter((d) => d.kind === 'ServiceAccount')) assert.equal(sa.metadata.namespace, 'weir-system');
    for (const role of docs.filter((d) => d.kind === 'Role' || d.kind === 'RoleBinding')) assert.equal(role.metadata.namespace, 'weir-system', role.metadata.name);
    assert.deepEqual(find(docs, 'RoleBinding', 'weir-controller-lease')!.subjects, [{ kind: 'ServiceAccount', name: 'weir-controller', namespace: 'weir-system' }]);
    assert.deepEqual(find(docs, 'RoleBinding', 'weir-uninstall-signal')!.subjects, [
      { kind: 'ServiceAccount', name: 'weir', namespace: 'weir-system' },
      { kind: 'ServiceAccount', name: 'weir-controller', namespace: 'weir-system' },
    ]);
    const vap = (name: string) => find(docs, 'ValidatingAdmissionPolicy', name)!;
    assert.match(vap('weir-agent-own-node-status').spec.matchConditions[0].expression, /'system:serviceaccount:weir-system:weir'/);
    assert.match(vap('weir-controller-lease').spec.matchConditions[0].expression, /'system:serviceaccount:weir-system:weir-controller'/);
    assert.match(vap('weir-controller-lease').spec.validations[0].expression, /request\.namespace == 'weir-system' && object\.metadata\.name == 'weir-controller'/);
    assert.equal(controllerConfig(docs).leaseNamespace, 'weir-system');
  });

  test("the uninstall hook: a pre-delete Job whose flags weir uninstall accepts, naming the release's DaemonSet, Lease and image; its account a hook too, with only what it uses", async () => {
    const docs = await render(['--set', 'agent.chainPrefix=wr', '--set', 'agent.families=4']);
    const hooks = docs.filter((d) => d.metadata.annotations?.['helm.sh/hook'] === 'pre-delete');
    assert.deepEqual(hooks.map((d) => `${d.kind}/${d.metadata.name}`).sort(), [
      'ClusterRole/weir-uninstall',
      'ClusterRoleBinding/weir-uninstall',
      'Job/weir-uninstall',
      'Role/weir-uninstall',
      'RoleBinding/weir-uninstall',
      'ServiceAccount/weir-uninstall',
    ]);
    // The account first (lower weight), then the Job.
    for (const h of hooks) assert.equal(h.metadata.annotations['helm.sh/hook-weight'], h.kind === 'Job' ? '0' : '-10');
    const job = find(docs, 'Job')!;
    assert.equal(job.metadata.annotations['helm.sh/hook-delete-policy'], 'before-hook-creation', 'kept for its log');
    const pod = job.spec.template.spec;
    assert.equal(pod.serviceAccountName, 'weir-uninstall');
    assert.equal(pod.hostNetwork, true);
    const [command, ...flags] = pod.containers[0].args;
    assert.equal(command, 'uninstall');
    assert.deepEqual(toUninstallConfig(parse(flags, {}).values), {
      kubeconfig: undefined,
      logLevel: 'info',
      daemonSet: { namespace: 'kube-system', name: 'weir' },
      lease: { namespace: 'kube-system', name: 'weir-controller' },
      timeoutMs: 60_000,
      image: 'weir:0.1.0',
      cleanupFlags: ['--chain-prefix=wr', '--families=4'],
    });
    assert.equal(pod.containers[0].image, 'weir:0.1.0');
    assert.equal(job.spec.template.metadata.labels['app.kubernetes.io/name'], 'weir-uninstall', "not the agents' selector");
    assert.equal(job.spec.activeDeadlineSeconds, 120);
    assert.equal((await render(['--set', 'uninstall.enabled=false'])).filter((d) => d.metadata.annotations?.['helm.sh/hook'] === 'pre-delete').length, 0);
  });

  test("the controller Deployment: two replicas never on one node, replaced one at a time, non-root, its flags the controller's own parser accepts", async () => {
    const docs = await render();
    const deployment = find(docs, 'Deployment')!;
    const pod = deployment.spec.template.spec;
    assert.equal(deployment.spec.replicas, 2);
    assert.deepEqual(deployment.spec.strategy, { type: 'RollingUpdate', rollingUpdate: { maxSurge: 0, maxUnavailable: 1 } });
    assert.equal(pod.serviceAccountName, 'weir-controller');
    assert.equal(pod.hostNetwork, true);
    assert.deepEqual(pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey, 'kubernetes.io/hostname');
    assert.deepEqual(pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchLabels, deployment.spec.selector.matchLabels);
    assert.equal(pod.securityContext.runAsNonRoot, true);
    assert.deepEqual(pod.containers[0].securityContext.capabilities, { drop: ['ALL'] });
    assert.deepEqual(controllerConfig(docs), {
      daemonSet: { namespace: 'kube-system', name: 'weir' },
      kubeconfig: undefined,
      identity: 'weir-controller-abcde',
      leaseName: 'weir-controller',
      leaseNamespace: 'kube-system',
      metricsAddr: '[172.31.0.1]:9478',
      logLevel: 'info',
    });
    const roleNames = find(docs, 'Role', 'weir-controller-lease')!.rules.flatMap((r: Obj) => r.resourceNames ?? []);
    assert.deepEqual(roleNames, ['weir-controller'], 'the Role grants the Lease the controller is told to take');
  });

  test('a mistyped value fails with a message naming the value and what it must be', async () => {
    const cases: [string[], RegExp][] = [
      [['--set', 'agent.logLevel=verbose'], /at '\/agent\/logLevel': value must be one of 'fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'/],
      [['--set', 'agnet.logLevel=debug'], /additional properties 'agnet' not allowed/],
      [['--set', 'metrics.port=http'], /at '\/metrics\/port': got string, want integer/],
      [['--set', 'agent.markMask=ffff0000'], /at '\/agent\/markMask': '.*' does not match pattern/],
      [['--set', 'agent.sourceBinding=yes'], /at '\/agent\/sourceBinding': got string, want boolean/],
      [['--set', 'updateStrategy.maxUnavailable=0'], /at '\/updateStrategy\/maxUnavailable'/],
      [['--set', 'audit.defaultLevel=verbose'], /at '\/audit\/defaultLevel': value must be one of 'off', 'deny', 'all'/],
      [['--set', 'audit.nflogGroup=2'], /at '\/audit\/nflogGroup': minimum: got 2, want 4/],
      [['--set', 'audit.hostPath=var/log'], /at '\/audit\/hostPath': '.*' does not match pattern/],
      [['--set', 'image.digest=latest'], /at '\/image\/digest': '.*' does not match pattern/],
      [['--set', 'audit.file=a/b.log'], /at '\/audit\/file': '.*' does not match pattern/],
    ];
    for (const [args, message] of cases) {
      const r = await helm(['template', 'weir', CHART, ...args]);
      assert.notEqual(r.code, 0, args.join(' '));
      assert.match(r.stderr, /values don't meet the specifications of the schema/);
      assert.match(r.stderr, message);
    }
  });

  test('the image defaults to weir at the chart appVersion, which is the agent version of package.json', async () => {
    const pkg = JSON.parse(await readFile(join(REPO, 'package.json'), 'utf8')) as { version: string };
    const chart = await readFile(join(CHART, 'Chart.yaml'), 'utf8');
    assert.match(chart, new RegExp(`^appVersion: "${pkg.version.replaceAll('.', '\\.')}"$`, 'm'));
    assert.equal(agentContainer(await render()).image, `weir:${pkg.version}`);
  });
});

describe('one source for what the chart shares with the repository', () => {
  test('deploy/rbac.yaml and deploy/admission-policy.yaml are the chart rendered (scripts/helm.sh sync writes them)', async () => {
    for (const template of ['rbac.yaml', 'admission-policy.yaml']) {
      const rendered = await run(join(REPO, 'scripts/helm.sh'), ['render-deploy', template]);
      assert.equal(rendered.code, 0, rendered.stderr);
      assert.equal(await readFile(join(REPO, 'deploy', template), 'utf8'), rendered.stdout, `deploy/${template} differs from the chart: run scripts/helm.sh sync`);
    }
  });

  test("the chart's crds/ equals crds/ file for file (scripts/helm.sh sync copies them)", async () => {
    const top = (await readdir(join(REPO, 'crds'))).sort();
    assert.deepEqual((await readdir(join(CHART, 'crds'))).sort(), top, 'run scripts/helm.sh sync');
    for (const f of top) {
      assert.equal(await readFile(join(CHART, 'crds', f), 'utf8'), await readFile(join(REPO, 'crds', f), 'utf8'), `charts/weir/crds/${f} differs from crds/${f}: run scripts/helm.sh sync`);
    }
  });

  test("a packaged chart's crds/ are the CRD files, so docs/install.md can apply them from the package", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'weir-helm-crds-'));
    try {
      ok('helm package', await helm(['package', CHART, '--destination', dir]));
      // docs/install.md "Upgrading", for a packaged chart.
      ok('tar -x', await run('tar', ['-xzf', join(dir, 'weir-0.1.0.tgz'), '-C', dir, 'weir/crds']));
      const files = (await readdir(join(CHART, 'crds'))).sort();
      assert.deepEqual((await readdir(join(dir, 'weir/crds'))).sort(), files);
      for (const f of files) assert.equal(await readFile(join(dir, 'weir/crds', f), 'utf8'), await readFile(join(CHART, 'crds', f), 'utf8'), f);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('helm package ships the CRDs and the schema, not the CI values', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'weir-helm-package-'));
    try {
      const r = await helm(['package', CHART, '--destination', dir]);
      assert.equal(r.code, 0, r.stderr);
      const list = await run('tar', ['tzf', join(dir, 'weir-0.1.0.tgz')]);
      const files = list.stdout.trim().split('\n').sort();
      for (const f of ['weir/crds/weir.dev_nodepolicystatuses.yaml', 'weir/crds/weir.dev_networkpolicystatuses.yaml', 'weir/values.schema.json', 'weir/templates/NOTES.txt']) {
        assert.ok(files.includes(f), `${f} in ${files.join(', ')}`);
      }
      assert.deepEqual(
        files.filter((f) => f.startsWith('weir/ci/')),
        [],
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
