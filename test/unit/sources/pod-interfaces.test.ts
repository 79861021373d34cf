// withPodInterfaces: batches that bring a local pod address wait for a scan; rescans deliver
// binding changes on their own.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { silentLogger } from '../../../src/log.ts';
import type { CalcEvent, ModelEvent, Pod } from '../../../src/model/types.ts';
import { withPodInterfaces, type PodInterfaceScanner } from '../../../src/sources/pod-interfaces.ts';
import type { SourceBatch } from '../../../src/sources/types.ts';
import { localPod, manualSource } from '../../support/sources.ts';

test('a batch bringing a new local pod address waits for a scan and carries its binding; remote pods do not scan', async () => {
  let scans = 0;
  let table = new Map([['10.244.1.5', 'veth1']]);
  const scanner: PodInterfaceScanner = {
    scan: async () => {
      scans++;
      return new Map(table);
    },
  };
  const inner = manualSource();
  const got: SourceBatch<CalcEvent>[] = [];
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log: silentLogger(), rescanMs: 60_000, unboundRescanMs: 60_000 });
  await src.start((b) => got.push(b));
  const upsert = (p: Pod): ModelEvent => ({ kind: 'Pod', op: 'upsert', object: p });
  inner.push({ events: [upsert(localPod('a', ['10.244.1.5']))], synced: true, revision: 'r1' });
  inner.push({ events: [upsert(localPod('r', ['10.244.2.9'], 'node-b'))], synced: true, revision: 'r2' });
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(scans, 1);
  assert.deepEqual(
    got.map((b) => [b.revision, b.events.map((e) => e.kind)]),
    [
      ['r1', ['Pod', 'PodInterface']],
      ['r2', ['Pod']],
    ],
  );
  assert.deepEqual(got[0].events[1], { kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth1' } });
  table = new Map([
    ['10.244.1.5', 'veth1'],
    ['10.244.1.7', 'veth3'],
  ]);
  inner.push({ events: [upsert(localPod('b', ['10.244.1.7']))], synced: true, revision: 'r3' });
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(got[2].events.slice(1), [{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.7', port: 'veth3' } }]);
  await src.stop();
});

test('a periodic rescan delivers binding changes alone, with the last delivered revision', async () => {
  let table = new Map([['10.244.1.5', 'veth1']]);
  const scanner: PodInterfaceScanner = { scan: async () => new Map(table) };
  const inner = manualSource();
  const got: SourceBatch<CalcEvent>[] = [];
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log: silentLogger(), rescanMs: 20, unboundRescanMs: 20 });
  await src.start((b) => got.push(b));
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a', ['10.244.1.5']) }], synced: true, revision: 'r1' });
  await new Promise((r) => setTimeout(r, 5));
  table = new Map([['10.244.1.5', 'veth9']]); // the sandbox was re-created behind another port
  await new Promise((r) => setTimeout(r, 60));
  await src.stop();
  const rescan = got.find((b) => b !== got[0]);
  assert.ok(rescan, 'a rescan batch');
  assert.equal(rescan.revision, 'r1');
  assert.deepEqual(rescan.events, [{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth9' } }]);
});

test('a re-created pod reusing a bound address is scanned again, so it is bound to its new port', async () => {
  let table = new Map([['10.244.1.5', 'veth1']]);
  const scanner: PodInterfaceScanner = { scan: async () => new Map(table) };
  const inner = manualSource();
  const got: SourceBatch<CalcEvent>[] = [];
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log: silentLogger(), rescanMs: 60_000, unboundRescanMs: 60_000 });
  await src.start((b) => got.push(b));
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a', ['10.244.1.5']) }], synced: true, revision: 'r1' });
  inner.push({ events: [{ kind: 'Pod', op: 'delete', uid: 'a' }], synced: true, revision: 'r2' });
  await new Promise((r) => setTimeout(r, 5));
  table = new Map([['10.244.1.5', 'veth2']]);
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a2', ['10.244.1.5']) }], synced: true, revision: 'r3' });
  await new Promise((r) => setTimeout(r, 5));
  await src.stop();
  assert.deepEqual(got.at(-1)!.events.slice(1), [{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth2' } }]);
});

test('an address that stays unbound is looked for less and less often, down to the ordinary rescan', async () => {
  let scans = 0;
  const scanner: PodInterfaceScanner = {
    scan: async () => {
      scans++;
      return new Map();
    },
  };
  const inner = manualSource();
  const src = withPodInterfaces(inner, { nodeName: 'node-a', scanner, log: silentLogger(), rescanMs: 160, unboundRescanMs: 10 });
  await src.start(() => {});
  inner.push({ events: [{ kind: 'Pod', op: 'upsert', object: localPod('a', ['10.244.1.5']) }], synced: true, revision: 'r1' });
  await new Promise((r) => setTimeout(r, 600));
  await src.stop();
  // 1 for the batch, then delays of 10, 20, 40, 80, 160, 160: at most 7 in 600 ms (60 at a fixed 10 ms).
  assert.ok(scans >= 4 && scans <= 8, `${scans} scans`);
});
