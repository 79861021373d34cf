// Pod interface bindings follow link events on a real kernel: a node namespace with a cni0
// bridge, pods in pinned namespaces of their own (veth, host end on the bridge), the scanner
// and the link monitor run through netnsRunner as the demo and the kernel agent tests run them.
// Periodic rescans are set a minute apart, so a binding that appears within 500 ms can only
// have come from the monitor. Everything lives in namespaces with a fresh unique prefix,
// deleted after the tests (also when they fail).

import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { after, before, describe, test } from 'node:test';
import { processRunner, netnsRunner, recordingRunner } from '../../src/dataplane/index.ts';
import { silentLogger } from '../../src/log.ts';
import type { CalcEvent, PodInterfaceEvent } from '../../src/model/types.ts';
import { createNs, deleteAllNs, inNs, sh, uniquePrefix } from '../../src/sim/netns.ts';
import { createLinkMonitor, createPodInterfaceScanner, type PodInterfaceOptions, withPodInterfaces } from '../../src/sources/pod-interfaces.ts';
import type { SourceBatch } from '../../src/sources/types.ts';
import { manualSource } from '../support/sources.ts';

const skip = process.getuid?.() !== 0 ? 'needs root (network namespaces)' : false;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function poll<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined> | T | undefined): Promise<T> {
  const t0 = performance.now();
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (performance.now() - t0 > timeoutMs) assert.fail(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(5);
  }
}

