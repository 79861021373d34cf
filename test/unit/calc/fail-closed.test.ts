// Calc's fail-closed shapes: traffic of the pod bridge or this node's pod CIDRs that matches no
// known (bound) local pod is dropped, from the very first desired state on; RETURN mode.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Calculator, makeNames, type Rule } from '../../../src/calc/index.ts';
import { renderRuleBodies } from '../../../src/dataplane/render.ts';
import type { CalcEvent, Family } from '../../../src/model/types.ts';
import { MARKS, NODE, pod } from './fixtures.ts';

const names = makeNames('cali');
const text = (rules: readonly Rule[] | undefined) => (rules ?? []).flatMap(renderRuleBodies);

function calc(o: { sourceBinding?: boolean; allowAction?: 'ACCEPT' | 'RETURN' } = {}): Calculator {
  return new Calculator({ nodeName: NODE, names, families: [4, 6], marks: MARKS, podBridge: 'cni0', ...o });
}
const chain = (c: Calculator, f: Family, name: string) => text(c.desired.chains[f].get(name));
const node = (name: string, podCIDRs: string[]): CalcEvent => ({ kind: 'Node', op: 'upsert', object: { name, podCIDRs } });

test('before any event the pod bridge is closed both ways in both families', () => {
  const c = calc();
  for (const f of [4, 6] as const) {
    assert.deepEqual(chain(c, f, names.fromWorkloadDispatch), ['-i cni0 -j DROP']);
    assert.deepEqual(chain(c, f, names.toWorkloadDispatch), ['-o cni0 -j DROP']);
  }
  // Neighbour discovery passes before dispatch: its sources are link-local, never a pod's.
  const top6 = chain(c, 6, names.forward);
  const firstJump = top6.findIndex((l) => l.includes(names.fromWorkloadDispatch));
  assert.ok(top6.slice(0, firstJump).filter((l) => l.includes('--icmpv6-type')).length === 4, top6.join('\n'));
  assert.ok(!chain(c, 4, names.forward).some((l) => l.includes('icmp')));
});

test("this node's pod CIDRs close too, per family; another node's do not; without its Node the bridge alone closes", () => {
  const c = calc();
  c.applyEvents([node('node-b', ['10.244.2.0/24']), node(NODE, ['10.244.1.0/24', 'fd00:10:244:1::/64'])]);
  assert.deepEqual(chain(c, 4, names.fromWorkloadDispatch), ['-s 10.244.1.0/24 -j DROP', '-i cni0 -j DROP']);
  assert.deepEqual(chain(c, 4, names.toWorkloadDispatch), ['-d 10.244.1.0/24 -j DROP', '-o cni0 -j DROP']);
  assert.deepEqual(chain(c, 6, names.fromWorkloadDispatch), ['-s fd00:10:244:1::/64 -j DROP', '-i cni0 -j DROP']);
  c.applyEvents([{ kind: 'Node', op: 'delete', name: NODE }]);
  assert.deepEqual(chain(c, 4, names.fromWorkloadDispatch), ['-i cni0 -j DROP']);
});

