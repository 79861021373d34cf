// Event-driven interface rescans: a link monitor (`ip -o monitor link`) tells of link changes,
// so an idle node does not poll; a slow safety rescan stays, and polling comes back while the
// monitor is down. Time is Node's mock timers (setTimeout and Date), so ten idle seconds take
// milliseconds.

import assert from 'node:assert/strict';
import { type TestContext, test } from 'node:test';
import { recordingRunner, type RunResult } from '../../../src/exec/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import type { CalcEvent } from '../../../src/model/types.ts';
import { createPodInterfaceScanner, type LinkMonitor, type LinkMonitorHandlers, type PodInterfaceOptions, type PodInterfaceScanner, withPodInterfaces } from '../../../src/sources/pod-interfaces.ts';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { localPod, manualSource, warningsOf } from '../../support/sources.ts';

/** Lets every pending promise callback and I/O step run (setImmediate is not mocked). */
async function flush(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
}

/** Moves the mock clock by `ms` in small steps, letting scans finish between them. */
async function advance(t: TestContext, ms: number, step = 5): Promise<void> {
  for (let done = 0; done < ms; done += step) {
    t.mock.timers.tick(Math.min(step, ms - done));
    await flush();
  }
}

interface FakeStream {
  readonly h: LinkMonitorHandlers;
  closed: boolean;
}

/** A monitor the test drives: each open() is one "process"; the test makes it ready, tells
 *  of changes, or ends it. */
function fakeMonitor(): LinkMonitor & { readonly opened: FakeStream[] } {
  const opened: FakeStream[] = [];
  return {
    opened,
    open(h) {
      const s: FakeStream = { h, closed: false };
      opened.push(s);
      return {
        close: async () => {
          s.closed = true;
        },
      };
    },
  };
}

/** A scanner over a table the test changes, counting its scans. */
function tableScanner(table: Map<string, string>): PodInterfaceScanner & { scans: number; table: Map<string, string> } {
  const s = {
    scans: 0,
    table,
    async scan() {
      s.scans++;
      return new Map(s.table);
    },
  };
  return s;
}

/** The agent's timings: poll 2 s while the monitor is down, 30 s safety rescan while it runs. */
const TIMINGS = { rescanMs: 2_000, safetyRescanMs: 30_000, unboundRescanMs: 100, debounceMs: 30 } as const;

/** A wrapped source with one bound local pod, synced and delivered. */
async function idleNode(t: TestContext, extra: Partial<PodInterfaceOptions> = {}) {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  const scanner = tableScanner(new Map([['10.244.1.5', 'veth1']]));
  const monitor = fakeMonitor();
  const inner = manualSource();
  const got: SourceBatch<CalcEvent>[] = [];
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log: silentLogger(), monitor, ...TIMINGS, ...extra });
  await src.start((b) => got.push(b));
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a', ['10.244.1.5']) }], synced: true, revision: 'r1' });
  await flush();
  assert.equal(scanner.scans, 1, 'the synced batch scans');
  return { scanner, monitor, src, got };
}

test('an idle node with a running link monitor does not poll: no scan in 10 s but the safety rescan at 30 s', async (t) => {
  const { scanner, monitor, src } = await idleNode(t);
  monitor.opened[0]?.h.ready();
  await advance(t, 100);
  const afterReady = scanner.scans; // the monitor's start may cost one scan (changes it missed)
  assert.ok(afterReady <= 2, `${afterReady} scans`);
  await advance(t, 10_000, 50);
  assert.equal(scanner.scans, afterReady, 'no periodic scan within 10 s of idle');
  await advance(t, 21_000, 50);
  assert.equal(scanner.scans, afterReady + 1, 'one safety rescan by 30 s');
  await src.stop();
  assert.equal(monitor.opened.length, 1, 'one monitor was started');
  assert.ok(monitor.opened[0].closed, 'stop() ends the monitor');
});

