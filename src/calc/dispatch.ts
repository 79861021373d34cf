// The dispatch tree: how a packet finds its local pod's chain, and the addresses pods gave up.
//
// Two levels: the top chains jump on the /28 (IPv4) or /124 (IPv6) block of the address to a
// bucket chain of at most 16 pods, which jumps to the pod's chain. A pod coming or going
// rewrites its bucket only (and the top chains when a block appears or goes).

import { compareStrings } from '../model/order.ts';
import { formatCidr, parseIp } from '../model/cidr.ts';
import type { Family } from '../model/types.ts';
import { familyOf } from '../model/types.ts';
import type { ChainStore } from './chain-store.ts';
import type { Match, Rule } from './desired.ts';
import type { Names } from './names.ts';
import { hostCidr } from './rules.ts';

export interface DispatchConfig {
  readonly names: Names;
  readonly families: readonly Family[];
  /** The bridge local pods hang off ('' when there is none to police). */
  readonly podBridge: string;
  /** A pod may send only from its own address through its own bridge port. */
  readonly sourceBinding: boolean;
}

/** A local workload's entry in its bucket; `order` sorts the bucket (namespace/name/uid). */
interface Entry {
  readonly ip: string;
  readonly order: string;
}

export class DispatchTree {
  readonly #cfg: DispatchConfig;
  readonly #chains: ChainStore;
  /** Block -> local workloads (uid -> entry) in it. */
  readonly #blocks = new Map<string, Map<string, Entry>>();
  readonly #dirtyBlocks = new Set<string>();
  /** Local pod address -> the bridge port it lives behind (learned from the kernel). */
  readonly #ports = new Map<string, string>();
  /** Addresses local pods gave up since the last takeReleased: address -> the pod's uid. */
  readonly #released = new Map<string, string>();
  /** This node's pod CIDRs, from its Node object. */
  #podCIDRs: readonly string[] = [];

  constructor(cfg: DispatchConfig, chains: ChainStore) {
    this.#cfg = cfg;
    this.#chains = chains;
    // Before anything is known every pod of the bridge is unknown: the very first desired
    // state already fails closed.
    this.#rebuildTop(new Set(cfg.families));
  }

