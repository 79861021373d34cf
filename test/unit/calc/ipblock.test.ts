// ipBlocks in calc: what a block with excepts costs (linear in the policy, never in the
// address space), and that the rules calc builds match exactly the addresses the policy names,
// checked by evaluating the desired rules and sets against addresses, block by block.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { makeNames } from '../../../src/calc/index.ts';
import type { DesiredDataplane, Match, Rule } from '../../../src/calc/index.ts';
import { cidrContains, cidrCovers, parseCidr } from '../../../src/model/cidr.ts';
import type { Cidr } from '../../../src/model/cidr.ts';
import { EMPTY, diff, newCalc, pod, policy, rng, scatteredV6, world } from './fixtures.ts';

const names = makeNames('cali');
const NS = [{ name: 'big', labels: {} }];

function build(spec: unknown) {
  const c = newCalc();
  c.applyEvents(diff(EMPTY, world([pod('big', 'p1', { ip4: 1 })], NS, [policy('big', 'p', spec)])));
  return c;
}

function totals(d: DesiredDataplane): { members: number; rules: number } {
  let members = 0;
  for (const s of d.sets.values()) members += s.members.size;
  let rules = 0;
  for (const f of [4, 6] as const) for (const name of [names.policyIngress('big/p'), names.policyEgress('big/p')]) rules += d.chains[f].get(name)?.length ?? 0;
  return { members, rules };
}

// ---- a tiny evaluator of policy chains: does some rule set the accept bit for a packet? ----

interface Packet {
  readonly family: 4 | 6;
  readonly peer: string; // the remote address: source for ingress, destination for egress
  readonly proto: 'TCP' | 'UDP';
  readonly port: number;
}

function inSet(d: DesiredDataplane, set: string, ip: string): boolean {
  const s = d.sets.get(set);
  assert.ok(s, `rule names a set calc does not hold: ${set}`);
  assert.equal(s.type, 'hash:net');
  for (const m of s.members) {
    const c = parseCidr(m.includes('/') ? m : `${m}/${m.includes(':') ? 128 : 32}`);
    assert.ok(!('error' in c), m);
    assert.ok(c.prefix > 0, `hash:net cannot hold ${m}`);
    if (cidrContains(c, ip)) return true;
  }
  return false;
}

function matches(d: DesiredDataplane, m: Match, p: Packet): boolean {
  switch (m.kind) {
    case 'set': {
      const hit = inSet(d, m.set, p.peer);
      return (m as { negate?: boolean }).negate === true ? !hit : hit;
    }
    case 'addr': {
      const c = parseCidr(m.cidr);
      assert.ok(!('error' in c));
      return cidrContains(c, p.peer);
    }
    case 'proto':
      return m.protocol === p.proto && (m.dports === undefined || m.dports.some((r) => r.from <= p.port && p.port <= r.to));
    default:
      assert.fail(`unexpected match in a policy chain: ${JSON.stringify(m)}`);
  }
}

/** The allowing rules pod p1 consults in a direction: its workload chain's own (merged peers)
 *  and those of the policy chains it jumps to. */
function allowingRules(d: DesiredDataplane, family: 4 | 6, direction: 'ingress' | 'egress'): Rule[] {
  const workload = d.chains[family].get(direction === 'ingress' ? names.toWorkload('big/p1') : names.fromWorkload('big/p1'));
  assert.ok(workload, `no ${direction} chain for p1`);
  const out: Rule[] = [];
  for (const r of workload) {
    if (r.action.kind === 'setMark' && r.action.value !== 0) out.push(r);
    else if (r.action.kind === 'jump' && r.action.chain !== names.workloadCommon) out.push(...d.chains[family].get(r.action.chain)!);
  }
  return out;
}

function allowed(d: DesiredDataplane, rules: readonly Rule[], p: Packet): boolean {
  return rules.some((r) => r.action.kind === 'setMark' && r.matches.every((m) => matches(d, m, p)));
}

// ---- tests ---------------------------------------------------------------------------------

