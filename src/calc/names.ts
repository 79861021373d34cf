// Every chain and set name Weir writes is made here, from one configurable prefix.
// Names are short stable hashes of identity, so they survive restarts and two agents
// computing the same input produce the same bytes.

import { LRUCache } from 'lru-cache';
import type { Family } from '../model/types.ts';
import { sha256Base64Url } from './hash.ts';

/** iptables allows 28 characters in a chain name (XT_EXTENSION_MAXNAMELEN - 1 = 28). */
export const MAX_CHAIN_NAME = 28;
/** ipset allows 31 characters in a set name (IPSET_MAXNAMELEN - 1). */
export const MAX_SET_NAME = 31;
export const DEFAULT_PREFIX = 'cali';
/** What the name cache may hold, in characters of keys and names: an agent asks for the same
 *  names over and over (every pod refresh), but a key may be an ipBlock's whole except list,
 *  and a cache that keeps every key ever asked for only grows. */
export const NAME_CACHE_CHARS = 4 << 20;
/** Keys longer than this are hashed each time instead: the caller built such a key with work
 *  proportional to it, so hashing it again costs no more, and it would evict many small ones. */
export const NAME_CACHE_MAX_KEY = 64 << 10;

export interface Names {
  readonly prefix: string;
  /** Jumped to from mangle FORWARD position 1. */
  readonly forward: string;
  /** --allow-action ACCEPT: sets the accept bit and ACCEPTs, so that filter FORWARD's hook
   *  (which accepts marked packets) lets through what mangle accepted. */
  readonly accept: string;
  readonly fromWorkloadDispatch: string;
  readonly toWorkloadDispatch: string;
  /** The shared first part of every workload chain. */
  readonly workloadCommon: string;
  /** Every chain Weir owns starts with this. */
  readonly chainPrefix: string;
  /** Every set Weir owns starts with one of these (per family). */
  readonly setPrefixes: readonly string[];
  toWorkload(podKey: string): string;
  fromWorkload(podKey: string): string;
  policyIngress(policyKey: string): string;
  policyEgress(policyKey: string): string;
  /** A local pod's ClusterNetworkPolicy rules of one tier and direction, in evaluation order. */
  tierChain(tier: 'admin' | 'baseline', dir: 'ingress' | 'egress', podKey: string): string;
  /** Where an Admin-tier Accept goes: it sets the accept bit, and its end returns to the
   *  workload chain, past the tier's later rules and every NetworkPolicy. */
  readonly tierAccept: string;
  /** A dispatch bucket chain: the local pods of one address block, by direction. */
  dispatchBucket(dir: 'from' | 'to', block: string): string;
  peerSet(family: Family, canonicalKey: string): string;
  isOwnChain(name: string): boolean;
  isOwnSet(name: string): boolean;
  /** Characters the name cache holds now (at most NAME_CACHE_CHARS). */
  readonly cacheSize: number;
}

/** Validates the prefix: letters and digits, 1..6 characters, so that every name fits. */
export function validatePrefix(prefix: string): string | null {
  if (!/^[a-z][a-z0-9]{0,5}$/.test(prefix)) {
    return `chain prefix "${prefix}" must be 1 to 6 lower-case letters or digits, starting with a letter`;
  }
  return null;
}

export function makeNames(prefix: string = DEFAULT_PREFIX): Names {
  const problem = validatePrefix(prefix);
  if (problem) throw new RangeError(problem);
  const cache = new LRUCache<string, string>({
    maxSize: NAME_CACHE_CHARS,
    maxEntrySize: NAME_CACHE_MAX_KEY,
    sizeCalculation: (name, key) => key.length + name.length,
  });
  // The hash fills whatever room the limit leaves after the fixed part of the name.
  const hashed = (head: string, limit: number, input: string): string => {
    const k = head + '\0' + input;
    let name = cache.get(k);
    if (name === undefined) {
      name = head + sha256Base64Url(input).slice(0, limit - head.length);
      if (k.length + name.length <= NAME_CACHE_MAX_KEY) cache.set(k, name);
    }
    return name;
  };
  const chainHash = (kind: string, id: string) => hashed(`${prefix}-${kind}-`, MAX_CHAIN_NAME, id);
  // '-' and '_' are legal in chain names; base64url uses both, so hashes never contain a space.
  const setHead = (family: Family) => `${prefix}${family === 4 ? '40' : '60'}s:`;
  return {
    prefix,
    forward: `${prefix}-FORWARD`,
    accept: `${prefix}-accept`,
    fromWorkloadDispatch: `${prefix}-from-wl-dispatch`,
    toWorkloadDispatch: `${prefix}-to-wl-dispatch`,
    workloadCommon: `${prefix}-wl-common`,
    tierAccept: `${prefix}-tier-accept`,
    chainPrefix: `${prefix}-`,
    setPrefixes: [setHead(4), setHead(6)],
    toWorkload: (podKey) => chainHash('tw', podKey),
    fromWorkload: (podKey) => chainHash('fw', podKey),
    policyIngress: (policyKey) => chainHash('pi', policyKey),
    policyEgress: (policyKey) => chainHash('po', policyKey),
    tierChain: (tier, dir, podKey) => chainHash(`${tier === 'admin' ? 'a' : 'b'}${dir === 'ingress' ? 'i' : 'e'}`, podKey),
    dispatchBucket: (dir, block) => chainHash(dir === 'from' ? 'fd' : 'td', block),
    peerSet: (family, key) => hashed(setHead(family), MAX_SET_NAME, key),
    isOwnChain: (name) => name.startsWith(`${prefix}-`),
    isOwnSet: (name) => name.startsWith(setHead(4)) || name.startsWith(setHead(6)),
    get cacheSize() {
      return cache.calculatedSize;
    },
  };
}
