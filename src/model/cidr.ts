// Exact IPv4/IPv6 address and prefix arithmetic on bigint: parsing with precise errors,
// canonical text (RFC 5952 for IPv6), and the aggregation of prefixes into canonical sets.

import type { Family, PrefixSet } from './types.ts';

export interface Cidr {
  readonly family: Family;
  /** Network address: host bits are always zero. */
  readonly base: bigint;
  readonly prefix: number;
}

export interface IpAddress {
  readonly family: Family;
  readonly value: bigint;
}

export interface ParseFailure {
  readonly error: string;
}

const BITS: Readonly<Record<Family, number>> = { 4: 32, 6: 128 };

// size[prefix] = number of addresses in a prefix; netmask[prefix] keeps the network bits.
function tables(bits: number): { size: bigint[]; netmask: bigint[] } {
  const all = (1n << BigInt(bits)) - 1n;
  const size: bigint[] = [];
  const netmask: bigint[] = [];
  for (let p = 0; p <= bits; p++) {
    size.push(1n << BigInt(bits - p));
    netmask.push(all ^ ((1n << BigInt(bits - p)) - 1n));
  }
  return { size, netmask };
}
const TABLES: Readonly<Record<Family, { size: bigint[]; netmask: bigint[] }>> = { 4: tables(32), 6: tables(128) };

// ---- Parsing ---------------------------------------------------------------------------

function isDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

/** Dotted-quad to a 32-bit number, or a reason. Leading zeros are rejected: some tools read
 *  them as octal, so their meaning is ambiguous. */
function parseV4(s: string): number | string {
  let value = 0;
  let parts = 0;
  let start = 0;
  for (let i = 0; i <= s.length; i++) {
    if (i < s.length && s.charCodeAt(i) !== 46) continue;
    const part = s.slice(start, i);
    parts++;
    if (parts > 4) return 'expected 4 dot-separated decimal octets';
    if (part.length === 0) return 'empty octet';
    let n = 0;
    for (let j = 0; j < part.length; j++) {
      const c = part.charCodeAt(j);
      if (!isDigit(c)) return `octet ${JSON.stringify(part)} is not a decimal number`;
      n = n * 10 + (c - 48);
      if (n > 255) return `octet ${JSON.stringify(part)} is greater than 255`;
    }
    if (part.length > 1 && part.charCodeAt(0) === 48) return `octet ${JSON.stringify(part)} has a leading zero`;
    value = value * 256 + n;
    start = i + 1;
  }
  if (parts !== 4) return 'expected 4 dot-separated decimal octets';
  return value;
}

/** One to four hex digits, or -1. */
function parseHexGroup(s: string): number {
  if (s.length === 0 || s.length > 4) return -1;
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const h = hexValue(s.charCodeAt(i));
    if (h < 0) return -1;
    n = n * 16 + h;
  }
  return n;
}

/** Colon-hex groups (one "::" at most, optional trailing dotted quad) to 8 groups, or a reason.
 *  Plain text (every pod address the API server sends) takes the one-pass reader. */
function parseV6(s: string): number[] | string {
  return plainV6Groups(s) ?? readV6(s);
}

/** parseV6 for any text: split into parts, with a reason for whatever is refused. */
function readV6(s: string): number[] | string {
  if (s.includes('%')) return 'zone indexes ("%...") are not allowed';
  const dc = s.indexOf('::');
  if (dc >= 0 && s.indexOf('::', dc + 1) >= 0) return '"::" may appear only once';
  const head = dc >= 0 ? s.slice(0, dc) : s;
  const tail = dc >= 0 ? s.slice(dc + 2) : '';
  const headParts = head.length > 0 ? head.split(':') : [];
  const tailParts = tail.length > 0 ? tail.split(':') : [];
  if (dc < 0 && headParts.length === 0) return 'empty address';
  const headGroups: number[] = [];
  const tailGroups: number[] = [];
  const lists: [string[], number[]][] = [
    [headParts, headGroups],
    [tailParts, tailGroups],
  ];
  const lastParts = dc >= 0 ? tailParts : headParts;
  for (const [parts, out] of lists) {
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i];
      if (p.includes('.')) {
        if (parts !== lastParts || i !== parts.length - 1) return `embedded IPv4 address ${JSON.stringify(p)} must come last`;
        const v4 = parseV4(p);
        if (typeof v4 === 'string') return `embedded IPv4 address ${JSON.stringify(p)}: ${v4}`;
        out.push(Math.floor(v4 / 65536), v4 % 65536);
        continue;
      }
      const g = parseHexGroup(p);
      if (g < 0) return p.length === 0 ? 'empty group (a single ":" at the start or end?)' : `group ${JSON.stringify(p)} is not 1 to 4 hex digits`;
      out.push(g);
    }
  }
  const total = headGroups.length + tailGroups.length;
  if (dc < 0) {
    if (total !== 8) return `expected 8 groups, got ${total}`;
    return headGroups;
  }
  if (total > 7) return '"::" must stand for at least one zero group';
  return [...headGroups, ...new Array<number>(8 - total).fill(0), ...tailGroups];
}