describe('ipBlock cost', () => {
  test('::/0 except 15,000 scattered /128s costs set members and rules linear in the excepts', () => {
    const except = scatteredV6(15_000);
    const c = build({ podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: [{ ipBlock: { cidr: '::/0', except } }] }] });
    assert.deepEqual(c.policyReports()[0].errors, []);
    const { members, rules } = totals(c.desired);
    assert.ok(members <= except.length, `${members} set members for ${except.length} excepts`);
    assert.ok(rules <= 2, `${rules} policy rules for one ipBlock`);
  });

  test('a /0 with excepts needs no /0 anywhere, and a block with no excepts no set of its own', () => {
    const c = build({
      podSelector: {},
      policyTypes: ['Egress'],
      egress: [{ to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8'] } }, { ipBlock: { cidr: '::/0' } }] }],
    });
    for (const s of c.desired.sets.values()) for (const m of s.members) assert.ok(!m.endsWith('/0'), `${s.name} holds ${m}`);
    assert.deepEqual(
      allowingRules(c.desired, 6, 'egress').map((r) => r.matches),
      [[]],
      '::/0 alone is every IPv6 address: one rule with no match',
    );
  });

  test('plain blocks of one rule share one set; equal lists share it across policies', () => {
    const spec = {
      podSelector: {},
      policyTypes: ['Ingress'],
      ingress: [{ from: ['10.1.0.0/16', '10.2.0.0/16', '10.1.2.0/24', '10.3.0.0/16'].map((cidr) => ({ ipBlock: { cidr } })), ports: [{ port: 80 }] }],
    };
    const c = newCalc();
    c.applyEvents(diff(EMPTY, world([pod('big', 'p1', { ip4: 1 })], NS, [policy('big', 'p', spec), policy('big', 'q', spec)])));
    const v4 = allowingRules(c.desired, 4, 'ingress');
    assert.equal(v4.length, 1, 'one rule for both policies: their peers are one set');
    const sets = [...c.desired.sets.values()].filter((s) => s.family === 4);
    assert.equal(sets.length, 1);
    assert.deepEqual([...sets[0].members].sort(), ['10.1.0.0/16', '10.2.0.0/15'], 'nested dropped, neighbours merged');
  });
});

describe('ipBlock rules match exactly the addresses the policy names', () => {
  // A small universe per family, so random blocks overlap and nest often.
  const V4 = 10 << 24; // 10.0.0.0/22
  const v4 = (n: number) => `${(n >>> 24) & 255}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
  const v6 = (n: number) => `fd00::${n.toString(16)}`; // fd00::/118
  const addr = (family: 4 | 6, n: number) => (family === 4 ? v4(V4 + n) : v6(n));
  const prefixOf = (family: 4 | 6, bits: number) => (family === 4 ? 32 - bits : 128 - bits);

  interface Block {
    cidr: string;
    except: string[];
  }

  function randomBlock(r: () => number, family: 4 | 6): Block {
    // Now and then the whole family: the /0 case.
    if (r() < 0.08) {
      const all = family === 4 ? '0.0.0.0/0' : '::/0';
      const except = r() < 0.5 ? [] : [`${addr(family, Math.floor(r() * 1024))}/${prefixOf(family, Math.floor(r() * 8))}`];
      return { cidr: all, except };
    }
    const bits = 2 + Math.floor(r() * 8); // a block of 4..512 addresses
    const cidr = `${addr(family, Math.floor(r() * 1024))}/${prefixOf(family, bits)}`;
    const block = parseCidr(cidr) as Cidr;
    const except: string[] = [];
    const n = r() < 0.4 ? 0 : Math.floor(r() * 6);
    for (let k = 0; k < n; k++) {
      const eb = Math.floor(r() * bits); // strictly inside: fewer host bits than the block
      const e = `${addr(family, Math.floor(r() * 1024))}/${prefixOf(family, eb)}`;
      if (cidrCovers(block, parseCidr(e) as Cidr)) except.push(e);
    }
    return { cidr, except };
  }

  function inBlock(b: Block, ip: string): boolean {
    const c = parseCidr(b.cidr) as Cidr;
    return cidrContains(c, ip) && !b.except.some((e) => cidrContains(parseCidr(e) as Cidr, ip));
  }

  for (let seed = 1; seed <= 40; seed++) {
    test(`random overlapping blocks with excepts, seed ${seed}`, () => {
      const r = rng(seed);
      const rules: { blocks: Block[]; port: number | null }[] = [];
      for (let i = 0; i < 1 + Math.floor(r() * 3); i++) {
        const blocks: Block[] = [];
        for (let k = 0; k < 1 + Math.floor(r() * 5); k++) blocks.push(randomBlock(r, r() < 0.5 ? 4 : 6));
        rules.push({ blocks, port: r() < 0.5 ? null : 80 + Math.floor(r() * 2) });
      }
      const direction = r() < 0.5 ? 'ingress' : 'egress';
      const peerField = direction === 'ingress' ? 'from' : 'to';
      const spec = {
        podSelector: {},
        policyTypes: [direction === 'ingress' ? 'Ingress' : 'Egress'],
        [direction]: rules.map((x) => ({ [peerField]: x.blocks.map((b) => ({ ipBlock: b })), ...(x.port === null ? {} : { ports: [{ port: x.port }] }) })),
      };
      const c = build(spec);
      assert.deepEqual(c.policyReports()[0].errors, [], JSON.stringify(spec));
      for (const family of [4, 6] as const) {
        const chain = allowingRules(c.desired, family, direction);
        for (let n = 0; n < 1024; n += 1 + Math.floor(r() * 3)) {
          const ip = addr(family, n);
          for (const port of [80, 81]) {
            const want = rules.some((x) => (x.port === null || x.port === port) && x.blocks.some((b) => (parseCidr(b.cidr) as Cidr).family === family && inBlock(b, ip)));
            const got = allowed(c.desired, chain, { family, peer: ip, proto: 'TCP', port });
            assert.equal(got, want, `seed ${seed} ${direction} IPv${family} ${ip} port ${port}: spec ${JSON.stringify(spec)}`);
          }
        }
      }
    });
  }
});
