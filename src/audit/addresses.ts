// IP address -> the pod that holds it, for naming both ends of an audit line. Fed the same
// Pod events as calc, in batches, by the agent; lookups never wait. An address a pod gave up
// (deleted, finished, changed) stays named in a bounded cache of recent deletions for a while,
// because the kernel's event can reach the agent after the pod's deletion; an address some
// current pod holds always names that pod.

import { LRUCache } from 'lru-cache';
import type { ModelEvent, Pod } from '../model/types.ts';

export interface PodRef {
  readonly namespace: string;
  readonly pod: string;
}

export interface AddressBookOptions {
  /** Addresses of deleted pods remembered at most (least recently deleted forgotten first).
   *  Default 10,000. */
  readonly deletedMax?: number;
  /** How long a deleted pod's address stays named. Default 5 minutes. */
  readonly deletedTtlMs?: number;
  /** Milliseconds, monotonic; for the TTL. */
  readonly now?: () => number;
}

interface Holder {
  readonly ref: PodRef;
  readonly ips: readonly string[];
  readonly live: boolean;
  /** Order of the upsert that set it: of two live claims on an address, the later wins. */
  readonly seq: number;
}

/** A pod holds its addresses unless it shares the node's (hostNetwork) or has finished. */
function heldIps(p: Pod): readonly string[] {
  return p.hostNetwork || p.phase === 'Succeeded' || p.phase === 'Failed' ? [] : p.ips;
}

export class AddressBook {
  readonly #pods = new Map<string, Holder>();
  readonly #byIp = new Map<string, Set<string>>();
  readonly #deleted: LRUCache<string, PodRef>;
  #seq = 0;

  constructor(opts: AddressBookOptions = {}) {
    const now = opts.now ?? (() => performance.now());
    this.#deleted = new LRUCache<string, PodRef>({ max: opts.deletedMax ?? 10_000, ttl: opts.deletedTtlMs ?? 300_000, ttlResolution: 0, perf: { now } });
  }

  /** Addresses some current pod holds. */
  get size(): number {
    return this.#byIp.size;
  }

  /** Addresses of deleted pods still remembered. */
  get deletedSize(): number {
    return this.#deleted.size;
  }

  apply(events: readonly ModelEvent[]): void {
    for (const e of events) {
      if (e.kind !== 'Pod') continue;
      if (e.op === 'upsert') this.#upsert(e.object);
      else this.#remove(e.uid);
    }
  }

  lookup(ip: string): PodRef | undefined {
    const uids = this.#byIp.get(ip);
    if (uids === undefined) return this.#deleted.get(ip);
    let best: Holder | undefined;
    for (const uid of uids) {
      const h = this.#pods.get(uid)!;
      if (best === undefined || (h.live && !best.live) || (h.live === best.live && h.seq > best.seq)) best = h;
    }
    return best!.ref;
  }

  #upsert(p: Pod): void {
    const before = this.#pods.get(p.uid);
    const ips = heldIps(p);
    const ref = before !== undefined && before.ref.namespace === p.namespace && before.ref.pod === p.name ? before.ref : { namespace: p.namespace, pod: p.name };
    this.#pods.set(p.uid, { ref, ips, live: !p.terminating, seq: this.#seq++ });
    for (const ip of before?.ips ?? []) if (!ips.includes(ip)) this.#release(ip, p.uid, before!.ref);
    for (const ip of ips) {
      let uids = this.#byIp.get(ip);
      if (uids === undefined) this.#byIp.set(ip, (uids = new Set()));
      uids.add(p.uid);
      this.#deleted.delete(ip);
    }
    if (ips.length === 0 && before === undefined) this.#pods.delete(p.uid);
  }

  #remove(uid: string): void {
    const before = this.#pods.get(uid);
    if (before === undefined) return;
    this.#pods.delete(uid);
    for (const ip of before.ips) this.#release(ip, uid, before.ref);
  }

  /** `uid` no longer holds `ip`: remembered as deleted unless another pod holds it. */
  #release(ip: string, uid: string, ref: PodRef): void {
    const uids = this.#byIp.get(ip);
    uids?.delete(uid);
    if (uids !== undefined && uids.size > 0) return;
    this.#byIp.delete(ip);
    this.#deleted.set(ip, ref);
  }
}
