import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { aggregateCidrs, canonicalCidr, canonicalIp, cidrContains, cidrCovers, formatCidr, formatIp, isValidIp, parseCidr, parseIp } from '../../../src/model/cidr.ts';
import type { Cidr } from '../../../src/model/cidr.ts';
import { rng } from '../../support/rng.ts';

function cidr(text: string): Cidr {
  const c = parseCidr(text);
  if ('error' in c) assert.fail(c.error);
  return c;
}

describe('parseCidr accepts valid prefixes and clears host bits', () => {
  const cases: { input: string; expected: string; family: 4 | 6 }[] = [
    { input: '10.0.0.0/8', expected: '10.0.0.0/8', family: 4 },
    { input: '10.0.0.1/8', expected: '10.0.0.0/8', family: 4 },
    { input: '192.168.1.77/28', expected: '192.168.1.64/28', family: 4 },
    { input: '1.2.3.4/32', expected: '1.2.3.4/32', family: 4 },
    { input: '255.255.255.255/0', expected: '0.0.0.0/0', family: 4 },
    { input: '0.0.0.0/0', expected: '0.0.0.0/0', family: 4 },
    { input: '::/0', expected: '::/0', family: 6 },
    { input: 'FE80::1/64', expected: 'fe80::/64', family: 6 },
    { input: '2001:DB8:0:0:0:0:0:1/128', expected: '2001:db8::1/128', family: 6 },
    { input: '2001:db8::ffff:1/100', expected: '2001:db8::f000:0/100', family: 6 },
    { input: '::ffff:1.2.3.4/128', expected: '::ffff:1.2.3.4/128', family: 6 },
    { input: '::ffff:10.0.0.0/104', expected: '::ffff:10.0.0.0/104', family: 6 },
    { input: 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/1', expected: '8000::/1', family: 6 },
  ];
  for (const c of cases) {
    it(c.input, () => {
      const parsed = cidr(c.input);
      assert.equal(parsed.family, c.family);
      assert.equal(formatCidr(parsed), c.expected);
      assert.equal(canonicalCidr(c.input), c.expected);
    });
  }
});

describe('parseCidr rejects garbage with a precise message', () => {
  const cases: { input: string; error: string }[] = [
    { input: '10.0.0.1', error: '"10.0.0.1" is not a CIDR: the prefix length ("/<bits>") is missing' },
    { input: 'fd00::1', error: '"fd00::1" is not a CIDR: the prefix length ("/<bits>") is missing' },
    { input: '', error: '"" is not a CIDR: the prefix length ("/<bits>") is missing' },
    { input: '10.0.0.0/33', error: 'invalid CIDR "10.0.0.0/33": prefix length "33" must be a number from 0 to 32' },
    { input: '::/129', error: 'invalid CIDR "::/129": prefix length "129" must be a number from 0 to 128' },
    { input: '10.0.0.0/', error: 'invalid CIDR "10.0.0.0/": prefix length "" must be a number from 0 to 32' },
    { input: '10.0.0.0/08', error: 'invalid CIDR "10.0.0.0/08": prefix length "08" must be a number from 0 to 32' },
    { input: '10.0.0.0/-1', error: 'invalid CIDR "10.0.0.0/-1": prefix length "-1" must be a number from 0 to 32' },
    { input: '10.0.0.0/8/9', error: 'invalid CIDR "10.0.0.0/8/9": prefix length "8/9" must be a number from 0 to 32' },
    { input: 'foo/8', error: 'invalid CIDR "foo/8": "foo" is not an IPv4 or IPv6 address' },
    { input: '10.0.300.0/24', error: 'invalid CIDR "10.0.300.0/24": invalid IPv4 address "10.0.300.0": octet "300" is greater than 255' },
    { input: '10.0.0/24', error: 'invalid CIDR "10.0.0/24": invalid IPv4 address "10.0.0": expected 4 dot-separated decimal octets' },
    { input: '10.0.0.0.0/24', error: 'invalid CIDR "10.0.0.0.0/24": invalid IPv4 address "10.0.0.0.0": expected 4 dot-separated decimal octets' },
    { input: '10..0.0/24', error: 'invalid CIDR "10..0.0/24": invalid IPv4 address "10..0.0": empty octet' },
    { input: '010.0.0.0/8', error: 'invalid CIDR "010.0.0.0/8": invalid IPv4 address "010.0.0.0": octet "010" has a leading zero' },
    { input: '10.0.0.x/8', error: 'invalid CIDR "10.0.0.x/8": invalid IPv4 address "10.0.0.x": octet "x" is not a decimal number' },
    { input: ' 10.0.0.0/8', error: 'invalid CIDR " 10.0.0.0/8": " 10.0.0.0" is not an IPv4 or IPv6 address' },
    { input: '1:2:3:4:5:6:7/64', error: 'invalid CIDR "1:2:3:4:5:6:7/64": invalid IPv6 address "1:2:3:4:5:6:7": expected 8 groups, got 7' },
    { input: '1:2:3:4:5:6:7:8:9/64', error: 'invalid CIDR "1:2:3:4:5:6:7:8:9/64": invalid IPv6 address "1:2:3:4:5:6:7:8:9": expected 8 groups, got 9' },
    { input: '1::2::3/64', error: 'invalid CIDR "1::2::3/64": invalid IPv6 address "1::2::3": "::" may appear only once' },
    { input: '1:2:3:4::5:6:7:8/64', error: 'invalid CIDR "1:2:3:4::5:6:7:8/64": invalid IPv6 address "1:2:3:4::5:6:7:8": "::" must stand for at least one zero group' },
    { input: ':1:2:3:4:5:6:7/64', error: 'invalid CIDR ":1:2:3:4:5:6:7/64": invalid IPv6 address ":1:2:3:4:5:6:7": empty group (a single ":" at the start or end?)' },
    { input: 'fd00::12345/64', error: 'invalid CIDR "fd00::12345/64": invalid IPv6 address "fd00::12345": group "12345" is not 1 to 4 hex digits' },
    { input: 'fd00::g/64', error: 'invalid CIDR "fd00::g/64": invalid IPv6 address "fd00::g": group "g" is not 1 to 4 hex digits' },
    { input: 'fe80::1%eth0/64', error: 'invalid CIDR "fe80::1%eth0/64": invalid IPv6 address "fe80::1%eth0": zone indexes ("%...") are not allowed' },
    { input: '1.2.3.4::/64', error: 'invalid CIDR "1.2.3.4::/64": invalid IPv6 address "1.2.3.4::": embedded IPv4 address "1.2.3.4" must come last' },
    { input: '::ffff:1.2.3/96', error: 'invalid CIDR "::ffff:1.2.3/96": invalid IPv6 address "::ffff:1.2.3": embedded IPv4 address "1.2.3": expected 4 dot-separated decimal octets' },
  ];
  for (const c of cases) {
    it(JSON.stringify(c.input), () => {
      assert.deepEqual(parseCidr(c.input), { error: c.error });
      assert.equal(canonicalCidr(c.input), null);
    });
  }
});

describe('canonicalIp', () => {
  const cases: { input: string; expected: string | null }[] = [
    { input: '10.1.2.3', expected: '10.1.2.3' },
    { input: '0.0.0.0', expected: '0.0.0.0' },
    { input: '255.255.255.255', expected: '255.255.255.255' },
    // RFC 5952 section 4 rules.
    { input: '2001:0db8:0000:0000:0000:0000:0002:0001', expected: '2001:db8::2:1' },
    { input: '2001:DB8::1', expected: '2001:db8::1' },
    { input: '2001:db8:0:1:1:1:1:1', expected: '2001:db8:0:1:1:1:1:1' },
    { input: '2001:0:0:1:0:0:0:1', expected: '2001:0:0:1::1' },
    { input: '2001:db8:0:0:1:0:0:1', expected: '2001:db8::1:0:0:1' },
    { input: '0:0:0:0:0:0:0:0', expected: '::' },
    { input: '0:0:0:0:0:0:0:1', expected: '::1' },
    { input: '1:0:0:0:0:0:0:0', expected: '1::' },
    { input: '1::2:0:0', expected: '1::2:0:0' },
    { input: '::ffff:0102:0304', expected: '::ffff:1.2.3.4' },
    { input: '::FFFF:192.168.0.1', expected: '::ffff:192.168.0.1' },
    { input: '64:ff9b::10.0.0.1', expected: '64:ff9b::a00:1' },
    { input: '1:2:3:4:5:6:7:8', expected: '1:2:3:4:5:6:7:8' },
    { input: 'fe80::1%eth0', expected: null },
    { input: '10.0.0.1/32', expected: null },
    // IPv4 that is not canonical dotted-quad text is refused, fast path or not.
    { input: '010.1.2.3', expected: null },
    { input: '10.1.2.256', expected: null },
    { input: '10.1.2.3 ', expected: null },
    { input: '10.01.2.3', expected: null },
    { input: '10.0.0', expected: null },
    { input: 'hello', expected: null },
    { input: '', expected: null },
    { input: ':', expected: null },
    { input: ':::', expected: null },
    { input: '1::2:', expected: null },
  ];
  for (const c of cases) {
    it(`${JSON.stringify(c.input)} -> ${JSON.stringify(c.expected)}`, () => {
      assert.equal(canonicalIp(c.input), c.expected);
      assert.equal(isValidIp(c.input), c.expected !== null);
    });
  }

  it('every IPv4 address is its own canonical text', () => {
    const rnd = rng(11);
    for (let n = 0; n < 5000; n++) {
      const octets = Array.from({ length: 4 }, () => (rnd() < 0.3 ? [0, 9, 10, 99, 100, 199, 200, 249, 250, 255][Math.floor(rnd() * 10)] : Math.floor(rnd() * 256)));
      const text = octets.join('.');
      assert.equal(canonicalIp(text), text);
    }
  });

  it('canonical text parses back to the same address', () => {
    const rnd = rng(7);
    for (let n = 0; n < 2000; n++) {
      // Mostly-zero groups exercise the compression rules.
      const groups = Array.from({ length: 8 }, () => (rnd() < 0.5 ? 0 : Math.floor(rnd() * 65536)));
      const text = groups.map((g) => g.toString(16)).join(':');
      const canon = canonicalIp(text);
      assert.ok(canon !== null, text);
      const a = parseIp(text);
      const b = parseIp(canon);
      assert.deepEqual(a, b, `${text} -> ${canon}`);
      assert.equal(canonicalIp(canon), canon);
      assert.ok(!canon.includes(':::'), canon);
    }
  });

  it('reads every spelling of an address as the address it spells: any "::", case and leading zeros', () => {
    const rnd = rng(13);
    for (let n = 0; n < 3000; n++) {
      const groups = Array.from({ length: 8 }, () => (rnd() < 0.5 ? 0 : Math.floor(rnd() * 65536)));
      const spelled = groups.map((g) => {
        const hex = rnd() < 0.3 ? g.toString(16).padStart(4, '0') : g.toString(16);
        return rnd() < 0.3 ? hex.toUpperCase() : hex;
      });
      // Any run of zero groups (or none) may be the one "::" stands for.
      const zeroRuns: [number, number][] = [];
      for (let i = 0; i < 8; i++) for (let j = i; j < 8 && groups[j] === 0; j++) zeroRuns.push([i, j + 1]);
      const run = zeroRuns.length > 0 && rnd() < 0.7 ? zeroRuns[Math.floor(rnd() * zeroRuns.length)] : undefined;
      const text = run === undefined ? spelled.join(':') : `${spelled.slice(0, run[0]).join(':')}::${spelled.slice(run[1]).join(':')}`;
      // The address as generated, not as any parser of cidr.ts reads it.
      const value = groups.reduce((v, g) => (v << 16n) | BigInt(g), 0n);
      assert.deepEqual(parseIp(text), { family: 6, value }, text);
      assert.equal(canonicalIp(text), formatIp(6, value), text);
    }
  });
});

describe('cidrContains and cidrCovers', () => {
  const contains: { cidr: string; ip: string; expected: boolean }[] = [
    { cidr: '10.0.0.0/8', ip: '10.255.255.255', expected: true },
    { cidr: '10.0.0.0/8', ip: '11.0.0.0', expected: false },
    { cidr: '0.0.0.0/0', ip: '1.2.3.4', expected: true },
    { cidr: '0.0.0.0/0', ip: '::1', expected: false },
    { cidr: '::/0', ip: '10.0.0.1', expected: false },
    { cidr: '::/0', ip: '::ffff:10.0.0.1', expected: true },
    { cidr: 'fd00::/8', ip: 'fdff::1', expected: true },
    { cidr: 'fd00::/8', ip: 'fe00::', expected: false },
    { cidr: '10.0.0.0/8', ip: 'garbage', expected: false },
  ];
  for (const c of contains) {
    it(`${c.cidr} ${c.expected ? 'contains' : 'does not contain'} ${c.ip}`, () => {
      assert.equal(cidrContains(cidr(c.cidr), c.ip), c.expected);
    });
  }
  const covers: { outer: string; inner: string; expected: boolean }[] = [
    { outer: '10.0.0.0/8', inner: '10.1.0.0/16', expected: true },
    { outer: '10.0.0.0/8', inner: '10.0.0.0/8', expected: true },
    { outer: '10.1.0.0/16', inner: '10.0.0.0/8', expected: false },
    { outer: '10.0.0.0/8', inner: '11.0.0.0/16', expected: false },
    { outer: '0.0.0.0/0', inner: '::/0', expected: false },
  ];
  for (const c of covers) {
    it(`${c.outer} ${c.expected ? 'covers' : 'does not cover'} ${c.inner}`, () => {
      assert.equal(cidrCovers(cidr(c.outer), cidr(c.inner)), c.expected);
    });
  }
});

describe('aggregateCidrs', () => {
  const agg = (cidrs: string[], minPrefix?: number) => aggregateCidrs(cidrs.map(cidr), minPrefix).map(formatCidr);
  const cases: { name: string; input: string[]; minPrefix?: number; expected: string[] }[] = [
    { name: 'empty', input: [], expected: [] },
    { name: 'one prefix, host bits cleared', input: ['10.0.0.1/8'], expected: ['10.0.0.0/8'] },
    { name: 'sorted by address', input: ['10.2.0.0/16', '10.1.0.0/16', '9.0.0.0/8'], expected: ['9.0.0.0/8', '10.1.0.0/16', '10.2.0.0/16'] },
    { name: 'duplicates', input: ['10.0.0.1/32', '10.0.0.1/32'], expected: ['10.0.0.1/32'] },
    { name: 'nested prefixes fold into the larger', input: ['10.0.0.16/28', '10.0.0.0/24', '10.0.0.200/32'], expected: ['10.0.0.0/24'] },
    { name: 'two halves merge into their parent', input: ['10.0.0.128/25', '10.0.0.0/25'], expected: ['10.0.0.0/24'] },
    { name: 'neighbours that are not halves stay apart', input: ['10.0.0.64/26', '10.0.0.128/26'], expected: ['10.0.0.64/26', '10.0.0.128/26'] },
    {
      name: 'merging cascades',
      input: ['10.0.0.0/32', '10.0.0.1/32', '10.0.0.2/31', '10.0.0.4/30', '10.0.0.8/29'],
      expected: ['10.0.0.0/28'],
    },
    { name: 'up to the whole space', input: ['0.0.0.0/1', '128.0.0.0/1'], expected: ['0.0.0.0/0'] },
    { name: 'but never shorter than minPrefix', input: ['0.0.0.0/1', '128.0.0.0/1'], minPrefix: 1, expected: ['0.0.0.0/1', '128.0.0.0/1'] },
    { name: 'minPrefix stops only the last step', input: ['10.0.0.0/26', '10.0.0.64/26', '10.0.0.128/25'], minPrefix: 25, expected: ['10.0.0.0/25', '10.0.0.128/25'] },
    { name: 'IPv6', input: ['fd00::3/128', 'fd00::2/128', 'fd00::/127', 'fe80::/10'], expected: ['fd00::/126', 'fe80::/10'] },
  ];
  for (const c of cases) {
    it(c.name, () => {
      assert.deepEqual(agg(c.input, c.minPrefix), c.expected);
    });
  }

  // Reference: membership of every address of a small universe, then the greedy
  // range-to-prefix cover (largest aligned block first), which is the unique minimal one.
  const UNIVERSE_BASE = 10 << 24; // 10.0.0.0/22
  const UNIVERSE_SIZE = 1024;
  function v4(n: number): string {
    return `${(n >>> 24) & 255}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
  }
  function referenceCover(member: boolean[]): string[] {
    const out: string[] = [];
    for (let i = 0; i < UNIVERSE_SIZE; ) {
      if (!member[i]) {
        i++;
        continue;
      }
      let size = UNIVERSE_SIZE;
      while (size > 1 && (i % size !== 0 || !member.slice(i, i + size).every(Boolean))) size /= 2;
      out.push(`${v4(UNIVERSE_BASE + i)}/${32 - Math.log2(size)}`);
      i += size;
    }
    return out;
  }

  it('equals the minimal cover of the union on random prefixes (brute-force reference)', () => {
    for (let seed = 1; seed <= 400; seed++) {
      const rnd = rng(seed);
      const input: string[] = [];
      const n = Math.floor(rnd() * 14);
      for (let k = 0; k < n; k++) input.push(`${v4(UNIVERSE_BASE + Math.floor(rnd() * UNIVERSE_SIZE))}/${23 + Math.floor(rnd() * 10)}`);
      const parsed = input.map(cidr);
      const member: boolean[] = [];
      for (let i = 0; i < UNIVERSE_SIZE; i++) member.push(parsed.some((c) => cidrContains(c, v4(UNIVERSE_BASE + i))));
      assert.deepEqual(agg(input), referenceCover(member), `seed ${seed}: ${input.join(' ')}`);
    }
  });

  it('takes time linear in its input: 100,000 scattered IPv6 hosts', () => {
    const rnd = rng(7);
    const hex = (): string => Math.floor(rnd() * 65536).toString(16);
    const input: Cidr[] = [];
    for (let k = 0; k < 100_000; k++) input.push(cidr(`${hex()}:${hex()}:${hex()}::${hex()}/128`));
    const out = aggregateCidrs(input);
    const end = (c: Cidr): bigint => c.base + (1n << BigInt(128 - c.prefix));
    for (let i = 1; i < out.length; i++) assert.ok(end(out[i - 1]) <= out[i].base, `overlap or disorder at ${i}`);
    assert.ok(out.length <= input.length);
  });
});
