// The evaluator weir explain walks packets with: every Match and Action kind of calc's
// desired.ts, as netfilter gives them meaning, on small hand-built chains.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { DesiredSet, Match, Rule } from '../../../src/calc/index.ts';
import type { Packet } from '../../../src/explain/evaluate.ts';
import { EvaluationError, matchRule, walk } from '../../../src/explain/evaluate.ts';

const P: Packet = { family: 4, src: '10.0.1.5', dst: '10.0.2.7', protocol: 'TCP', dport: 80, ctstate: 'NEW', mark: 0, inIface: 'cni0', bridgePortIn: 'veth1' };
const set = (name: string, members: string[], type: DesiredSet['type'] = 'hash:net', family: 4 | 6 = 4): [string, DesiredSet] => [name, { name, family, type, members: new Set(members) }];
const SETS = new Map([
  set('peers', ['10.0.1.0/24', '10.9.9.9']),
  set('hosts', ['10.0.2.7']),
  set('ports', ['10.0.2.7,tcp:80', '10.0.2.7,udp:53'], 'hash:ip,port'),
  set('v6', ['fd00::/64'], 'hash:net', 6),
]);
const holds = (m: Match, p: Partial<Packet> = {}, mark = 0) => matchRule({ matches: [m], action: { kind: 'drop' } }, { ...P, ...p }, SETS, mark).matched;

