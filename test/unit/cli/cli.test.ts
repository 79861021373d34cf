import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parse, toConfig } from '../../../src/cli/flags.ts';
import { ConfigError } from '../../../src/errors.ts';

const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
const EXAMPLES = fileURLToPath(new URL('../../../examples/', import.meta.url));
const weir = (args: string[], env: Record<string, string> = {}) => spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', env: { ...process.env, ...env } });

describe('weir CLI', () => {
  test('render prints the ipset and both iptables payloads, the same bytes every time', () => {
    const a = weir(['render', '--manifests', EXAMPLES, '--node-name', 'node-a']);
    assert.equal(a.status, 0, a.stderr);
    assert.match(a.stdout, /^# ipset restore\ncreate cali40s:/);
    assert.match(a.stdout, /# iptables-restore --noflush \(IPv4\)\n\*mangle\n:cali-FORWARD - \[0:0\]/);
    assert.match(a.stdout, /# ip6tables-restore --noflush \(IPv6\)\n\*mangle/);
    assert.match(
      a.stdout,
      /-I FORWARD 1 -m comment --comment "weir:hook" -j cali-FORWARD\nCOMMIT\n\*filter\n-I FORWARD 1 -m mark --mark 0x10000\/0x10000 -m comment --comment "weir:hook" -j ACCEPT\nCOMMIT\n/,
    );
    assert.equal(weir(['render', '--manifests', EXAMPLES, '--node-name', 'node-a']).stdout, a.stdout);
  });

  test('render takes its flags from WEIR_* environment variables too, and honours the prefix', () => {
    const r = weir(['render'], { WEIR_MANIFESTS: EXAMPLES, WEIR_NODE_NAME: 'node-b', WEIR_CHAIN_PREFIX: 'weir', WEIR_FAMILIES: '4' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /:weir-FORWARD - \[0:0\]/);
    assert.doesNotMatch(r.stdout, /cali/);
    assert.doesNotMatch(r.stdout, /IPv6/);
  });

  test('render lists an invalid policy with the path of every error', () => {
    const dir = mkdtempSync(join(tmpdir(), 'weir-cli-'));
    try {
      writeFileSync(
        join(dir, 'p.yaml'),
        [
          'apiVersion: networking.k8s.io/v1',
          'kind: NetworkPolicy',
          'metadata: {name: bad, namespace: ns}',
          'spec:',
          '  podSelector: {}',
          '  ingress:',
          '    - from: [{ipBlock: {cidr: nonsense}}]',
          '      ports: [{port: 70000}]',
          '',
        ].join('\n'),
      );
      const r = weir(['render', '--manifests', dir, '--node-name', 'n']);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /# policy ns\/bad is invalid and adds no allowance/);
      assert.match(r.stdout, /spec\.ingress\[0\]\.from\[0\]\.ipBlock\.cidr/);
      assert.match(r.stdout, /spec\.ingress\[0\]\.ports\[0\]\.port/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('render lists an invalid ClusterNetworkPolicy with the path of every error, and writes its deny', () => {
    const dir = mkdtempSync(join(tmpdir(), 'weir-cli-'));
    try {
      writeFileSync(
        join(dir, 'p.yaml'),
        [
          'apiVersion: v1',
          'kind: Pod',
          'metadata: {name: p, namespace: ns}',
          'spec: {nodeName: n}',
          'status: {phase: Running, podIP: 10.0.0.5, podIPs: [{ip: 10.0.0.5}]}',
          '---',
          'apiVersion: policy.networking.k8s.io/v1beta1',
          'kind: ClusterNetworkPolicy',
          'metadata: {name: broken}',
          'spec:',
          '  tier: Admin',
          '  priority: 5',
          '  subject: {namespaces: {}}',
          '  egress:',
          '    - action: Deny',
          '      to: [{networks: [nonsense]}]',
          '',
        ].join('\n'),
      );
      const r = weir(['render', '--manifests', dir, '--node-name', 'n', '--families', '4']);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /# ClusterNetworkPolicy broken is invalid and denies all traffic of the pods it selects/);
      assert.match(r.stdout, /spec\.egress\[0\]\.to\[0\]\.networks\[0\]/);
      assert.match(r.stdout, /-A cali-ae-\S+ .*admin deny: broken rule -1" -j DROP/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('bad flags are all reported at once, with exit status 2', () => {
    const r = weir(['agent', '--mark-mask', '0xc000', '--families', '5', '--chain-prefix', 'Bad-Prefix', '--manifests', 'x', '--kubeconfig', 'y']);
    assert.equal(r.status, 2);
    for (const want of [
      /--node-name \(WEIR_NODE_NAME\) is required/,
      /--manifests and --kubeconfig exclude each other/,
      /overlaps kube-proxy/,
      /--families must be 4, 6 or 4,6/,
      /chain prefix "Bad-Prefix"/,
    ]) {
      assert.match(r.stderr, want);
    }
  });

  test('the agent outside a cluster without --kubeconfig or --manifests says what to pass', () => {
    const r = weir(['agent', '--node-name', 'n'], { KUBERNETES_SERVICE_HOST: '' });
    assert.equal(r.status, 2);
    assert.match(r.stderr, /pass --kubeconfig or --manifests/);
  });

  test('--favour-memory is off by default, and on by the flag or WEIR_FAVOUR_MEMORY', () => {
    const cfgOf = (argv: string[], env: NodeJS.ProcessEnv = {}) => toConfig(parse(['agent', '--node-name', 'n', ...argv], env).values, { nodeName: true, manifestsDir: false });
    assert.equal(cfgOf([]).favourMemory, false);
    assert.equal(cfgOf(['--favour-memory']).favourMemory, true);
    assert.equal(cfgOf([], { WEIR_FAVOUR_MEMORY: '1' }).favourMemory, true);
    assert.equal(cfgOf([], { WEIR_FAVOUR_MEMORY: 'no' }).favourMemory, false);
  });

  test('--hook-check-interval is in seconds like the other intervals, 5 by default, and 0 turns the check off', () => {
    const cfgOf = (argv: string[], env: NodeJS.ProcessEnv = {}) => toConfig(parse(['agent', '--node-name', 'n', ...argv], env).values, { nodeName: true, manifestsDir: false });
    assert.equal(cfgOf([]).hookCheckIntervalMs, 5000);
    assert.equal(cfgOf(['--hook-check-interval', '2']).hookCheckIntervalMs, 2000);
    assert.equal(cfgOf([], { WEIR_HOOK_CHECK_INTERVAL: '0' }).hookCheckIntervalMs, 0);
    assert.throws(
      () => cfgOf(['--hook-check-interval=-1']),
      (e: unknown) => e instanceof ConfigError && /--hook-check-interval \(WEIR_HOOK_CHECK_INTERVAL\) must be a non-negative number/.test(e.message),
    );
  });

  test('--first-compute-slice is 50000 objects by default and takes only a whole number of at least 1', () => {
    const cfgOf = (argv: string[], env: NodeJS.ProcessEnv = {}) => toConfig(parse(['agent', '--node-name', 'n', ...argv], env).values, { nodeName: true, manifestsDir: false });
    assert.equal(cfgOf([]).firstComputeSlice, 50_000);
    assert.equal(cfgOf(['--first-compute-slice', '1']).firstComputeSlice, 1);
    assert.equal(cfgOf([], { WEIR_FIRST_COMPUTE_SLICE: '20000' }).firstComputeSlice, 20_000);
    for (const bad of ['0', '2.5']) {
      assert.throws(
        () => cfgOf(['--first-compute-slice', bad]),
        (e: unknown) => e instanceof ConfigError && new RegExp(`first compute slice ${bad} must be a whole number of objects, at least 1`).test(e.message),
      );
    }
  });

  test('the audit log is off by default; its flags fill the audit settings, and bad values are named', () => {
    const cfgOf = (argv: string[], env: NodeJS.ProcessEnv = {}) => toConfig(parse(['agent', '--node-name', 'n', ...argv], env).values, { nodeName: true, manifestsDir: false });
    assert.deepEqual(cfgOf([]).audit, {
      enabled: false,
      defaultLevel: 'off',
      nflogGroup: 77,
      rate: 1000,
      ratePerSource: 100,
      file: '/var/log/weir/audit.log',
      maxSize: 10485760,
      maxFiles: 5,
      stdout: false,
    });
    const argv = [
      '--audit',
      'on',
      '--audit-default',
      'deny',
      '--audit-nflog-group',
      '90',
      '--audit-rate',
      '50',
      '--audit-rate-per-source',
      '7',
      '--audit-log-file',
      '/tmp/a.log',
      '--audit-log-max-size',
      '65536',
      '--audit-log-max-files',
      '2',
      '--audit-stdout',
    ];
    assert.deepEqual(cfgOf(argv).audit, { enabled: true, defaultLevel: 'deny', nflogGroup: 90, rate: 50, ratePerSource: 7, file: '/tmp/a.log', maxSize: 65536, maxFiles: 2, stdout: true });
    assert.equal(cfgOf([], { WEIR_AUDIT: 'on', WEIR_AUDIT_DEFAULT: 'all' }).audit.defaultLevel, 'all');
    assert.throws(
      () => cfgOf(['--audit', 'on', '--audit-default', 'some', '--audit-nflog-group', '2', '--audit-log-file', 'rel.log']),
      (e: unknown) =>
        e instanceof ConfigError &&
        /audit default "some" must be one of off, deny, all/.test(e.message) &&
        /audit NFLOG group 2 must be a whole number from 4 to 65535 \(1 to 3 are Calico's\)/.test(e.message) &&
        /audit log file "rel.log" must be an absolute path/.test(e.message),
    );
  });

  test('--ipvs is auto by default, on or off when given, and anything else is named', () => {
    const cfgOf = (argv: string[]) => toConfig(parse(['agent', '--node-name', 'n', ...argv], {}).values, { nodeName: true, manifestsDir: false });
    assert.equal(cfgOf([]).ipvs, 'auto');
    assert.equal(cfgOf(['--ipvs', 'ON']).ipvs, 'on');
    assert.throws(
      () => cfgOf(['--ipvs', 'maybe']),
      (e: unknown) => e instanceof ConfigError && /ipvs "maybe" must be auto, on or off/.test(e.message),
    );
  });

  test('the controller and the uninstall hook name every bad flag: --daemonset, --identity, Lease names, the timeout', () => {
    const c = weir(['controller', '--daemonset', 'weir', '--identity', '', '--lease-name', 'Bad_Name']);
    assert.equal(c.status, 2);
    for (const want of [
      /--daemonset \(WEIR_DAEMONSET\) must be NAMESPACE\/NAME, got "weir"/,
      /--identity \(WEIR_IDENTITY\) must not be empty/,
      /--lease-name \(WEIR_LEASE_NAME\) must be a Kubernetes object name/,
    ]) {
      assert.match(c.stderr, want);
    }
    const u = weir(['uninstall', '--uninstall-timeout', '0']);
    assert.equal(u.status, 2);
    assert.match(u.stderr, /--daemonset \(WEIR_DAEMONSET\) is required as NAMESPACE\/NAME/);
    assert.match(u.stderr, /--uninstall-timeout \(WEIR_UNINSTALL_TIMEOUT\) must be a whole number of seconds/);
    assert.match(weir(['agent', '--node-name', 'n', '--manifests', 'x', '--daemonset', 'kube-system/weir']).stderr, /--daemonset needs the cluster as the source/);
  });

  test('an unknown command or flag is a clear error', () => {
    assert.match(weir(['enforce']).stderr, /unknown command "enforce"/);
    assert.match(weir(['render', '--nodename', 'x']).stderr, /Unknown option '--nodename'/);
  });
});