  /** Moves a local workload's addresses between blocks; `order` is its namespace/name/uid. */
  moveWorkload(uid: string, order: string, before: readonly string[], after: readonly string[]): void {
    for (const ip of before) {
      if (after.includes(ip)) continue;
      const block = dispatchBlock(ip);
      const m = this.#blocks.get(block);
      if (m?.get(uid)?.ip === ip) {
        m.delete(uid);
        if (m.size === 0) this.#blocks.delete(block);
      }
      this.#dirtyBlocks.add(block);
      if (this.#cfg.families.includes(familyOf(ip))) this.#released.set(ip, uid);
    }
    for (const ip of after) {
      if (before.includes(ip)) continue;
      if (this.#released.get(ip) === uid) this.#released.delete(ip);
      const block = dispatchBlock(ip);
      let m = this.#blocks.get(block);
      if (!m) this.#blocks.set(block, (m = new Map()));
      m.set(uid, { ip, order });
      this.#dirtyBlocks.add(block);
    }
  }

  /** The bridge port behind a local address (undefined: gone). */
  setPort(ip: string, port: string | undefined): void {
    const before = this.#ports.get(ip);
    if (port === undefined) this.#ports.delete(ip);
    else this.#ports.set(ip, port);
    if (before !== port && this.#cfg.sourceBinding) this.#dirtyBlocks.add(dispatchBlock(ip));
  }

  /** The bridge port a local address is bound to, when known. */
  portOf(ip: string): string | undefined {
    return this.#ports.get(ip);
  }

  /** This node's pod CIDRs (none: without its Node, the pod bridge alone closes unknown addresses). */
  setPodCIDRs(cidrs: readonly string[]): void {
    const sorted = [...cidrs].sort();
    if (sorted.join() === this.#podCIDRs.join()) return;
    this.#podCIDRs = sorted;
    this.#rebuildTop(new Set(this.#cfg.families));
  }

  /** Addresses given up since the last call, sorted; one that went back to the same pod is not among them. */
  takeReleased(): string[] {
    const out = [...this.#released.keys()].sort();
    this.#released.clear();
    return out;
  }

  /** Rewrites the buckets changed since the last call, and the top chains if a block came or went. */
  flush(): void {
    if (this.#dirtyBlocks.size === 0) return;
    const names = this.#cfg.names;
    const topChanged = new Set<Family>();
    for (const block of this.#dirtyBlocks) {
      const f = familyOf(block);
      if (!this.#cfg.families.includes(f)) continue;
      const from = names.dispatchBucket('from', block);
      const to = names.dispatchBucket('to', block);
      const members = this.#blocks.get(block);
      if (!members) {
        if (this.#chains.has(f, from)) topChanged.add(f);
        this.#chains.delete(f, from);
        this.#chains.delete(f, to);
        continue;
      }
      if (!this.#chains.has(f, from)) topChanged.add(f);
      const ordered = [...members].sort(([, a], [, b]) => compareStrings(a.order, b.order));
      const fromRules: Rule[] = [];
      for (const [uid, { ip }] of ordered) {
        const port = this.#ports.get(ip);
        const matches: Match[] = [{ kind: 'addr', dir: 'src', cidr: hostCidr(ip) }];
        if (this.#cfg.sourceBinding) {
          // Bound: only from its own port. Not bound yet: it may not send at all (tail drop).
          if (port === undefined) continue;
          matches.push({ kind: 'bridgePortIn', port });
        }
        fromRules.push({ matches, action: { kind: 'goto', chain: names.fromWorkload(uid) } });
      }
      const toRules = ordered.map(
        ([uid, { ip }]): Rule => ({
          matches: [{ kind: 'addr', dir: 'dst', cidr: hostCidr(ip) }],
          action: { kind: 'goto', chain: names.toWorkload(uid) },
        }),
      );
      this.#chains.set(f, from, [...fromRules, bucketTailRule('from')]);
      this.#chains.set(f, to, [...toRules, bucketTailRule('to')]);
    }
    this.#dirtyBlocks.clear();
    this.#rebuildTop(topChanged);
  }

  /** The top dispatch chains of the families given: one rule per block, then the tails. */
  #rebuildTop(families: ReadonlySet<Family>): void {
    const names = this.#cfg.names;
    for (const f of families) {
      const blocks = [...this.#blocks.keys()].filter((b) => familyOf(b) === f).sort(compareStrings);
      const failClosed = { podBridge: this.#cfg.podBridge, podCIDRs: this.#podCIDRs.filter((c) => familyOf(c) === f) };
      const top = (dir: 'from' | 'to'): Rule[] => [
        ...blocks.map(
          (block): Rule => ({
            matches: [{ kind: 'addr', dir: dir === 'from' ? 'src' : 'dst', cidr: block }],
            action: { kind: 'goto', chain: names.dispatchBucket(dir, block) },
          }),
        ),
        ...dispatchTailRules(dir, failClosed),
      ];
      this.#chains.set(f, names.fromWorkloadDispatch, top('from'));
      this.#chains.set(f, names.toWorkloadDispatch, top('to'));
    }
  }
}

/** The /28 or /124 block holding an address: the dispatch bucket it belongs to. */
function dispatchBlock(ip: string): string {
  const a = parseIp(ip);
  if ('error' in a) throw new RangeError(`local pod address ${ip}: ${a.error}`);
  const prefix = a.family === 4 ? 28 : 124;
  return formatCidr({ family: a.family, base: a.value & ~0xfn, prefix });
}

/** Where traffic of pods this node does not know (yet) stops: see dispatchTailRules. */
export interface FailClosedInput {
  /** The bridge local pods hang off ('' when there is none to police). */
  readonly podBridge: string;
  /** This node's pod CIDRs of the family (from its Node object; none before it is known). */
  readonly podCIDRs: readonly string[];
}

/**
 * The last rules of a top dispatch chain. A packet reaching them matched no known local pod:
 * if it comes from (goes to) this node's pod CIDRs or the pod bridge, it belongs to a pod Weir
 * does not know (a new pod, a spoofed address, a node before its first sync) and is dropped.
 * Anything else (traffic of other nodes' pods passing through, the other end of a connection)
 * falls through to the other dispatch chain.
 */
export function dispatchTailRules(dir: 'from' | 'to', t: FailClosedInput): Rule[] {
  const addrDir = dir === 'from' ? 'src' : 'dst';
  const what = dir === 'from' ? 'from' : 'to';
  const rules: Rule[] = t.podCIDRs.map((cidr) => ({
    matches: [{ kind: 'addr', dir: addrDir, cidr }],
    action: { kind: 'drop' },
    comment: `${what} an address of this node's pod CIDR that is no known pod`,
  }));
  if (t.podBridge !== '') {
    rules.push({
      matches: [{ kind: 'iface', dir: dir === 'from' ? 'in' : 'out', name: t.podBridge }],
      action: { kind: 'drop' },
      comment: `${what} the pod bridge with an address that is no known pod`,
    });
  }
  return rules;
}

/** The last rule of a dispatch bucket: an address of the block that is no known (bound) pod. */
export function bucketTailRule(dir: 'from' | 'to'): Rule {
  return {
    matches: [],
    action: { kind: 'drop' },
    comment: dir === 'from' ? 'from an address that is no known pod, or not from its own bridge port' : 'to an address that is no known pod',
  };
}