describe('matches', () => {
  test('set: source or destination in a hash:net set, by prefix or by address; negate wants it absent', () => {
    assert.equal(holds({ kind: 'set', set: 'peers', dir: 'src' }), true, '10.0.1.5 is inside 10.0.1.0/24');
    assert.equal(holds({ kind: 'set', set: 'peers', dir: 'dst' }), false);
    assert.equal(holds({ kind: 'set', set: 'hosts', dir: 'dst' }), true, 'a bare address is a full-length prefix');
    assert.equal(holds({ kind: 'set', set: 'peers', dir: 'src' }, { src: '10.9.9.9' }), true);
    assert.equal(holds({ kind: 'set', set: 'peers', dir: 'src' }, { src: '10.0.3.1' }), false);
    assert.equal(holds({ kind: 'set', set: 'peers', dir: 'src', negate: true }), false);
    assert.equal(holds({ kind: 'set', set: 'peers', dir: 'src', negate: true }, { src: '10.0.3.1' }), true);
  });

  test('set: a set of the other family holds no address of this one', () => {
    assert.equal(holds({ kind: 'set', set: 'v6', dir: 'src' }), false);
    assert.equal(holds({ kind: 'set', set: 'v6', dir: 'src' }, { family: 6, src: 'fd00::5', dst: 'fd00::7' }), true);
  });

  test('set dst,dst: the destination address with the protocol and port, in a hash:ip,port set', () => {
    assert.equal(holds({ kind: 'set', set: 'ports', dir: 'dst,dst' }), true);
    assert.equal(holds({ kind: 'set', set: 'ports', dir: 'dst,dst' }, { dport: 81 }), false);
    assert.equal(holds({ kind: 'set', set: 'ports', dir: 'dst,dst' }, { protocol: 'UDP', dport: 53 }), true);
    assert.equal(holds({ kind: 'set', set: 'ports', dir: 'dst,dst' }, { protocol: 'UDP', dport: 80 }), false);
  });

  test('set: the lookup is recorded with the member asked and the member that holds it', () => {
    const r = matchRule(
      {
        matches: [
          { kind: 'set', set: 'peers', dir: 'src' },
          { kind: 'set', set: 'hosts', dir: 'src', negate: true },
        ],
        action: { kind: 'drop' },
      },
      P,
      SETS,
      0,
    );
    assert.equal(r.matched, true);
    assert.deepEqual(r.lookups, [
      { set: 'peers', dir: 'src', member: '10.0.1.5', found: true, by: '10.0.1.0/24', negate: false },
      { set: 'hosts', dir: 'src', member: '10.0.1.5', found: false, negate: true },
    ]);
  });

  test('set: a set the desired state lacks, or of the wrong type, is an error, not a miss', () => {
    assert.throws(() => holds({ kind: 'set', set: 'nope', dir: 'src' }), EvaluationError);
    assert.throws(() => holds({ kind: 'set', set: 'ports', dir: 'src' }), /hash:ip,port, looked up by address/);
    assert.throws(() => holds({ kind: 'set', set: 'peers', dir: 'dst,dst' }), /hash:net, looked up by address and port/);
  });

  test('addr: source or destination inside one prefix, /0 included, never across families', () => {
    assert.equal(holds({ kind: 'addr', dir: 'src', cidr: '10.0.1.0/28' }), true);
    assert.equal(holds({ kind: 'addr', dir: 'src', cidr: '10.0.1.8/29' }), false);
    assert.equal(holds({ kind: 'addr', dir: 'dst', cidr: '10.0.2.7/32' }), true);
    assert.equal(holds({ kind: 'addr', dir: 'dst', cidr: '0.0.0.0/0' }), true);
    assert.equal(holds({ kind: 'addr', dir: 'dst', cidr: '::/0' }), false);
  });

  test('proto: the protocol, and with ports one of the ranges', () => {
    assert.equal(holds({ kind: 'proto', protocol: 'TCP' }), true);
    assert.equal(holds({ kind: 'proto', protocol: 'UDP' }), false);
    assert.equal(holds({ kind: 'proto', protocol: 'SCTP' }, { protocol: 'SCTP' }), true);
    const ranges: Match = {
      kind: 'proto',
      protocol: 'TCP',
      dports: [
        { from: 22, to: 22 },
        { from: 80, to: 90 },
      ],
    };
    assert.equal(holds(ranges), true);
    assert.equal(holds(ranges, { dport: 90 }), true);
    assert.equal(holds(ranges, { dport: 91 }), false);
    assert.equal(holds(ranges, { dport: 23 }), false);
  });

  test('ctstate: one of the states listed', () => {
    assert.equal(holds({ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }), false);
    assert.equal(holds({ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }, { ctstate: 'ESTABLISHED' }), true);
    assert.equal(holds({ kind: 'ctstate', states: ['INVALID'] }), false);
    assert.equal(holds({ kind: 'ctstate', states: ['NEW'] }), true);
  });

  test('mark: the bits under the mask equal the value, other bits ignored', () => {
    const accept: Match = { kind: 'mark', value: 0x10000, mask: 0x10000 };
    assert.equal(holds(accept, {}, 0), false);
    assert.equal(holds(accept, {}, 0x10000), true);
    assert.equal(holds(accept, {}, 0x14000), true);
    assert.equal(holds({ kind: 'mark', value: 0, mask: 0x10000 }, {}, 0x4000), true, 'not yet allowed');
    assert.equal(holds({ kind: 'mark', value: 0, mask: 0x10000 }, {}, 0x10000), false, 'already allowed');
    assert.equal(holds({ kind: 'mark', value: 0x20000, mask: 0x30000 }, {}, 0x30000), false, 'every bit under the mask counts');
    assert.equal(holds({ kind: 'mark', value: 0x20000, mask: 0x30000 }, {}, 0x20000), true);
    assert.equal(holds({ kind: 'mark', value: 0x80000000, mask: 0x80000000 }, {}, 0x80000000), true, 'the top bit, unsigned');
  });

  test('icmp6: an ICMPv6 message of that type', () => {
    assert.equal(holds({ kind: 'icmp6', type: 135 }), false, 'TCP is no ICMPv6');
    assert.equal(holds({ kind: 'icmp6', type: 135 }, { family: 6, icmp6Type: 135 }), false, 'a TCP packet has no ICMPv6 type');
    assert.equal(holds({ kind: 'icmp6', type: 135 }, { family: 6, protocol: 'ICMPv6', icmp6Type: 135 }), true);
    assert.equal(holds({ kind: 'icmp6', type: 135 }, { family: 6, protocol: 'ICMPv6', icmp6Type: 128 }), false);
  });

  test('iface: the interface in or out; an unnamed one is none of the bridge', () => {
    assert.equal(holds({ kind: 'iface', dir: 'in', name: 'cni0' }), true);
    assert.equal(holds({ kind: 'iface', dir: 'out', name: 'cni0' }), false);
    assert.equal(holds({ kind: 'iface', dir: 'out', name: 'cni0' }, { outIface: 'cni0' }), true);
    assert.equal(holds({ kind: 'iface', dir: 'in', name: 'cni0' }, { inIface: undefined }), false);
  });

  test('bridgePortIn: the bridge port the packet entered through', () => {
    assert.equal(holds({ kind: 'bridgePortIn', port: 'veth1' }), true);
    assert.equal(holds({ kind: 'bridgePortIn', port: 'veth2' }), false);
    assert.equal(holds({ kind: 'bridgePortIn', port: 'veth1' }, { bridgePortIn: undefined }), false);
  });

  test('limit: a new connection finds a token; the rule says it was rate limited', () => {
    const r = matchRule({ matches: [{ kind: 'limit', name: 'cali-audit', perSecond: 1, burst: 2 }], action: { kind: 'drop' } }, P, SETS, 0);
    assert.deepEqual([r.matched, r.limited], [true, true]);
    assert.equal(matchRule({ matches: [], action: { kind: 'drop' } }, P, SETS, 0).limited, false);
  });

  test('every match of a rule must hold', () => {
    const rule: Rule = {
      matches: [
        { kind: 'set', set: 'peers', dir: 'src' },
        { kind: 'proto', protocol: 'UDP' },
      ],
      action: { kind: 'drop' },
    };
    assert.equal(matchRule(rule, P, SETS, 0).matched, false);
    assert.equal(matchRule(rule, { ...P, protocol: 'UDP' }, SETS, 0).matched, true);
  });
});

