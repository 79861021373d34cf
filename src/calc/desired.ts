// The desired dataplane: what calc computes and dataplane makes the kernel hold.
// Structured records only; iptables/ipset syntax is written by dataplane/render.ts alone.

import type { Family, Protocol } from '../model/types.ts';

/** hash:net holds addresses and prefixes; hash:ip,port holds "ip,proto:port" members. */
export type SetType = 'hash:net' | 'hash:ip,port';

/** Read-only member view (a ReadonlySet fits; calc serves it from its reference counts). */
export interface Members extends Iterable<string> {
  has(member: string): boolean;
  readonly size: number;
}

export interface DesiredSet {
  readonly name: string;
  readonly family: Family;
  readonly type: SetType;
  /** Canonical member text in the form the kernel prints it, one kernel entry each:
   *  "10.0.0.0/8", "10.1.2.3" (a /32 too, see netMember), "10.1.2.3,tcp:8080", "fd00::1,udp:53". */
  readonly members: Members;
}

/** A hash:net member as the kernel prints it: a full-length prefix is the bare address. */
export function netMember(prefix: string): string {
  if (prefix.endsWith('/32') && !prefix.includes(':')) return prefix.slice(0, -3);
  if (prefix.endsWith('/128') && prefix.includes(':')) return prefix.slice(0, -4);
  return prefix;
}

export interface PortRange {
  readonly from: number;
  /** Equal to from for a single port. */
  readonly to: number;
}

export type Match =
  /** Membership of the source or destination in a set; dst,dst for hash:ip,port sets.
   *  negate: not a member (an ipBlock's excepts). */
  | { readonly kind: 'set'; readonly set: string; readonly dir: 'src' | 'dst' | 'dst,dst'; readonly negate?: boolean }
  /** Source or destination address within one prefix. */
  | { readonly kind: 'addr'; readonly dir: 'src' | 'dst'; readonly cidr: string }
  /** A protocol, optionally with destination port ranges. */
  | { readonly kind: 'proto'; readonly protocol: Protocol; readonly dports?: readonly PortRange[] }
  | { readonly kind: 'ctstate'; readonly states: readonly ('RELATED' | 'ESTABLISHED' | 'INVALID' | 'NEW')[] }
  /** Packet mark bits under mask equal value. */
  | { readonly kind: 'mark'; readonly value: number; readonly mask: number }
  /** An ICMPv6 message type (IPv6 tables only). */
  | { readonly kind: 'icmp6'; readonly type: number }
  /** The interface a packet came in on or goes out through (for bridged pods: the bridge). */
  | { readonly kind: 'iface'; readonly dir: 'in' | 'out'; readonly name: string }
  /** The bridge port a packet entered through (br_netfilter): binds a pod's address to its veth. */
  | { readonly kind: 'bridgePortIn'; readonly port: string }
  /** The audit rules' kernel-side rate limit. At most `perSecond` matches a second on average,
   *  `burst` at once, in one bucket per node shared by every rule with the same `name` (per
   *  family), so that a flood cannot overwhelm the agent; then, with `perSource`, in one bucket
   *  per source address, so that one noisy source cannot spend it for the others. */
  | { readonly kind: 'limit'; readonly name: string; readonly perSecond: number; readonly burst: number; readonly perSource?: SourceLimit };

/** A bucket per source address (the whole address, in both families), shared by every rule
 *  with the same `name`, in a table of at most `tableMax` addresses, each forgotten `expireMs`
 *  after its last packet. The kernel drops a packet whose address a full table cannot take:
 *  whoever builds one sizes it so that it never fills (calc/config.ts, auditLimit). */
export interface SourceLimit {
  readonly name: string;
  readonly perSecond: number;
  readonly burst: number;
  readonly tableMax: number;
  readonly expireMs: number;
}

export type Action =
  | { readonly kind: 'accept' }
  | { readonly kind: 'drop' }
  | { readonly kind: 'return' }
  | { readonly kind: 'jump'; readonly chain: string }
  | { readonly kind: 'goto'; readonly chain: string }
  /** Set the mark bits under mask to value. */
  | { readonly kind: 'setMark'; readonly value: number; readonly mask: number }
  /** Copy the packet's headers to an NFLOG group for the audit log; never ends the chain.
   *  `prefix` (at most 63 characters of [A-Za-z0-9:_-]) names what the rule means. */
  | { readonly kind: 'nflog'; readonly group: number; readonly prefix: string; readonly size: number };

export interface Rule {
  readonly matches: readonly Match[];
  readonly action: Action;
  /** Human text kept in the rule comment next to its hash, e.g. "policy ns/name ingress rule 0". */
  readonly comment?: string;
}

export interface DesiredChains {
  /** Chain name -> rules, for one family's filter table. Includes the top chain, not the hook. */
  readonly chains: ReadonlyMap<string, readonly Rule[]>;
}

/** What one batch of model changes dirtied. Coalesce by union; apply only these. */
export interface Dirty {
  /** Set name -> members whose presence may have changed, or 'all' (created, deleted or rebuilt). */
  readonly sets: Map<string, Set<string> | 'all'>;
  /** Chain names per family whose rules may have changed (including created or deleted). */
  readonly chains: { readonly 4: Set<string>; readonly 6: Set<string> };
}

export function emptyDirty(): Dirty {
  return { sets: new Map(), chains: { 4: new Set(), 6: new Set() } };
}

export function isDirtyEmpty(d: Dirty): boolean {
  return d.sets.size === 0 && d.chains[4].size === 0 && d.chains[6].size === 0;
}

/** Union `from` into `into` (mutates `into`). */
export function mergeDirty(into: Dirty, from: Dirty): void {
  for (const [name, members] of from.sets) {
    const cur = into.sets.get(name);
    if (members === 'all' || cur === 'all') into.sets.set(name, 'all');
    else if (cur === undefined) into.sets.set(name, new Set(members));
    else for (const m of members) cur.add(m);
  }
  for (const f of [4, 6] as const) for (const c of from.chains[f]) into.chains[f].add(c);
}

/** A read-only view of the whole desired dataplane, owned by calc. */
export interface DesiredDataplane {
  readonly sets: ReadonlyMap<string, DesiredSet>;
  readonly chains: { readonly 4: ReadonlyMap<string, readonly Rule[]>; readonly 6: ReadonlyMap<string, readonly Rule[]> };
  /** The chain the FORWARD hook jumps to (e.g. cali-FORWARD). */
  readonly topChain: string;
}
