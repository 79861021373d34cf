// The fewest conntrack deletions that take exactly the denied connections of a listing. Every
// deletion walks the whole table, so connections are taken by their destination, their source
// or their pair when every listed connection of that group is denied, and by their key only
// when the group also holds one that stays. Pure.

import type { ConnectionFilter, ConnectionKey } from '../dataplane/conntrack.ts';

export interface JudgedConnection {
  readonly key: ConnectionKey;
  /** False for one that stays: allowed, not judged (no opted-in end), or the node's own. */
  readonly denied: boolean;
}

/** The filters for one family's listing, in the order of the denied keys. A key goes by the
 *  larger of its destination's and its source's groups when both are wholly denied. */
export function deletionFilters(listing: readonly JudgedConnection[]): ConnectionFilter[] {
  const kept = { dst: new Set<string>(), src: new Set<string>(), pair: new Set<string>() };
  const deniedIn = new Map<string, number>();
  const count = (id: string) => deniedIn.set(id, (deniedIn.get(id) ?? 0) + 1);
  for (const { key: k, denied } of listing) {
    const [dst, src, pair] = groupIds(k);
    if (denied) {
      count(dst);
      count(src);
      continue;
    }
    kept.dst.add(dst);
    kept.src.add(src);
    kept.pair.add(pair);
  }
  const out = new Map<string, ConnectionFilter>();
  for (const { key: k, denied } of listing) {
    if (!denied) continue;
    const [dst, src, pair] = groupIds(k);
    const base = { family: k.family, protocol: k.protocol };
    const byDst = !kept.dst.has(dst) ? (deniedIn.get(dst) ?? 0) : -1;
    const bySrc = !kept.src.has(src) ? (deniedIn.get(src) ?? 0) : -1;
    const [id, filter]: [string, ConnectionFilter] =
      byDst >= 0 && byDst >= bySrc
        ? [dst, { ...base, dst: k.dst }]
        : bySrc >= 0
          ? [src, { ...base, src: k.src }]
          : !kept.pair.has(pair)
            ? [pair, { ...base, src: k.src, dst: k.dst }]
            : [`${pair}:${k.dport}`, { ...base, src: k.src, dst: k.dst, dport: k.dport }];
    if (!out.has(id)) out.set(id, filter);
  }
  return [...out.values()];
}

/** The ids of a key's destination, source and pair groups. */
function groupIds(k: ConnectionKey): [string, string, string] {
  return [`${k.protocol} > ${k.dst}`, `${k.protocol} ${k.src} >`, `${k.protocol} ${k.src} > ${k.dst}`];
}

/** A filter in words, for logs. */
export function filterText(f: ConnectionFilter): string {
  return `${f.protocol} ${f.src ?? '*'} -> ${f.dst ?? '*'}${f.dport !== undefined ? `:${f.dport}` : ''}`;
}
