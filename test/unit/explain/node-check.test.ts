// --node-check compares the kernel's chains and sets on a packet's way with calc's: the same
// state is confirmed, each kind of drift is named where it is. The kernel's state here is the
// text iptables-save and ipset save print for what the dataplane writes.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { makeNames } from '../../../src/calc/index.ts';
import type { DesiredDataplane } from '../../../src/calc/index.ts';
import { hookSpec, renderChain, renderLayerEnd } from '../../../src/dataplane/render.ts';
import type { Explanation, ExplainConfig } from '../../../src/explain/explain.ts';
import { explainer } from '../../../src/explain/explain.ts';
import { formatNodeChecks } from '../../../src/explain/format.ts';
import { checksFor, kernelStateOf } from '../../../src/explain/node-check.ts';
import type { ModelEvent, Pod } from '../../../src/model/types.ts';

const names = makeNames('cali');
const CFG: ExplainConfig = { names, families: [4], marks: { accept: 0x10000, pass: 0x20000 }, podBridge: 'cni0', allowAction: 'ACCEPT', sourceBinding: true };

const pod = (key: string, node: string, ip: string, app: string): ModelEvent => {
  const [namespace, name] = key.split('/');
  const p: Pod = { uid: key, namespace, name, labels: { app }, nodeName: node, hostNetwork: false, phase: 'Running', terminating: false, ips: [ip], ports: [] };
  return { kind: 'Pod', op: 'upsert', object: p };
};
const EVENTS: ModelEvent[] = [
  { kind: 'Namespace', op: 'upsert', object: { name: 'a', labels: {} } },
  { kind: 'Node', op: 'upsert', object: { name: 'node-a', podCIDRs: ['10.244.1.0/24'] } },
  pod('a/web', 'node-a', '10.244.1.10', 'web'),
  pod('a/api', 'node-a', '10.244.1.11', 'api'),
  pod('a/db', 'node-a', '10.244.1.12', 'db'),
  {
    kind: 'NetworkPolicy',
    op: 'upsert',
    object: {
      namespace: 'a',
      name: 'web-from-api',
      uid: 'np1',
      generation: 1,
      spec: { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'api' } } }] }] },
    },
  },
];

/** What iptables-save prints for the chains as the dataplane writes them, with the hook. */
function iptablesSave(d: DesiredDataplane, edit: (chain: string, lines: string[]) => string[] = (_, l) => l): string {
  const out = ['*mangle', ':FORWARD ACCEPT [0:0]'];
  for (const chain of d.chains[4].keys()) out.push(`:${chain} - [0:0]`);
  out.push(`-A FORWARD ${hookSpec(d.topChain)}`);
  for (const [chain, rules] of d.chains[4]) out.push(...edit(chain, renderChain(chain, rules).lines));
  out.push('COMMIT');
  return `${out.join('\n')}\n`;
}

/** What ipset save prints for the sets. */
function ipsetSave(d: DesiredDataplane, edit: (set: string, members: string[]) => string[] = (_, m) => m): string {
  const out: string[] = [];
  for (const s of d.sets.values()) {
    out.push(`create ${s.name} ${s.type} family ${s.family === 4 ? 'inet' : 'inet6'} hashsize 1024 maxelem 65536 comment`);
    for (const m of edit(s.name, [...s.members])) out.push(`add ${s.name} ${m} comment "weir"`);
  }
  return `${out.join('\n')}\n`;
}