/** The 8 groups of IPv6 text made of hex groups and at most one "::", read in one pass without
 *  substrings (a cold start reads every pod's address); undefined for anything else, which
 *  readV6 then reads, or refuses with its reason. */
function plainV6Groups(s: string): number[] | undefined {
  const g: number[] = [];
  let gap = -1;
  let i = 0;
  if (s.charCodeAt(0) === 58) {
    if (s.charCodeAt(1) !== 58) return undefined;
    gap = 0;
    i = 2;
  }
  while (i < s.length) {
    let value = 0;
    const start = i;
    for (let h: number; i < s.length && i - start < 5 && (h = hexValue(s.charCodeAt(i))) >= 0; i++) value = value * 16 + h;
    if (i === start || i - start > 4 || g.length === 8) return undefined;
    g.push(value);
    if (i === s.length) break;
    if (s.charCodeAt(i) !== 58 || ++i === s.length) return undefined;
    if (s.charCodeAt(i) === 58) {
      if (gap >= 0) return undefined;
      gap = g.length;
      i++;
    }
  }
  if (gap < 0) return g.length === 8 ? g : undefined;
  if (g.length > 7) return undefined;
  const tail = g.splice(gap);
  while (g.length + tail.length < 8) g.push(0);
  for (const x of tail) g.push(x);
  return g;
}

/** Parses an IPv4 or IPv6 address. IPv4-mapped IPv6 (::ffff:1.2.3.4) stays IPv6. */
export function parseIp(text: string): IpAddress | ParseFailure {
  if (text.includes(':')) {
    const g = parseV6(text);
    if (typeof g === 'string') return { error: `invalid IPv6 address ${JSON.stringify(text)}: ${g}` };
    let value = 0n;
    for (const x of g) value = (value << 16n) | BigInt(x);
    return { family: 6, value };
  }
  if (text.length === 0 || !isDigit(text.charCodeAt(0))) return { error: `${JSON.stringify(text)} is not an IPv4 or IPv6 address` };
  const v = parseV4(text);
  if (typeof v === 'string') return { error: `invalid IPv4 address ${JSON.stringify(text)}: ${v}` };
  return { family: 4, value: BigInt(v) };
}

/** Parses "address/prefix". The prefix is required; host bits are cleared (10.0.0.1/8 is 10.0.0.0/8). */
export function parseCidr(text: string): Cidr | ParseFailure {
  const slash = text.indexOf('/');
  if (slash < 0) return { error: `${JSON.stringify(text)} is not a CIDR: the prefix length ("/<bits>") is missing` };
  const ip = parseIp(text.slice(0, slash));
  if ('error' in ip) return { error: `invalid CIDR ${JSON.stringify(text)}: ${ip.error}` };
  const bits = BITS[ip.family];
  const p = text.slice(slash + 1);
  let prefix = p.length === 0 || p.length > 3 || (p.length > 1 && p.charCodeAt(0) === 48) ? -1 : 0;
  for (let i = 0; i < p.length && prefix >= 0; i++) {
    const c = p.charCodeAt(i);
    prefix = isDigit(c) ? prefix * 10 + (c - 48) : -1;
  }
  if (prefix < 0 || prefix > bits) {
    return { error: `invalid CIDR ${JSON.stringify(text)}: prefix length ${JSON.stringify(p)} must be a number from 0 to ${bits}` };
  }
  return { family: ip.family, base: ip.value & TABLES[ip.family].netmask[prefix], prefix };
}

// ---- Formatting ------------------------------------------------------------------------

export function formatIp(family: Family, value: bigint): string {
  if (family === 4) {
    const v = Number(value);
    return `${(v >>> 24) & 255}.${(v >>> 16) & 255}.${(v >>> 8) & 255}.${v & 255}`;
  }
  const g: number[] = [];
  for (let shift = 112n; shift >= 0n; shift -= 16n) g.push(Number((value >> shift) & 0xffffn));
  return formatIpv6Groups(g);
}