describe('pod interface bindings on link events (real kernel)', { skip }, () => {
  const prefix = uniquePrefix('wpif');
  const node = `${prefix}node`;
  let pods = 0;

  before(async () => {
    await createNs(node);
    await inNs(node, 'ip', ['link', 'add', 'cni0', 'type', 'bridge']);
    await inNs(node, 'ip', ['link', 'set', 'cni0', 'up']);
  });
  after(async () => {
    await deleteAllNs(prefix);
  });

  /** The PIDs of the `ip -o monitor link` processes inside the node namespace. */
  async function monitorsInNode(): Promise<number[]> {
    const pids = (await sh('ip', ['netns', 'pids', node])).split('\n').filter(Boolean).map(Number);
    const out: number[] = [];
    for (const pid of pids) {
      const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
      if (cmdline.split('\0').join(' ').trim() === 'ip -o monitor link') out.push(pid);
    }
    return out;
  }

  /** A pod namespace (pinned under /var/run/netns) with eth0, its peer `port` in the node namespace. */
  async function podWithVeth(port: string): Promise<string> {
    const ns = `${prefix}pod${++pods}`;
    await createNs(ns);
    await inNs(ns, 'ip', ['link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', port, 'netns', node]);
    return ns;
  }

  /** The agent's wiring, with periodic rescans a minute apart. */
  async function start(extra: Partial<PodInterfaceOptions> = {}) {
    const runner = recordingRunner(netnsRunner(node, processRunner()));
    const inner = manualSource();
    const got: SourceBatch<CalcEvent>[] = [];
    const log = silentLogger();
    const src = withPodInterfaces(inner, {
      nodeName: 'node-a',
      scanner: createPodInterfaceScanner(runner, 'cni0', log),
      monitor: createLinkMonitor(runner),
      log,
      rescanMs: 60_000,
      safetyRescanMs: 60_000,
      unboundRescanMs: 60_000,
      debounceMs: 30,
      ...extra,
    });
    await src.start((b) => got.push(b));
    inner.push({ events: [], synced: true, revision: 'r1' });
    await poll('the link monitor in the node namespace', 5_000, async () => ((await monitorsInNode()).length === 1 ? true : undefined));
    await sleep(200); // the monitor's first scan (changes while it started) is done
    const bindings = () => got.flatMap((b) => b.events.filter((e): e is PodInterfaceEvent => e.kind === 'PodInterface'));
    const bound = (ip: string, port: string) => bindings().some((e) => e.op === 'upsert' && e.object.ip === ip && e.object.port === port) || undefined;
    return { runner, src, got, bindings, bound };
  }

  test('a pod port joining the bridge, and a port whose pod comes up after it joined, are bound within 500 ms; no scan while idle; stop leaves no monitor', async () => {
    const { runner, src, bindings, bound } = await start();
    try {
      // The sim's (and a CNI's) order: addressed and up inside the pod, then the host end joins the bridge.
      const a = await podWithVeth('wpa');
      await inNs(a, 'ip', ['addr', 'add', '10.244.1.5/24', 'dev', 'eth0']);
      await inNs(a, 'ip', ['link', 'set', 'eth0', 'up']);
      let t0 = performance.now();
      await inNs(node, 'ip', ['link', 'set', 'wpa', 'master', 'cni0', 'up']);
      await poll('10.244.1.5 bound to wpa', 2_000, () => bound('10.244.1.5', 'wpa'));
      const joined = performance.now() - t0;

      // The port joins first; the pod's address comes later, then its eth0 goes up: the carrier
      // change of the host end is the node's event.
      const b = await podWithVeth('wpb');
      await inNs(node, 'ip', ['link', 'set', 'wpb', 'master', 'cni0', 'up']);
      await sleep(200);
      await inNs(b, 'ip', ['addr', 'add', '10.244.1.6/24', 'dev', 'eth0']);
      t0 = performance.now();
      await inNs(b, 'ip', ['link', 'set', 'eth0', 'up']);
      await poll('10.244.1.6 bound to wpb', 2_000, () => bound('10.244.1.6', 'wpb'));
      const carrier = performance.now() - t0;

      // The port goes (the pod is deleted): its binding goes too.
      t0 = performance.now();
      await inNs(node, 'ip', ['link', 'del', 'wpa']);
      await poll('10.244.1.5 unbound', 2_000, () => bindings().some((e) => e.op === 'delete' && e.ip === '10.244.1.5') || undefined);
      const gone = performance.now() - t0;
      console.log(`bound after joining the bridge: ${joined.toFixed(0)} ms; after the pod's carrier: ${carrier.toFixed(0)} ms; unbound after deletion: ${gone.toFixed(0)} ms`);
      assert.ok(joined < 500, `joined: ${joined} ms`);
      assert.ok(carrier < 500, `carrier: ${carrier} ms`);
      assert.ok(gone < 500, `gone: ${gone} ms`);

      // Idle: no command at all.
      await sleep(200);
      const calls = runner.calls.length;
      await sleep(3_000);
      assert.equal(runner.calls.length, calls, 'no scan in 3 idle seconds');
    } finally {
      await src.stop();
    }
    assert.deepEqual(await monitorsInNode(), [], 'no monitor left after stop()');
  });

  test('a monitor killed from outside: 2 s polling (here 300 ms) binds meanwhile, and it is restarted', async () => {
    const { src, bound } = await start({ rescanMs: 300, monitorRestart: { initialMs: 1_500, maxMs: 1_500 } });
    try {
      const [first] = await monitorsInNode();
      process.kill(first, 'SIGKILL');
      await poll('the monitor gone', 2_000, async () => ((await monitorsInNode()).length === 0 ? true : undefined));
      // While no monitor runs: only polling can bind this pod.
      const c = await podWithVeth('wpc');
      await inNs(c, 'ip', ['addr', 'add', '10.244.1.7/24', 'dev', 'eth0']);
      await inNs(c, 'ip', ['link', 'set', 'eth0', 'up']);
      await inNs(node, 'ip', ['link', 'set', 'wpc', 'master', 'cni0', 'up']);
      const t0 = performance.now();
      await poll('10.244.1.7 bound by polling', 2_000, () => bound('10.244.1.7', 'wpc'));
      assert.deepEqual(await monitorsInNode(), [], 'bound before the monitor was back');
      console.log(`bound by polling after ${(performance.now() - t0).toFixed(0)} ms while the monitor was down`);
      const again = await poll('a new monitor', 5_000, async () => {
        const pids = await monitorsInNode();
        return pids.length === 1 && pids[0] !== first ? pids[0] : undefined;
      });
      assert.notEqual(again, first);
    } finally {
      await src.stop();
    }
    assert.deepEqual(await monitorsInNode(), [], 'no monitor left after stop()');
  });
});