test('a link event triggers a rescan within the debounce, and its binding change is delivered', async (t) => {
  const { scanner, monitor, src, got } = await idleNode(t);
  monitor.opened[0]?.h.ready();
  await advance(t, 1_000, 50);
  const before = scanner.scans;
  scanner.table = new Map([['10.244.1.5', 'veth9']]); // the sandbox was re-created behind another port
  // A burst of events (new port, master set, carrier up) is one scan.
  monitor.opened[0]?.h.change();
  monitor.opened[0]?.h.change();
  await advance(t, 10, 1);
  monitor.opened[0]?.h.change();
  await advance(t, 30, 1);
  assert.equal(scanner.scans, before + 1, 'one scan within the 30 ms debounce');
  assert.deepEqual(got.at(-1), { events: [{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth9' } }], synced: true, revision: 'r1' });
  await advance(t, 5_000, 50);
  assert.equal(scanner.scans, before + 1, 'and nothing more while idle');
  await src.stop();
});

test('a link event during a scan is not lost: another scan follows it', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  let release: (() => void) | undefined;
  let scans = 0;
  let table = new Map([['10.244.1.5', 'veth1']]);
  const scanner: PodInterfaceScanner = {
    async scan() {
      scans++;
      const seen = new Map(table);
      if (scans === 3) await new Promise<void>((r) => (release = r)); // the third scan hangs until released
      return seen;
    },
  };
  const monitor = fakeMonitor();
  const inner = manualSource();
  const got: SourceBatch<CalcEvent>[] = [];
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log: silentLogger(), monitor, ...TIMINGS });
  await src.start((b) => got.push(b));
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a', ['10.244.1.5']) }], synced: true, revision: 'r1' });
  await flush();
  monitor.opened[0]?.h.ready();
  await advance(t, 100);
  monitor.opened[0]?.h.change();
  await advance(t, 40, 1);
  assert.ok(release, 'the event started a scan');
  const running = scans;
  table = new Map([['10.244.1.5', 'veth7']]); // changed after that scan read the kernel
  monitor.opened[0]?.h.change();
  release!();
  await advance(t, 40, 1);
  assert.equal(scans, running + 1, 'the event during the scan caused one more scan');
  assert.deepEqual(got.at(-1)?.events, [{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth7' } }]);
  await src.stop();
});

test('a monitor that dies brings back 2 s polling, warns once, and is restarted with backoff', async (t) => {
  const { log, warnings } = warningsOf();
  const { scanner, monitor, src } = await idleNode(t, { log, monitorRestart: { initialMs: 1_000, maxMs: 8_000 } });
  monitor.opened[0]?.h.ready();
  await advance(t, 5_000, 50);
  const idle = scanner.scans;

  monitor.opened[0]?.h.exit('ip exited with 1: netlink receive error');
  await advance(t, 10_000, 50);
  // Polling every 2 s while it is down: 5 scans in 10 s (one more for the restart's ready, if any).
  assert.ok(monitor.opened.length >= 2, 'restarted');
  assert.ok(scanner.scans - idle >= 4, `${scanner.scans - idle} scans while the monitor was down`);

  // The restarted monitor never comes up either: it keeps failing, retries back off, one warning.
  const opens = monitor.opened.length;
  for (let i = 0; i < 3; i++) {
    monitor.opened.at(-1)!.h.exit('cannot start');
    await advance(t, 20_000, 100);
  }
  assert.ok(monitor.opened.length <= opens + 3, `${monitor.opened.length - opens} restarts for 3 failures (backoff)`);
  assert.equal(warnings.filter((w) => /monitor/.test(w)).length, 1, warnings.join('\n'));
  const pollingScans = scanner.scans;
  assert.ok(pollingScans - idle >= 25, 'polling went on throughout');

  // Up again: polling stops.
  monitor.opened.at(-1)!.h.ready();
  await advance(t, 200);
  const upAgain = scanner.scans;
  await advance(t, 10_000, 50);
  assert.equal(scanner.scans, upAgain, 'no polling once the monitor runs again');
  await src.stop();
  assert.ok(monitor.opened.at(-1)!.closed, 'the running monitor is closed on stop');
  const count = monitor.opened.length;
  await advance(t, 60_000, 1_000);
  assert.equal(monitor.opened.length, count, 'no restart after stop');
});

test('a monitor that cannot start at all: pods are still bound, by 2 s polling', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  const { log, warnings } = warningsOf();
  const scanner = tableScanner(new Map());
  const broken: LinkMonitor = {
    open(h) {
      queueMicrotask(() => h.exit('spawn ip ENOENT'));
      return { close: async () => {} };
    },
  };
  const inner = manualSource();
  const got: SourceBatch<CalcEvent>[] = [];
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log, monitor: broken, ...TIMINGS });
  await src.start((b) => got.push(b));
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a', ['10.244.1.5']) }], synced: true, revision: 'r1' });
  await flush();
  await advance(t, 5_000, 50);
  scanner.table = new Map([['10.244.1.5', 'veth1']]);
  await advance(t, 2_100, 50);
  assert.deepEqual(got.at(-1)?.events, [{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth1' } }]);
  assert.equal(warnings.filter((w) => /monitor/.test(w)).length, 1, warnings.join('\n'));
  await src.stop();
});

// What the scanner spawns per minute on an idle node with three bound pods: the real scanner
// over a fake kernel, every command counted.
const ok = (stdout: unknown): RunResult => ({ stdout: JSON.stringify(stdout), stderr: '', exitCode: 0 });
function idleKernel() {
  const ports = [1, 2, 3].map((i) => ({ ifname: `veth${i}`, ifindex: 10 + i, link_index: 2, link_netnsid: i, master: 'cni0' }));
  return recordingRunner(async (call) => {
    const a = call.args.join(' ');
    if (a === '-j -d link show master cni0') return ok(ports);
    if (a === '-j netns list-id') return ok([1, 2, 3].map((i) => ({ nsid: i, name: `cni-${i}` })));
    const m = /^--net=\/var\/run\/netns\/cni-(\d)/.exec(a);
    if (call.cmd === 'nsenter' && m) return ok([{ ifindex: 2, addr_info: [{ family: 'inet', local: `10.244.1.${m[1]}`, scope: 'global' }] }]);
    return { stdout: '', stderr: `unexpected ${call.cmd} ${a}`, exitCode: 1 };
  });
}

async function spawnsPerIdleMinute(t: TestContext, monitored: boolean): Promise<number> {
  const runner = idleKernel();
  const monitor = fakeMonitor();
  const inner = manualSource();
  const src = withPodInterfaces(inner, {
    nodeName: 'node-a',
    // The scanner's clock is the mocked Date, so its ports settle in the mocked minute.
    scanner: createPodInterfaceScanner(runner, 'cni0', silentLogger(), () => Date.now()),
    log: silentLogger(),
    ...TIMINGS,
    ...(monitored ? { monitor } : {}),
  });
  await src.start(() => {});
  inner.push({ events: [1, 2, 3].map((i) => ({ kind: 'Pod', op: 'upsert', object: localPod(`p${i}`, [`10.244.1.${i}`]) })), synced: true, revision: 'r1' });
  await flush();
  monitor.opened[0]?.h.ready();
  await advance(t, 5_000, 50); // every pod bound, the monitor's first scan done, addresses settled
  const before = runner.calls.length;
  await advance(t, 60_000, 100);
  await src.stop();
  return runner.calls.length - before;
}

test('spawns per idle minute: 60 when polling every 2 s, at most 4 with the link monitor', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  const polling = await spawnsPerIdleMinute(t, false);
  const monitored = await spawnsPerIdleMinute(t, true);
  console.log(`scanner spawns per idle minute (3 bound pods): polling ${polling}, with the link monitor ${monitored} (+1 long-lived ip monitor)`);
  assert.equal(polling, 60);
  assert.ok(monitored <= 4, `${monitored} spawns`);
});