describe('node check', () => {
  const ex = explainer(EVENTS, CFG);
  const desired = ex.desired('node-a');
  const x: Explanation = ex({ source: 'a/api', destination: 'a/web', protocol: 'TCP', port: 80 });
  const check = (ipt: string, sets: string) => checksFor(x, 'node-a', desired, () => kernelStateOf(ipt, sets));
  const tw = names.toWorkload('a/web');

  test('the kernel as the dataplane writes it holds what explain judged by', () => {
    const [c, ...more] = check(iptablesSave(desired), ipsetSave(desired));
    assert.equal(more.length, 0);
    assert.equal(c.same, true, JSON.stringify(c));
    assert.ok(c.chains.some((ch) => ch.chain === tw));
    assert.ok(c.sets.length > 0);
    assert.match(formatNodeChecks('node-a', [c]), /^node check on node-a, IPv4: the kernel holds what explain judged by \(the hook, \d+ chains, 1 set\)\n$/);
  });

  test('a node that decides no direction is told so, and nothing is read of it', () => {
    assert.deepEqual(
      checksFor(x, 'node-b', desired, () => assert.fail('read')),
      [],
    );
    assert.match(formatNodeChecks('node-b', []), /node-b decides no direction of this connection/);
  });

  test('a rule edited, a chain missing, or the hook gone: the chain and the first line that differs', () => {
    const edited = check(
      iptablesSave(desired, (chain, lines) => (chain === tw ? lines.map((l, i) => (i === 2 ? l.replace(/weir:\S+/, 'weir:tampered') : l)) : lines)),
      ipsetSave(desired),
    )[0];
    assert.equal(edited.same, false);
    assert.deepEqual(
      edited.chains.filter((c) => !c.same).map((c) => [c.chain, c.firstDifference]),
      [[tw, 3]],
    );
    const missing = check(iptablesSave(desired, (chain, lines) => (chain === tw ? [] : lines)).replace(`:${tw} - [0:0]\n`, ''), ipsetSave(desired))[0];
    assert.deepEqual(
      missing.chains.filter((c) => !c.same).map((c) => [c.chain, c.kernel]),
      [[tw, null]],
    );
    assert.match(formatNodeChecks('node-a', [missing]), new RegExp(`chain ${tw}: missing from the kernel`));
    const shorter = check(
      iptablesSave(desired, (chain, lines) => (chain === tw ? lines.slice(0, -1) : lines)),
      ipsetSave(desired),
    )[0];
    assert.deepEqual(
      shorter.chains.filter((c) => !c.same).map((c) => [c.firstDifference, c.kernel, c.expected]),
      [[desired.chains[4].get(tw)!.length, desired.chains[4].get(tw)!.length - 1, desired.chains[4].get(tw)!.length]],
    );
    const noHook = check(iptablesSave(desired).replace(`-A FORWARD ${hookSpec(desired.topChain)}\n`, ''), ipsetSave(desired))[0];
    assert.deepEqual([noHook.same, noHook.hook], [false, false]);
    assert.match(formatNodeChecks('node-a', [noHook]), /hook: mangle FORWARD's first rule is not Weir's hook/);
  });

  test('a chain layered above older rules, as an nf_tables write leaves it until the tidy, is the same', () => {
    const layered = check(
      iptablesSave(desired, (chain, lines) => {
        if (chain !== tw) return lines;
        const hashes = renderChain(chain, desired.chains[4].get(chain)!).hashes;
        return [...lines, renderLayerEnd(chain, hashes.at(-1)!).line, `-A ${chain} -m comment --comment "weir:old older rule" -j DROP`];
      }),
      ipsetSave(desired),
    )[0];
    assert.equal(layered.same, true, JSON.stringify(layered.chains));
    assert.equal(layered.chains.find((c) => c.chain === tw)?.layered, true);
    // More rules without the layer's end are not the same.
    const extra = check(
      iptablesSave(desired, (chain, lines) => (chain === tw ? [...lines, lines[0]] : lines)),
      ipsetSave(desired),
    )[0];
    assert.equal(extra.same, false);
  });

  test('a set that lost the looked-up member, gained others, or is gone: what the kernel answers, and the members that differ', () => {
    const set = x.families[0].directions.flatMap((d) => d.path.flatMap((p) => p.lookups)).find((l) => l.found)!;
    const lost = check(
      iptablesSave(desired),
      ipsetSave(desired, (name, m) => (name === set.set ? m.filter((x) => x !== '10.244.1.11') : m)),
    )[0];
    const s = lost.sets.find((c) => c.set === set.set)!;
    assert.deepEqual([s.same, s.expected, s.kernel, s.missing, s.extra, s.examples], [false, true, false, 1, 0, ['missing 10.244.1.11']]);
    assert.match(formatNodeChecks('node-a', [lost]), new RegExp(`set ${set.set}: the kernel lacks 10\\.244\\.1\\.11 \\(calc: holds\\); 1 members missing, 0 extra`));
    const gained = check(
      iptablesSave(desired),
      ipsetSave(desired, (name, m) => (name === set.set ? [...m, '10.9.0.0/16'] : m)),
    )[0];
    assert.deepEqual(
      gained.sets.map((c) => [c.same, c.kernel, c.extra]),
      [[false, true, 1]],
    );
    const gone = check(iptablesSave(desired), '')[0];
    assert.deepEqual(
      gone.sets.map((c) => [c.same, c.kernel]),
      [[false, null]],
    );
  });
});
