// SCTP through calc and the renderer. The test kernel has no SCTP sockets, so SCTP cannot be
// proved with packets; this pins the exact iptables and ipset text instead.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { DesiredDataplane, DesiredSet, Rule } from '../../../src/calc/index.ts';
import { makeNames } from '../../../src/calc/index.ts';
import { renderChain, setAdd, setCreate } from '../../../src/dataplane/render.ts';
import type { Family, Namespace } from '../../../src/model/types.ts';
import { EMPTY, diff, newCalc, pod, policy, world } from './fixtures.ts';

const names = makeNames('cali');
const MARK = '-j MARK --set-xmark 0x10000/0x10000';
const NS: Namespace[] = [{ name: 'shop', labels: {} }];

// db (this node) has "assoc" as SCTP 3868 and as TCP 5000; db2 (other node) as SCTP 3869;
// web has "assoc" only as TCP, so an SCTP named port must never resolve to it.
const PODS = [
  pod('shop', 'db', {
    labels: { app: 'db' },
    ip4: 1,
    ports: [
      { name: 'assoc', port: 3868, protocol: 'SCTP' },
      { name: 'assoc', port: 5000, protocol: 'TCP' },
    ],
  }),
  pod('shop', 'db2', { labels: { app: 'db' }, ip4: 2, nodeName: 'node-b', ports: [{ name: 'assoc', port: 3869, protocol: 'SCTP' }] }),
  pod('shop', 'web', { labels: { app: 'web' }, ip4: 3, ports: [{ name: 'assoc', port: 7000, protocol: 'TCP' }] }),
];

const SPEC = {
  podSelector: { matchLabels: { app: 'db' } },
  policyTypes: ['Ingress', 'Egress'],
  ingress: [
    {
      ports: [
        { protocol: 'SCTP', port: 9000, endPort: 9010 },
        { protocol: 'SCTP', port: 3868 },
      ],
    },
    { ports: [{ protocol: 'SCTP' }] },
    { from: [{ podSelector: { matchLabels: { app: 'web' } } }], ports: [{ protocol: 'SCTP', port: 'assoc' }] },
  ],
  egress: [{ to: [{ podSelector: {} }], ports: [{ protocol: 'SCTP', port: 'assoc' }] }],
};

function compile(): DesiredDataplane {
  const calc = newCalc();
  calc.applyEvents(diff(EMPTY, world(PODS, NS, [policy('shop', 'sctp', SPEC)])));
  return calc.desired;
}

/** Renders a chain and checks every line is `-A chain`, our hashed comment, then the body;
 *  returns the bodies so the tests can compare them exactly. */
function bodies(chain: string, rules: readonly Rule[], comments: readonly string[]): string[] {
  const { lines, hashes } = renderChain(chain, rules);
  assert.equal(hashes.length, lines.length);
  return lines.map((line, i) => {
    const head = `-A ${chain} -m comment --comment "weir:${hashes[i]} ${comments[i]}" `;
    assert.ok(line.startsWith(head), `line ${i}: ${line}\n  does not start with ${head}`);
    return line.slice(head.length);
  });
}

/** The set a chain's rules reference with the given direction (exactly one). */
function usedSet(d: DesiredDataplane, rules: readonly Rule[], dir: 'src' | 'dst,dst'): DesiredSet {
  const used = new Set(rules.flatMap((r) => r.matches.flatMap((m) => (m.kind === 'set' && m.dir === dir ? [m.set] : []))));
  assert.equal(used.size, 1, `one ${dir} set referenced, got ${[...used].join(', ')}`);
  const set = d.sets.get([...used][0]);
  assert.ok(set, `set ${[...used][0]} exists`);
  return set;
}

function chainRules(d: DesiredDataplane, family: Family, chain: string): readonly Rule[] {
  const rules = d.chains[family].get(chain);
  assert.ok(rules, `v${family} chain ${chain} exists`);
  return rules;
}

const ip = (family: Family, n: number, node: 1 | 2 = 1) => (family === 4 ? `10.244.${node}.${n}` : `fd00::${n}`);

