import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { FlowCutter } from '../../../src/agent/connection-cut.ts';
import type { ConnectionFilter, TrackedFlow } from '../../../src/dataplane/conntrack.ts';
import { parseFlows } from '../../../src/dataplane/conntrack.ts';
import { batch, counterValue, setup } from './loop-fixtures.ts';

/** A conntrack table in memory: listing and keyed deletion as the kernel's. */
class FakeTable implements FlowCutter {
  flows: TrackedFlow[];
  lists = 0;
  deletions: string[] = [];
  own = new Set(['10.244.1.1']);
  constructor(text: string) {
    this.flows = parseFlows(text, 4);
  }
  async listFlows() {
    this.lists++;
    return [...this.flows];
  }
  async deleteConnections(k: ConnectionFilter) {
    this.deletions.push(`${k.src ?? '*'}>${k.dst ?? '*'}:${k.dport ?? '*'}`);
    const before = this.flows.length;
    const takes = (f: TrackedFlow) =>
      f.protocol === k.protocol && (k.src === undefined || f.orig.src === k.src) && (k.dst === undefined || f.reply.src === k.dst) && (k.dport === undefined || f.reply.sport === k.dport);
    this.flows = this.flows.filter((f) => !takes(f));
    return before - this.flows.length;
  }
  async localAddresses() {
    return this.own;
  }
}

const TABLE = [
  // Two connections of one key, one of another, one the judge keeps, one from the node itself, one of no target.
  'tcp 6 100 ESTABLISHED src=10.244.2.9 dst=10.244.1.5 sport=40001 dport=80 src=10.244.1.5 dst=10.244.2.9 sport=80 dport=40001 [ASSURED]',
  'tcp 6 100 ESTABLISHED src=10.244.2.9 dst=10.244.1.5 sport=40002 dport=80 src=10.244.1.5 dst=10.244.2.9 sport=80 dport=40002 [ASSURED]',
  'udp 17 100 src=10.244.2.8 dst=10.244.1.5 sport=5000 dport=53 src=10.244.1.5 dst=10.244.2.8 sport=53 dport=5000',
  'tcp 6 100 ESTABLISHED src=10.244.2.7 dst=10.244.1.5 sport=40003 dport=80 src=10.244.1.5 dst=10.244.2.7 sport=80 dport=40003 [ASSURED]',
  'tcp 6 100 ESTABLISHED src=10.244.1.1 dst=10.244.1.5 sport=40004 dport=80 src=10.244.1.5 dst=10.244.1.1 sport=80 dport=40004 [ASSURED]',
  'tcp 6 100 ESTABLISHED src=10.244.2.9 dst=10.244.1.6 sport=40005 dport=80 src=10.244.1.6 dst=10.244.2.9 sport=80 dport=40005 [ASSURED]',
].join('\n');

function cutSetup(opts: { targets?: string[] } = {}) {
  const table = new FakeTable(TABLE);
  const judged: string[] = [];
  const env = setup({
    cut: {
      dataplane: table,
      targets: () => opts.targets ?? ['10.244.1.5'],
      // Everything but 10.244.2.7's connections is denied.
      judge: () => (k, ends) => {
        judged.push(`${k.src}>${k.dst}:${k.dport} ${ends.source ? 's' : ''}${ends.destination ? 'd' : ''}`);
        return k.src !== '10.244.2.7';
      },
    },
  });
  return { ...env, table, judged };
}

describe('cutting the connections the written rules deny', () => {
  test("after a write that follows a model change, the targets' connections judged denied are deleted, each key judged once, and counted", async () => {
    const { clock, r, table, judged, metrics } = cutSetup();
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    await r.whenIdle();
    assert.deepEqual(judged.sort(), ['10.244.2.7>10.244.1.5:80 d', '10.244.2.8>10.244.1.5:53 d', '10.244.2.9>10.244.1.5:80 d'], 'each key judged once');
    // UDP to 10.244.1.5 is all denied: by destination; TCP from 10.244.2.9 to it, not to 10.244.1.6: by pair.
    assert.deepEqual(table.deletions.sort(), ['*>10.244.1.5:*', '10.244.2.9>10.244.1.5:*']);
    assert.deepEqual(
      table.flows.map((f) => f.orig.src),
      ['10.244.2.7', '10.244.1.1', '10.244.2.9'],
      'the allowed one, the node-local one and the one of no target stay',
    );
    assert.equal(await counterValue(metrics, 'connectionsCut', {}), 3);
  });

  test('a failed write cuts nothing, and the retry that succeeds does', async () => {
    const { clock, dataplane, r, table } = cutSetup();
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    await r.whenIdle();
    assert.equal(table.lists, 1);
    dataplane.failWrites = 1;
    r.onBatch(batch('r2'));
    await clock.advanceAsync(50);
    assert.equal(dataplane.writes().length, 2);
    assert.equal(table.lists, 1, 'the failed write cut nothing');
    await clock.advanceAsync(500);
    await r.whenIdle();
    assert.equal(table.lists, 2, 'the retry that succeeded did');
  });

  test('a periodic resync, which changes no rule, judges nothing', async () => {
    const table = new FakeTable(TABLE);
    const { clock, dataplane, r } = setup({ resyncIntervalMs: 1_000, cut: { dataplane: table, targets: () => ['10.244.1.5'], judge: () => () => false } });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    assert.equal(table.lists, 1);
    await clock.advanceAsync(2_500);
    assert.ok(dataplane.writes('resync').length >= 2, 'periodic resyncs ran');
    assert.equal(table.lists, 1);
  });

  test('stop() ends a running round at its next deletion, so a shutdown does not wait for a long cut', async () => {
    const table = new FakeTable(TABLE);
    let release: () => void = () => {};
    const first = new Promise<void>((resolve) => (release = resolve));
    const deleteOne = table.deleteConnections.bind(table);
    table.deleteConnections = async (f) => {
      await first;
      return deleteOne(f);
    };
    const { clock, r } = setup({ cut: { dataplane: table, targets: () => ['10.244.1.5'], judge: () => () => true } });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    const stopped = r.stop();
    release();
    await stopped;
    assert.equal(table.deletions.length, 1, 'only the deletion under way ran');
  });

  test('nothing opted in: the table is never read', async () => {
    const { clock, r, table } = cutSetup({ targets: [] });
    r.onBatch(batch('r1'));
    await clock.advanceAsync(100);
    await r.whenIdle();
    assert.equal(table.lists, 0);
  });
});
