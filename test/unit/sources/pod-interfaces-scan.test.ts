// The scan (pod-interfaces-scan.ts): each pod's addresses bound to its bridge port, read from the
// node's kernel (here a fake one).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { recordingRunner, type RunResult } from '../../../src/exec/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import { ADDRESSES_SETTLE_MS, createPodInterfaceScanner } from '../../../src/sources/pod-interfaces-scan.ts';
import { warningsOf } from '../../support/sources.ts';

const ok = (stdout: unknown): RunResult => ({ stdout: JSON.stringify(stdout), stderr: '', exitCode: 0 });
const port = (ifname: string, ifindex: number, peer: number, nsid: number) => ({ ifname, ifindex, link_index: peer, link_netnsid: nsid, master: 'cni0' });
const addrs = (ifindex: number, ...ips: [string, string][]) => [
  { ifindex: 1, ifname: 'lo', addr_info: [{ family: 'inet', local: '127.0.0.1', scope: 'host' }] },
  { ifindex, ifname: 'eth0', addr_info: ips.map(([local, scope]) => ({ family: local.includes(':') ? 'inet6' : 'inet', local, scope })) },
];

/** A node with the given bridge ports and, per pinned namespace, its interfaces. */
function kernel(ports: unknown[], namespaces: Record<number, [string, unknown]>) {
  return recordingRunner(async (call) => {
    const a = call.args.join(' ');
    if (a === '-j -d link show master cni0') return ok(ports);
    if (a === '-j netns list-id') return ok(Object.entries(namespaces).map(([nsid, [name]]) => ({ nsid: Number(nsid), name })));
    const m = call.cmd === 'nsenter' ? /^--net=\/var\/run\/netns\/(\S+) ip -j addr show$/.exec(a) : null;
    const ns = m && Object.values(namespaces).find(([name]) => name === m[1]);
    if (ns) return ok(ns[1]);
    return { stdout: '', stderr: `unexpected ip ${a}`, exitCode: 1 };
  });
}

test("the scanner binds each pod's global addresses to its own bridge port, read from inside its namespace", async () => {
  const runner = kernel([port('veth1', 10, 2, 0), port('veth2', 11, 2, 1)], {
    0: ['cni-a', addrs(2, ['10.244.1.5', 'global'], ['fd00::5', 'global'], ['fe80::1', 'link'])],
    1: ['cni-b', addrs(2, ['10.244.1.6', 'global'])],
  });
  const found = await createPodInterfaceScanner(runner, 'cni0', silentLogger()).scan();
  assert.deepEqual([...found].sort(), [
    ['10.244.1.5', 'veth1'],
    ['10.244.1.6', 'veth2'],
    ['fd00::5', 'veth1'],
  ]);
});

test('an address held by two pod interfaces is bound to neither', async () => {
  const runner = kernel([port('veth1', 10, 2, 0), port('veth2', 11, 2, 1)], {
    0: ['cni-a', addrs(2, ['10.244.1.5', 'global'])],
    1: ['cni-b', addrs(2, ['10.244.1.5', 'global'], ['10.244.1.6', 'global'])],
  });
  const found = await createPodInterfaceScanner(runner, 'cni0', silentLogger()).scan();
  assert.deepEqual([...found], [['10.244.1.6', 'veth2']]);
});

test('no bridge yet means nothing is bound; a known port is not read again', async () => {
  const none = recordingRunner(async () => ({ stdout: '', stderr: 'Device "cni0" does not exist.', exitCode: 1 }));
  assert.equal((await createPodInterfaceScanner(none, 'cni0', silentLogger()).scan()).size, 0);
  const runner = kernel([port('veth1', 10, 2, 0)], { 0: ['cni-a', addrs(2, ['10.244.1.5', 'global'])] });
  let t = 0;
  const scanner = createPodInterfaceScanner(runner, 'cni0', silentLogger(), () => t);
  await scanner.scan();
  t += 100;
  await scanner.scan();
  t += ADDRESSES_SETTLE_MS;
  await scanner.scan();
  await scanner.scan();
  assert.equal(runner.calls.filter((c) => c.cmd === 'nsenter').length, 2, 'read again while settling, then never');
});

test("a dual-stack pod scanned between its two addresses is bound to both: a port's addresses are read again in its first seconds", async () => {
  const namespaces: Record<number, [string, unknown]> = { 0: ['cni-a', addrs(2, ['10.244.1.5', 'global'])] };
  const runner = kernel([port('veth1', 10, 2, 0)], namespaces);
  let t = 0;
  const scanner = createPodInterfaceScanner(runner, 'cni0', silentLogger(), () => t);
  assert.deepEqual([...(await scanner.scan())], [['10.244.1.5', 'veth1']], 'the IPv4 address came first');
  namespaces[0] = ['cni-a', addrs(2, ['10.244.1.5', 'global'], ['fd00::5', 'global'])];
  t += 100;
  assert.deepEqual([...(await scanner.scan())].sort(), [
    ['10.244.1.5', 'veth1'],
    ['fd00::5', 'veth1'],
  ]);
});

test('a port read before its pod has an address is read again at the next scan, and bound then', async () => {
  const namespaces: Record<number, [string, unknown]> = { 0: ['cni-a', addrs(2)] };
  const runner = kernel([port('veth1', 10, 2, 0)], namespaces);
  let t = 0;
  const scanner = createPodInterfaceScanner(runner, 'cni0', silentLogger(), () => t);
  assert.equal((await scanner.scan()).size, 0, 'no address yet');
  namespaces[0] = ['cni-a', addrs(2, ['10.244.1.5', 'global'])]; // the runtime configures the pod after attaching its port
  assert.deepEqual([...(await scanner.scan())], [['10.244.1.5', 'veth1']]);
  t += ADDRESSES_SETTLE_MS;
  await scanner.scan();
  await scanner.scan();
  assert.equal(runner.calls.filter((c) => c.cmd === 'nsenter').length, 2, 'read until found, then cached once settled');
});

test('a problem that lasts is said once, not at every scan', async () => {
  const runner = kernel([port('veth1', 10, 2, 0), port('veth2', 11, 2, 1)], {
    0: ['cni-a', addrs(2, ['10.244.1.5', 'global'])],
    1: ['cni-b', addrs(2, ['10.244.1.5', 'global'])],
  });
  const { log, warnings } = warningsOf();
  const scanner = createPodInterfaceScanner(runner, 'cni0', log);
  for (let i = 0; i < 5; i++) await scanner.scan();
  assert.equal(warnings.length, 1, warnings.join('\n'));
});

test('a bridge port whose namespace is not pinned is said once, and its pod stays unbound', async () => {
  const runner = kernel([port('veth1', 10, 2, 7)], {});
  const { log, warnings } = warningsOf();
  const scanner = createPodInterfaceScanner(runner, 'cni0', log);
  for (let i = 0; i < 3; i++) assert.equal((await scanner.scan()).size, 0);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /veth1 is not pinned under \/var\/run\/netns/);
});