describe('SCTP rules render to -p sctp with sctp: named-port members', () => {
  const d = compile();

  for (const family of [4, 6] as const) {
    test(`ingress: numeric SCTP ports, every SCTP port, and a named SCTP port resolved on the selected pods (v${family})`, () => {
      const chain = names.policyIngress('shop/sctp');
      const rules = chainRules(d, family, chain);
      const named = usedSet(d, rules, 'dst,dst');
      const web = usedSet(d, rules, 'src');
      assert.equal(named.type, 'hash:ip,port');
      assert.equal(named.family, family);
      // Protocol is part of the name match: db's TCP "assoc" (5000) and web's TCP one are not members.
      assert.deepEqual([...named.members].sort(), [`${ip(family, 1)},sctp:3868`, `${ip(family, 2, 2)},sctp:3869`].sort());
      assert.deepEqual([...web.members], [ip(family, 3)]);
      // Rules of ports alone merge into db's own chain; the named-port rule stays in the policy's.
      assert.deepEqual(bodies(chain, rules, ['shop/sctp ingress rule 2']), [`-m set --match-set ${web.name} src -p sctp -m set --match-set ${named.name} dst,dst ${MARK}`]);
      const merged = chainRules(d, family, names.toWorkload('shop/db')).filter((r) => r.comment === 'merged peers of ingress policies');
      assert.deepEqual(bodies('x', merged, ['merged peers of ingress policies', 'merged peers of ingress policies']), [`-p sctp -m multiport --dports 3868,9000:9010 ${MARK}`, `-p sctp ${MARK}`]);
    });

    test(`egress: a named SCTP port resolves on each destination pod (v${family})`, () => {
      const chain = names.policyEgress('shop/sctp');
      const rules = chainRules(d, family, chain);
      const dests = usedSet(d, rules, 'dst,dst');
      assert.equal(dests.type, 'hash:ip,port');
      // Destinations are every pod of shop; web has no SCTP "assoc", so it adds nothing.
      assert.deepEqual([...dests.members].sort(), [`${ip(family, 1)},sctp:3868`, `${ip(family, 2, 2)},sctp:3869`].sort());
      assert.notEqual(dests.name, usedSet(d, chainRules(d, family, names.policyIngress('shop/sctp')), 'dst,dst').name);
      assert.deepEqual(bodies(chain, rules, ['shop/sctp egress rule 0']), [`-p sctp -m set --match-set ${dests.name} dst,dst ${MARK}`]);
    });
  }

  test('the named SCTP port set is created as hash:ip,port with sctp: members in ipset restore text', () => {
    for (const [family, inet] of [
      [4, 'inet'],
      [6, 'inet6'],
    ] as const) {
      const named = usedSet(d, chainRules(d, family, names.policyIngress('shop/sctp')), 'dst,dst');
      assert.equal(setCreate(named.name, named.type, named.family, 1024), `create ${named.name} hash:ip,port family ${inet} maxelem 1024 comment -exist`);
      assert.deepEqual(
        [...named.members].map((m) => setAdd(named.name, m)).sort(),
        [`add ${named.name} ${ip(family, 1)},sctp:3868 -exist`, `add ${named.name} ${ip(family, 2, 2)},sctp:3869 -exist`].sort(),
      );
    }
  });

  test('an SCTP named port that no pod has as SCTP leaves an empty set, not an open port', () => {
    const calc = newCalc();
    const spec = { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ protocol: 'SCTP', port: 'assoc' }] }] };
    calc.applyEvents(diff(EMPTY, world(PODS, NS, [policy('shop', 'web-sctp', spec)])));
    const chain = names.policyIngress('shop/web-sctp');
    const rules = chainRules(calc.desired, 4, chain);
    const named = usedSet(calc.desired, rules, 'dst,dst');
    assert.equal(named.members.size, 0, 'web has "assoc" only as TCP');
    assert.deepEqual(bodies(chain, rules, ['shop/web-sctp ingress rule 0']), [`-p sctp -m set --match-set ${named.name} dst,dst ${MARK}`]);
  });
});
