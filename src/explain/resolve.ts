// What `weir explain` was asked about: each end named as a pod (ns/name, or a name only one
// namespace holds) or an address, found in the cluster's pods and nodes. Pure.

import { isPoliced } from '../model/cluster.ts';
import { canonicalIp, cidrContains, parseCidr } from '../model/cidr.ts';
import { compareStrings } from '../model/order.ts';
import type { Family, ModelEvent, Node, Pod } from '../model/types.ts';
import { familyOf } from '../model/types.ts';

/** Input explain cannot answer (an unknown or ambiguous pod, an address it cannot place). */
export class ExplainInputError extends Error {}

/** The pods and nodes of one full view of the cluster. */
export interface World {
  readonly pods: readonly Pod[];
  readonly nodes: readonly Node[];
}

/** The world a source's events bring an empty view to (a first, full batch). */
export function worldOf(events: Iterable<ModelEvent>): World {
  const pods = new Map<string, Pod>();
  const nodes = new Map<string, Node>();
  for (const e of events) {
    if (e.kind === 'Pod') {
      if (e.op === 'upsert') pods.set(e.object.uid, e.object);
      else pods.delete(e.uid);
    } else if (e.kind === 'Node') {
      if (e.op === 'upsert') nodes.set(e.object.name, e.object);
      else nodes.delete(e.name);
    }
  }
  return { pods: [...pods.values()], nodes: [...nodes.values()] };
}

export type Endpoint =
  /** A pod some node polices: its own address, its node's chains. */
  | { readonly kind: 'pod'; readonly text: string; readonly pod: Pod }
  /** A host-networked pod: its addresses are its node's, and its traffic the node's own. */
  | { readonly kind: 'host'; readonly text: string; readonly pod: Pod }
  /** An address no pod holds: inside a node's pod CIDR (a pod Weir does not know, which that
   *  node drops; a host-networked pod may claim it), or outside every pod CIDR (outside the
   *  cluster's pods). */
  | {
      readonly kind: 'address';
      readonly text: string;
      readonly ip: string;
      readonly podCidrOf?: { readonly node: string; readonly cidr: string };
      readonly claimedBy?: Pod;
    };

export const podRef = (p: Pod): string => `${p.namespace}/${p.name}`;

/** The endpoint `text` names, or an ExplainInputError saying why it names none. */
export function resolveEndpoint(world: World, text: string, role: 'source' | 'destination'): Endpoint {
  const ip = canonicalIp(text);
  if (ip !== null) return resolveAddress(world, text, ip);
  if (text.includes('/')) {
    const [namespace, name, ...more] = text.split('/');
    if (more.length > 0 || namespace === '' || name === '') throw new ExplainInputError(`${role} "${text}" is neither NAMESPACE/NAME nor an IP address`);
    const pod = world.pods.find((p) => p.namespace === namespace && p.name === name);
    if (!pod) {
      const inNs = world.pods.filter((p) => p.namespace === namespace).map((p) => p.name);
      const hint = inNs.length > 0 ? `; namespace ${namespace} holds ${listed(inNs)}` : `; no pod is in namespace ${namespace}`;
      throw new ExplainInputError(`${role}: there is no pod ${text}${hint}`);
    }
    return podEndpoint(pod, text, role);
  }
  if (/^[0-9a-fA-F:.]+$/.test(text) && /[.:]/.test(text)) throw new ExplainInputError(`${role} "${text}" is not a valid IP address`);
  const named = world.pods.filter((p) => p.name === text);
  if (named.length === 0) throw new ExplainInputError(`${role}: no pod is named ${text} in any namespace (name it NAMESPACE/NAME, or give an IP address)`);
  if (named.length > 1) throw new ExplainInputError(`${role}: "${text}" is ambiguous: ${listed(named.map(podRef))} (name it NAMESPACE/NAME)`);
  return podEndpoint(named[0], text, role);
}

function podEndpoint(pod: Pod, text: string, role: string): Endpoint {
  if (pod.hostNetwork) return { kind: 'host', text, pod };
  if (pod.ips.length === 0) throw new ExplainInputError(`${role}: pod ${podRef(pod)} has no IP address yet (phase ${pod.phase || 'unknown'}): no packet comes from or goes to it`);
  if (!isPoliced(pod)) throw new ExplainInputError(`${role}: pod ${podRef(pod)} has finished (phase ${pod.phase}): no node polices its address any more`);
  return { kind: 'pod', text, pod };
}

function resolveAddress(world: World, text: string, ip: string): Endpoint {
  const holders = world.pods.filter((p) => !p.hostNetwork && isPoliced(p) && p.ips.includes(ip));
  if (holders.length > 1) {
    throw new ExplainInputError(`${text} is held by ${listed(holders.map(podRef))} at once (a pod took the address of one going away): name the pod instead`);
  }
  if (holders.length === 1) return { kind: 'pod', text, pod: holders[0] };
  const hosts = world.pods.filter((p) => p.hostNetwork && p.ips.includes(ip)).sort((a, b) => compareStrings(podRef(a), podRef(b)));
  // A node's chains dispatch its pod CIDR by the pods they police: a host-networked pod's claim
  // to an address there adds none, so the node drops it as an unknown pod's.
  const podCidrOf = podCidrHolding(world, ip);
  if (podCidrOf) return { kind: 'address', text, ip, podCidrOf, ...(hosts.length > 0 ? { claimedBy: hosts[0] } : {}) };
  // Every host-networked pod of a node shares its address: any of them stands for the node.
  if (hosts.length > 0) return { kind: 'host', text, pod: hosts[0] };
  return { kind: 'address', text, ip };
}

function podCidrHolding(world: World, ip: string): { readonly node: string; readonly cidr: string } | undefined {
  for (const node of [...world.nodes].sort((a, b) => compareStrings(a.name, b.name))) {
    for (const cidr of node.podCIDRs) {
      const c = parseCidr(cidr);
      if (!('error' in c) && cidrContains(c, ip)) return { node: node.name, cidr };
    }
  }
  return undefined;
}

/** The end's addresses of one family (a pod may be single-stack). */
export function addressesOf(e: Endpoint, family: Family): string | undefined {
  if (e.kind === 'address') return familyOf(e.ip) === family ? e.ip : undefined;
  // The address asked for, when the pod was named by one.
  const asked = canonicalIp(e.text);
  if (asked !== null && familyOf(asked) === family && e.pod.ips.includes(asked)) return asked;
  return e.pod.ips.find((a) => familyOf(a) === family);
}

/** Whether the end is an address no pod of a node's pod CIDR holds and no node polices. */
export function isOutside(e: Endpoint): boolean {
  return e.kind === 'address' && e.podCidrOf === undefined;
}

function listed(items: readonly string[]): string {
  const sorted = [...items].sort(compareStrings);
  return sorted.length > 8 ? `${sorted.slice(0, 8).join(', ')} and ${sorted.length - 8} more` : sorted.join(', ');
}
