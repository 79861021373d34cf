// The simulated cluster's plumbing, as `ip -batch` lines and sysctls: the underlay switch,
// each node's cni0 bridge and host-gw routes, the external host, and a pod's veth.

import { PreconditionError } from '../errors.ts';
import { formatCidr } from '../model/cidr.ts';
import { cidrFor, EXTERNAL_HOST, firstHost, type NodeLayout, podMac, UNDERLAY, underlayIp } from './addressing.ts';
import { inNs, sh } from './netns.ts';

// Set before any interface exists in a namespace, so that every interface inherits it.
export const NO_DAD = ['net.ipv6.conf.all.accept_dad=0', 'net.ipv6.conf.default.accept_dad=0'];
export const FORWARDING = ['net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1', 'net.ipv6.conf.default.forwarding=1'];

export async function sysctl(ns: string, settings: readonly string[]): Promise<void> {
  await inNs(ns, 'sysctl', ['-q', '-w', ...settings]);
}

/** br_netfilter's switches are per network namespace (Linux >= 5.3). They only exist inside
 *  a namespace when the module is loaded and per-netns, so a missing key is a precondition. */
export async function setBridgeNetfilter(ns: string, on: boolean): Promise<void> {
  const v = on ? 1 : 0;
  try {
    await sysctl(ns, [`net.bridge.bridge-nf-call-iptables=${v}`, `net.bridge.bridge-nf-call-ip6tables=${v}`]);
  } catch (err) {
    throw new PreconditionError('net.bridge.bridge-nf-call-iptables is not available inside a network namespace: load br_netfilter (modprobe br_netfilter) on a kernel >= 5.3', { cause: err });
  }
}

export function ipBatch(ns: string, lines: readonly string[]): Promise<string> {
  return sh('ip', ['-n', ns, '-batch', '-'], lines.join('\n') + '\n');
}

/** `nodad`: IPv6 addresses are usable at once, no duplicate-address-detection wait. */
function addrLine(ip: string, len: number, dev: string): string {
  return `addr add ${ip}/${len} dev ${dev}${ip.includes(':') ? ' nodad' : ''}`;
}

/** The underlay's switch, with a port for each host (in the underlay namespace). */
export function underlayLines(hosts: readonly { ns: string; port: string }[]): string[] {
  return ['link add br0 type bridge forward_delay 0', 'link set br0 up', ...hosts.flatMap((h) => [`link add ${h.port} type veth peer name eth0 netns ${h.ns}`, `link set ${h.port} master br0 up`])];
}

/** A node's cni0 and underlay address, and host-gw routes to every other node's pods. */
export function nodeLines(n: NodeLayout, nodes: readonly NodeLayout[]): string[] {
  // A fixed MAC: a bridge otherwise takes its lowest port MAC, which changes as pods come
  // and go and leaves stale neighbour entries in the pods.
  const mac = `02:5e:00:00:${n.index.toString(16).padStart(2, '0')}:01`;
  return [
    'link add cni0 type bridge forward_delay 0',
    `link set cni0 address ${mac}`,
    ...n.cidrs.map((c) => addrLine(firstHost(c), c.prefix, 'cni0')),
    'link set cni0 up',
    addrLine(underlayIp(4, n.index), UNDERLAY[4].len, 'eth0'),
    addrLine(underlayIp(6, n.index), UNDERLAY[6].len, 'eth0'),
    'link set eth0 up',
    // host-gw: every other node's pod CIDRs are reached through that node's underlay address.
    ...nodes.filter((o) => o !== n).flatMap((o) => o.cidrs.map((c) => `route add ${formatCidr(c)} via ${underlayIp(c.family, o.index)}`)),
  ];
}

/** The external host's underlay address, and routes to the pods through their nodes. */
export function externalLines(nodes: readonly NodeLayout[]): string[] {
  return [
    addrLine(underlayIp(4, EXTERNAL_HOST), UNDERLAY[4].len, 'eth0'),
    addrLine(underlayIp(6, EXTERNAL_HOST), UNDERLAY[6].len, 'eth0'),
    'link set eth0 up',
    ...nodes.flatMap((n) => n.cidrs.map((c) => `route add ${formatCidr(c)} via ${underlayIp(c.family, n.index)}`)),
  ];
}

/** A pod's eth0 (its veth's far end, `nodeVeth`, in the node's namespace), addresses and default routes. */
export function podLines(ips: readonly string[], nodeVeth: string, node: NodeLayout & { readonly netns: string }): string[] {
  return [
    `link add eth0 address ${podMac(ips)} type veth peer name ${nodeVeth} netns ${node.netns}`,
    ...ips.map((ip) => addrLine(ip, cidrFor(node, ip).prefix, 'eth0')),
    'link set eth0 up',
    ...ips.map((ip) => `route add default via ${firstHost(cidrFor(node, ip))}`),
  ];
}