test('a local pod may send only once its bridge port is known, and only through that port', () => {
  const c = calc({ sourceBinding: true });
  const p = pod('ns', 'a', { ip4: 5, ip6: false });
  c.applyEvents([{ kind: 'Pod', op: 'upsert', object: p }]);
  const from = names.dispatchBucket('from', '10.244.1.0/28');
  const to = names.dispatchBucket('to', '10.244.1.0/28');
  assert.deepEqual(chain(c, 4, from), ['-j DROP'], 'unbound: no way out');
  assert.deepEqual(chain(c, 4, to), [`-d 10.244.1.5/32 -g ${names.toWorkload(p.uid)}`, '-j DROP'], 'it can already be reached');
  let d = c.applyEvents([{ kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.1.5', port: 'veth1234' } }]);
  assert.deepEqual([...d.chains[4]], [from]);
  assert.deepEqual(chain(c, 4, from), [`-s 10.244.1.5/32 -m physdev --physdev-in veth1234 -g ${names.fromWorkload(p.uid)}`, '-j DROP']);
  d = c.applyEvents([{ kind: 'PodInterface', op: 'delete', ip: '10.244.1.5' }]);
  assert.deepEqual(chain(c, 4, from), ['-j DROP']);
  c.applyEvents([{ kind: 'Pod', op: 'delete', uid: p.uid }]);
  assert.equal(c.desired.chains[4].has(from), false);
  assert.deepEqual(chain(c, 4, names.fromWorkloadDispatch), ['-i cni0 -j DROP']);
});

test('without source binding a local pod is dispatched by its address alone', () => {
  const c = calc({ sourceBinding: false });
  const p = pod('ns', 'a', { ip4: 5, ip6: false });
  c.applyEvents([{ kind: 'Pod', op: 'upsert', object: p }]);
  assert.deepEqual(chain(c, 4, names.dispatchBucket('from', '10.244.1.0/28')), [`-s 10.244.1.5/32 -g ${names.fromWorkload(p.uid)}`, '-j DROP']);
});

test('RETURN mode: replies (from their pod chains, once dispatched) and allowed packets go back to FORWARD, nothing is ACCEPTed, a pod still reaches itself', () => {
  const c = calc({ allowAction: 'RETURN' });
  const p = pod('ns', 'a', { ip4: 5, ip6: false });
  c.applyEvents([{ kind: 'Pod', op: 'upsert', object: p }]);
  const all = [...c.desired.chains[4].values()].flatMap((r) => text(r));
  assert.deepEqual(
    all.filter((l) => l.endsWith('-j ACCEPT')),
    [],
  );
  // Replies return only from the pod's own chain, after dispatch has checked their addresses.
  assert.ok(!chain(c, 4, names.forward).some((l) => l.includes('--ctstate')), 'no reply leaves before dispatch');
  for (const own of [names.toWorkload(p.uid), names.fromWorkload(p.uid)]) assert.equal(chain(c, 4, own)[0], '-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN');
  assert.ok(chain(c, 4, names.toWorkload(p.uid)).includes('-s 10.244.1.5/32 -j RETURN'));
  assert.ok(chain(c, 4, names.fromWorkload(p.uid)).includes('-d 10.244.1.5/32 -j RETURN'));
  const accept = calc();
  accept.applyEvents([{ kind: 'Pod', op: 'upsert', object: p }]);
  assert.equal(chain(accept, 4, names.forward).at(-1), '-m mark --mark 0x10000/0x10000 -j ACCEPT');
  assert.ok(chain(accept, 4, names.workloadCommon).includes(`-m conntrack --ctstate RELATED,ESTABLISHED -g ${names.accept}`));
  assert.equal(c.desired.chains[4].has(names.accept), false, 'RETURN mode needs no accept chain');
});

test('ACCEPT mode: every ACCEPT (in mangle, it ends only mangle) leaves the accept bit set, for filter FORWARD’s hook', () => {
  const c = calc();
  const p = pod('ns', 'a', { ip4: 5, ip6: true });
  c.applyEvents([{ kind: 'Pod', op: 'upsert', object: p }]);
  for (const f of [4, 6] as const) {
    assert.deepEqual(chain(c, f, names.accept), ['-j MARK --set-xmark 0x10000/0x10000', '-j ACCEPT']);
    for (const [name, rules] of c.desired.chains[f]) {
      if (name === names.accept) continue;
      for (const line of text(rules)) {
        // Only the top chain's last rule accepts by itself, and only packets that carry the bit.
        if (line.endsWith('-j ACCEPT')) assert.equal(`${name} ${line}`, `${names.forward} -m mark --mark 0x10000/0x10000 -j ACCEPT`);
      }
    }
    assert.ok(chain(c, f, names.workloadCommon).includes(`-m conntrack --ctstate RELATED,ESTABLISHED -g ${names.accept}`));
    assert.ok(
      chain(c, f, names.fromWorkload(p.uid)).some((l) => l.endsWith(`-g ${names.accept}`) && l.startsWith('-d ')),
      'a pod reaching itself',
    );
  }
  // IPv6 neighbour discovery passes before the top chain clears the bits: it sets the bit too.
  assert.deepEqual(
    chain(c, 6, names.forward).slice(0, 4),
    [133, 134, 135, 136].map((t) => `-p ipv6-icmp -m icmp6 --icmpv6-type ${t} -g ${names.accept}`),
  );
});

test('addresses a local pod gives up are released once, for the dataplane to forget their flows; a pod that keeps its address releases nothing', () => {
  const c = calc();
  const gone = pod('ns', 'gone', { ip4: 5 });
  const moved = pod('ns', 'moved', { ip4: 6, ip6: false });
  const remote = pod('ns', 'remote', { ip4: 7, nodeName: 'node-b' });
  const done = pod('ns', 'done', { ip4: 8, ip6: false });
  c.applyEvents([gone, moved, remote, done].map((object) => ({ kind: 'Pod', op: 'upsert', object })));
  assert.deepEqual(c.takeReleasedAddresses(), [], 'new pods release nothing');
  // The same address handed to another pod in the same batch still releases it: the flows
  // belong to the pod that left.
  const heir = pod('ns', 'heir', { ip4: 5, ip6: false });
  c.applyEvents([
    { kind: 'Pod', op: 'delete', uid: gone.uid },
    { kind: 'Pod', op: 'upsert', object: heir },
    { kind: 'Pod', op: 'upsert', object: { ...moved, ips: ['10.244.1.9'] } },
    { kind: 'Pod', op: 'delete', uid: remote.uid },
    { kind: 'Pod', op: 'upsert', object: { ...done, phase: 'Succeeded' } },
  ]);
  assert.deepEqual(c.takeReleasedAddresses(), ['10.244.1.5', '10.244.1.6', '10.244.1.8', 'fd00::5']);
  assert.deepEqual(c.takeReleasedAddresses(), [], 'taken once');
  // Deleted and back in one batch (a relist), with the same address: nothing was released.
  c.applyEvents([
    { kind: 'Pod', op: 'delete', uid: heir.uid },
    { kind: 'Pod', op: 'upsert', object: heir },
  ]);
  assert.deepEqual(c.takeReleasedAddresses(), []);
});
