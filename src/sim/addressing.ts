// The simulated cluster's addresses: the underlay's, each node's pod CIDRs and gateway, a pod's
// MAC, and the checks a cluster spec and a pod's addresses must pass before anything is made.

import { ConfigError } from '../errors.ts';
import { type Cidr, cidrContains, formatIp, parseCidr as parseAnyCidr, parseIp as parseAnyIp } from '../model/cidr.ts';
import type { Family } from '../model/types.ts';
import type { ClusterSpec, SimNode } from './cluster.ts';

export const UNDERLAY: Readonly<Record<Family, { net: string; len: number }>> = {
  4: { net: '172.31.0.', len: 24 },
  6: { net: 'fd00:172:31::', len: 64 },
};
/** The external host's address on the underlay; nodes count up from 1 below it. */
export const EXTERNAL_HOST = 200;

/** A node as the spec lays it out, before its namespace exists. */
export interface NodeLayout extends Omit<SimNode, 'netns'> {
  /** 1-based: its underlay host number and the suffix of its namespace. */
  readonly index: number;
  readonly cidrs: readonly Cidr[];
}

/** The nodes of a spec, laid out; a ConfigError naming every problem otherwise. */
export function layOutNodes(spec: ClusterSpec): NodeLayout[] {
  const problems: string[] = [];
  const names = new Set<string>();
  const nodes = spec.nodes.map((n, i): NodeLayout => {
    const index = i + 1;
    if (names.has(n.name)) problems.push(`node ${n.name}: duplicate name`);
    names.add(n.name);
    const cidrs: Cidr[] = [];
    for (const c of n.podCIDRs) {
      const cidr = parseCidr(c);
      if (!cidr) problems.push(`node ${n.name}: pod CIDR "${c}" is not a network address/prefix`);
      else if (cidrs.some((o) => o.family === cidr.family)) problems.push(`node ${n.name}: two IPv${cidr.family} pod CIDRs`);
      else cidrs.push(cidr);
    }
    return {
      name: n.name,
      index,
      podCIDRs: n.podCIDRs,
      cidrs,
      gateways: cidrs.map(firstHost),
      underlayIPs: [underlayIp(4, index), underlayIp(6, index)],
    };
  });
  if (nodes.length === 0) problems.push('a cluster needs at least one node');
  if (nodes.length >= EXTERNAL_HOST) problems.push(`at most ${EXTERNAL_HOST - 1} nodes`);
  for (const p of spec.ports ?? []) {
    if (!Number.isInteger(p) || p < 1 || p > 65535) problems.push(`port ${p} is not a TCP/UDP port`);
  }
  if (problems.length) throw new ConfigError(problems);
  return nodes;
}

/** What is wrong with a pod's addresses on `node` (undefined: no such node), given the
 *  addresses other pods hold. */
export function podAddressProblems(key: string, ips: readonly string[], node: NodeLayout | undefined, used: ReadonlySet<string>): string[] {
  const problems: string[] = [];
  if (ips.length === 0) problems.push(`pod ${key}: no IPs`);
  const families = new Set<Family>();
  for (const ip of ips) {
    const parsed = parseIp(ip);
    if (!parsed) {
      problems.push(`pod ${key}: "${ip}" is not an IP address`);
      continue;
    }
    if (families.has(parsed.family)) problems.push(`pod ${key}: two IPv${parsed.family} addresses`);
    families.add(parsed.family);
    if (used.has(ip)) problems.push(`pod ${key}: ${ip} belongs to another pod`);
    const cidr = node?.cidrs.find((c) => c.family === parsed.family);
    if (node && (!cidr || !cidrContains(cidr, ip) || firstHost(cidr) === ip)) {
      problems.push(`pod ${key}: ${ip} is not a pod address of node ${node.name} (${node.podCIDRs.join(', ')})`);
    }
  }
  return problems;
}

/** The pod CIDR of `node` that holds `ip` (checked by podAddressProblems before). */
export function cidrFor(node: NodeLayout, ip: string): Cidr {
  const cidr = node.cidrs.find((c) => cidrContains(c, ip));
  if (cidr === undefined) throw new ConfigError([`${ip} is in no pod CIDR of node ${node.name}`]);
  return cidr;
}

/** A network address/prefix (host bits zero), or null. */
function parseCidr(text: string): Cidr | null {
  const c = parseAnyCidr(text);
  return 'error' in c || parseIp(text.split('/')[0])?.value !== c.base ? null : c;
}

function parseIp(text: string): { family: Family; value: bigint } | null {
  const a = parseAnyIp(text);
  return 'error' in a ? null : a;
}

/** The first host address of a CIDR: Flannel puts it on cni0 and pods route through it. */
export function firstHost(cidr: Cidr): string {
  return formatIp(cidr.family, cidr.base + 1n);
}

export function underlayIp(family: Family, host: number): string {
  return UNDERLAY[family].net + String(host);
}

/** A MAC derived from the pod's address (as the CNI bridge plugin once did): a pod re-created
 *  with the same IP keeps its MAC, so neighbour entries cached by its peers stay valid. */
export function podMac(ips: readonly string[]): string {
  const ip = ips
    .map(parseIp)
    .filter((a) => a !== null)
    .sort((a, b) => a.family - b.family)[0];
  if (ip === undefined) throw new ConfigError([`no IP address among ${ips.join(', ')}`]);
  const low = Number(ip.value & 0xffffffffn);
  const bytes = [24, 16, 8, 0].map((s) => ((low >>> s) & 255).toString(16).padStart(2, '0'));
  return `0a:58:${bytes.join(':')}`;
}