describe('actions and the walk', () => {
  const chains = (c: Record<string, Rule[]>) => new Map(Object.entries(c));
  const path = (w: ReturnType<typeof walk>) => w.hits.map((h) => `${h.chain}#${h.position}`);

  test('accept and drop end the walk at their rule', () => {
    const w = walk(
      chains({
        top: [
          { matches: [{ kind: 'proto', protocol: 'UDP' }], action: { kind: 'drop' } },
          { matches: [], action: { kind: 'accept' } },
          { matches: [], action: { kind: 'drop' } },
        ],
      }),
      'top',
      P,
      SETS,
    );
    assert.equal(w.verdict, 'accept');
    assert.deepEqual(path(w), ['top#2']);
    assert.equal(w.final?.position, 2);
    const d = walk(
      chains({
        top: [
          { matches: [], action: { kind: 'drop' }, comment: 'no' },
          { matches: [], action: { kind: 'accept' } },
        ],
      }),
      'top',
      P,
      SETS,
    );
    assert.deepEqual([d.verdict, d.final?.rule.comment], ['drop', 'no']);
  });

  test('the end of the top chain hands the packet back (verdict return)', () => {
    const w = walk(chains({ top: [{ matches: [{ kind: 'proto', protocol: 'UDP' }], action: { kind: 'drop' } }] }), 'top', P, SETS);
    assert.deepEqual([w.verdict, w.final, w.hits.length], ['return', undefined, 0]);
  });

  test('jump comes back to the rule after it; return and the end of a chain go back one level', () => {
    const w = walk(
      chains({
        top: [
          { matches: [], action: { kind: 'jump', chain: 'a' } },
          { matches: [], action: { kind: 'jump', chain: 'b' } },
          { matches: [{ kind: 'mark', value: 0x3, mask: 0x3 }], action: { kind: 'accept' } },
        ],
        a: [
          { matches: [], action: { kind: 'setMark', value: 0x1, mask: 0x1 } },
          { matches: [], action: { kind: 'return' } },
          { matches: [], action: { kind: 'drop' } },
        ],
        b: [{ matches: [], action: { kind: 'setMark', value: 0x2, mask: 0x2 } }],
      }),
      'top',
      P,
      SETS,
    );
    assert.equal(w.verdict, 'accept');
    assert.deepEqual(path(w), ['top#1', 'a#1', 'a#2', 'top#2', 'b#1', 'top#3']);
    assert.deepEqual(
      w.hits.map((h) => h.stack.join('>')),
      ['top', 'top>a', 'top>a', 'top', 'top>b', 'top'],
    );
  });

  test('goto leaves no way back through the chain that went: its end returns to whoever jumped there', () => {
    const w = walk(
      chains({
        top: [
          { matches: [], action: { kind: 'jump', chain: 'dispatch' } },
          { matches: [], action: { kind: 'drop' }, comment: 'after dispatch' },
        ],
        dispatch: [
          { matches: [], action: { kind: 'goto', chain: 'pod' } },
          { matches: [], action: { kind: 'accept' }, comment: 'never: goto does not come back' },
        ],
        pod: [{ matches: [], action: { kind: 'setMark', value: 0x10, mask: 0x10 } }],
      }),
      'top',
      P,
      SETS,
    );
    assert.deepEqual(path(w), ['top#1', 'dispatch#1', 'pod#1', 'top#2']);
    assert.equal(w.final?.rule.comment, 'after dispatch');
    assert.deepEqual(w.hits[2].stack, ['top', 'pod']);
  });

  test('setMark changes only the bits under its mask; a mark match sees the new mark', () => {
    const w = walk(
      chains({
        top: [
          { matches: [], action: { kind: 'setMark', value: 0x30000, mask: 0x30000 } },
          { matches: [], action: { kind: 'setMark', value: 0, mask: 0x10000 } },
          { matches: [{ kind: 'mark', value: 0x20000, mask: 0x30000 }], action: { kind: 'accept' } },
        ],
      }),
      'top',
      { ...P, mark: 0x4000 },
      SETS,
    );
    assert.equal(w.verdict, 'accept');
    assert.deepEqual(
      w.hits.map((h) => h.mark),
      [0x34000, 0x24000, 0x24000],
    );
    assert.equal(w.mark, 0x24000);
  });

  test('nflog logs the prefix and never ends the chain', () => {
    const w = walk(
      chains({
        top: [
          {
            matches: [
              { kind: 'ctstate', states: ['NEW'] },
              { kind: 'limit', name: 'x', perSecond: 1, burst: 2 },
            ],
            action: { kind: 'nflog', group: 77, prefix: 'weir:DI:abc', size: 128 },
          },
          { matches: [], action: { kind: 'drop' } },
        ],
      }),
      'top',
      P,
      SETS,
    );
    assert.deepEqual([w.verdict, w.final?.position, w.logged, w.hits[0].limited], ['drop', 2, ['weir:DI:abc'], true]);
  });

  test('a chain the desired state lacks, and a loop, are errors that say where', () => {
    assert.throws(() => walk(chains({ top: [{ matches: [], action: { kind: 'jump', chain: 'gone' } }] }), 'top', P, SETS), /top rule 1 goes to chain gone/);
    assert.throws(() => walk(chains({}), 'top', P, SETS), /the hook goes to chain top/);
    assert.throws(() => walk(chains({ top: [{ matches: [], action: { kind: 'jump', chain: 'top' } }] }), 'top', P, SETS), /nest deeper than 64 chains/);
    assert.throws(() => walk(chains({ top: [{ matches: [], action: { kind: 'goto', chain: 'top' } }] }), 'top', P, SETS), /a loop through top/);
  });
});