/** RFC 5952 text of an IPv6 address given as its eight 16-bit groups. */
export function formatIpv6Groups(g: readonly number[]): string {
  // IPv4-mapped addresses keep the dotted tail (RFC 5952 section 5; inet_ntop does the same).
  if (g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0xffff) {
    return `::ffff:${g[6] >> 8}.${g[6] & 255}.${g[7] >> 8}.${g[7] & 255}`;
  }
  // RFC 5952: compress the longest run (first on ties) of two or more zero groups.
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (g[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && g[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (from: number, to: number): string => {
    let out = '';
    for (let i = from; i < to; i++) out += i === from ? g[i].toString(16) : `:${g[i].toString(16)}`;
    return out;
  };
  if (bestStart < 0) return hex(0, 8);
  return `${hex(0, bestStart)}::${hex(bestStart + bestLen, 8)}`;
}

export function formatCidr(c: Cidr): string {
  return `${formatIp(c.family, c.base)}/${c.prefix}`;
}

/** Canonical text of an address (IPv6 lower-case and compressed per RFC 5952), or null if invalid. */
export function canonicalIp(text: string): string | null {
  // Every pod IP of the cluster passes here on a cold start: the text the API server sends is
  // almost always canonical already, and that is checked without BigInt arithmetic.
  if (CANONICAL_V4.test(text)) return text;
  if (text.includes(':')) {
    const g = parseV6(text);
    return typeof g === 'string' ? null : formatIpv6Groups(g);
  }
  const ip = parseIp(text);
  return 'error' in ip ? null : formatIp(ip.family, ip.value);
}

const OCTET = '(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])';
const CANONICAL_V4 = new RegExp(`^${OCTET}(?:\\.${OCTET}){3}$`);

/** Canonical text of a prefix (host bits cleared), or null if invalid. */
export function canonicalCidr(text: string): string | null {
  const c = parseCidr(text);
  return 'error' in c ? null : formatCidr(c);
}

export function isValidIp(text: string): boolean {
  return !('error' in parseIp(text));
}

// ---- Arithmetic ------------------------------------------------------------------------

function containsValue(c: Cidr, value: bigint): boolean {
  return (value & TABLES[c.family].netmask[c.prefix]) === c.base;
}

/** True when the address text is inside the prefix (false for another family or bad text). */
export function cidrContains(cidr: Cidr, ip: string): boolean {
  const a = parseIp(ip);
  return !('error' in a) && a.family === cidr.family && containsValue(cidr, a.value);
}

/** True when every address of inner is inside outer (same family). */
export function cidrCovers(outer: Cidr, inner: Cidr): boolean {
  return outer.family === inner.family && outer.prefix <= inner.prefix && containsValue(outer, inner.base);
}

function aligned(c: Cidr): Cidr {
  const base = c.base & TABLES[c.family].netmask[c.prefix];
  return base === c.base ? c : { family: c.family, base, prefix: c.prefix };
}

/** The minimal sorted list of disjoint aligned prefixes covering exactly the union of the
 *  given ones (one family): duplicates and nested prefixes fold into the larger, two halves
 *  into their parent, but never into a prefix shorter than `minPrefix`. Equal unions give equal
 *  lists. Cost: a sort plus linear work, never the address space. */
export function aggregateCidrs(cidrs: readonly Cidr[], minPrefix = 0): Cidr[] {
  if (cidrs.length === 0) return [];
  const family = cidrs[0].family;
  const { size, netmask } = TABLES[family];
  const sorted = cidrs.map(aligned).sort((x, y) => (x.base < y.base ? -1 : x.base > y.base ? 1 : x.prefix - y.prefix));
  const out: Cidr[] = [];
  let lastEnd = -1n;
  for (const c of sorted) {
    if (c.family !== family) throw new RangeError(`aggregateCidrs: IPv${c.family} prefix among IPv${family} ones`);
    // Aligned prefixes nest or are disjoint, and the larger sorts first: this one is inside.
    if (c.base <= lastEnd) continue;
    let cur = c;
    for (;;) {
      const top = out[out.length - 1];
      if (top === undefined || top.prefix !== cur.prefix || cur.prefix <= minPrefix) break;
      const parent = cur.prefix - 1;
      if ((top.base & netmask[parent]) !== top.base || cur.base !== top.base + size[cur.prefix]) break;
      out.pop();
      cur = { family, base: top.base, prefix: parent };
    }
    out.push(cur);
    lastEnd = cur.base + size[cur.prefix] - 1n;
  }
  return out;
}

/** A set of prefixes as calc holds it in one hash:net set: `cidrs` must come from
 *  aggregateCidrs, so that equal unions have equal keys. */
export function prefixSet(family: Family, cidrs: readonly Cidr[]): PrefixSet {
  const texts = cidrs.map(formatCidr);
  return { kind: 'prefixes', key: `net${family}|${texts.join(',')}`, family, cidrs: texts };
}
