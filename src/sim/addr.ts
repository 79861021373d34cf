// The little address arithmetic the simulated cluster needs: a pod CIDR's gateway (first host)
// and whether a pod IP lies inside its node's CIDR. Both families, as bigints.

import type { Family } from '../model/types.ts';

export interface Cidr {
  readonly family: Family;
  readonly network: bigint;
  readonly prefixLength: number;
}

export function parseIp(ip: string): { family: Family; value: bigint } | null {
  if (ip.includes(':')) {
    const value = parseV6(ip);
    return value === null ? null : { family: 6, value };
  }
  const parts = ip.split('.');
  if (parts.length !== 4 || !parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255)) return null;
  return { family: 4, value: parts.reduce((acc, p) => (acc << 8n) | BigInt(p), 0n) };
}

function parseV6(ip: string): bigint | null {
  const halves = ip.split('::');
  if (halves.length > 2) return null;
  const groups = (s: string) => (s === '' ? [] : s.split(':'));
  const head = groups(halves[0]);
  const tail = halves.length === 2 ? groups(halves[1]) : [];
  const missing = 8 - head.length - tail.length;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return null;
  const all = [...head, ...Array<string>(halves.length === 2 ? missing : 0).fill('0'), ...tail];
  if (!all.every((g) => /^[0-9a-fA-F]{1,4}$/.test(g))) return null;
  return all.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n);
}

export function formatIp(family: Family, value: bigint): string {
  if (family === 4) {
    return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 255n)).join('.');
  }
  const groups = [112n, 96n, 80n, 64n, 48n, 32n, 16n, 0n].map((s) => Number((value >> s) & 0xffffn));
  // RFC 5952: compress the longest run (length >= 2) of zero groups, the first one on ties.
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) [best, bestLen] = [i, j - i];
    i = j === i ? i + 1 : j;
  }
  const hex = (gs: number[]) => gs.map((g) => g.toString(16)).join(':');
  if (best < 0) return hex(groups);
  return `${hex(groups.slice(0, best))}::${hex(groups.slice(best + bestLen))}`;
}

/** Parses "10.244.1.0/24" or "fd00:10:244:1::/64"; host bits must be zero. */
export function parseCidr(cidr: string): Cidr | null {
  const [ip, len, extra] = cidr.split('/');
  if (extra !== undefined || len === undefined || !/^\d{1,3}$/.test(len)) return null;
  const addr = parseIp(ip);
  const prefixLength = Number(len);
  if (!addr || prefixLength > bits(addr.family)) return null;
  if ((addr.value & ~mask(addr.family, prefixLength)) !== 0n) return null;
  return { family: addr.family, network: addr.value, prefixLength };
}

export function cidrContains(cidr: Cidr, ip: string): boolean {
  const addr = parseIp(ip);
  return !!addr && addr.family === cidr.family && (addr.value & mask(cidr.family, cidr.prefixLength)) === cidr.network;
}

/** The first host address of a CIDR: Flannel puts it on cni0 and pods route through it. */
export function firstHost(cidr: Cidr): string {
  return formatIp(cidr.family, cidr.network + 1n);
}

function bits(family: Family): number {
  return family === 4 ? 32 : 128;
}

function mask(family: Family, prefixLength: number): bigint {
  const all = (1n << BigInt(bits(family))) - 1n;
  return (all << BigInt(bits(family) - prefixLength)) & all;
}

export function cidrText(cidr: Cidr): string {
  return `${formatIp(cidr.family, cidr.network)}/${cidr.prefixLength}`;
}
