// Which nodes hold which policy generation, from bounded NodePolicyStatus objects. A node does not
// list the policies it enforces (a large cluster's would not fit an etcd object); it reports, for each
// of DIGEST_BUCKETS buckets of policy uids, the XOR of a 64-bit hash of every (uid, generation)
// pair it enforces in that bucket. The aggregator computes the same digests from its own view
// (the policies whose desired nodes include the node): a bucket that matches proves the node
// holds every policy of the bucket at exactly the current generation.
//
// A bucket stops matching while the node catches up with a change of any one policy in it, so
// the tracker remembers proofs: a (policy generation, node) pair once proven stays realized until
// the policy's generation changes, the node stops being desired, or the node's status object is
// deleted. Pure, apart from the state the tracker keeps.

import { createHash } from 'node:crypto';
import { sameStrings } from './policy-status.ts';
import type { PolicyStatusInput, Realization } from './policy-status.ts';

/** What the tracker reads of a policy, of either kind: a NetworkPolicy or a ClusterNetworkPolicy
 *  (uids are unique across kinds, so both share one digest). */
export type Realizable = Pick<PolicyStatusInput, 'uid' | 'generation' | 'desiredNodes'>;

/** Buckets per digest: more buckets keep a change from hiding unrelated policies for longer,
 *  at 16 hex characters each in every NodePolicyStatus. */
export const DIGEST_BUCKETS = 128;
const HEX_PER_BUCKET = 16;

/** A node's digests: two 32-bit words (high, low) per bucket. */
export interface NodeDigest {
  readonly buckets: number;
  readonly words: Uint32Array;
}

/** The bucket of a policy uid: FNV-1a, so that test uids like "u-web" spread too. */
export function bucketOf(uid: string, buckets: number = DIGEST_BUCKETS): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < uid.length; i++) {
    h ^= uid.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0) % buckets;
}

/** The 64-bit hash of one (uid, generation) pair, as [high, low]. */
export function entryHash(uid: string, generation: number): [number, number] {
  const d = createHash('sha256').update(`${uid}\n${generation}`).digest();
  return [d.readUInt32BE(0), d.readUInt32BE(4)];
}

/** The digests of a set of (uid, generation) pairs. */
export function digestOf(policies: Iterable<{ readonly uid: string; readonly generation: number }>, buckets: number = DIGEST_BUCKETS): NodeDigest {
  const words = new Uint32Array(2 * buckets);
  const seen = new Set<string>();
  for (const p of policies) {
    // A set: a uid listed twice (it cannot be enforced at two generations) counts once.
    if (seen.has(p.uid)) continue;
    seen.add(p.uid);
    const b = bucketOf(p.uid, buckets);
    const [hi, lo] = entryHash(p.uid, p.generation);
    words[2 * b] ^= hi;
    words[2 * b + 1] ^= lo;
  }
  return { buckets, words };
}

/** 16 hex characters per bucket, in bucket order. */
export function encodeDigest(d: NodeDigest): string {
  let out = '';
  for (let i = 0; i < d.words.length; i++) out += d.words[i].toString(16).padStart(8, '0');
  return out;
}

/** Reads digests back; null when malformed (the node then proves nothing). */
export function decodeDigest(buckets: unknown, text: unknown): NodeDigest | null {
  if (typeof buckets !== 'number' || !Number.isInteger(buckets) || buckets < 1 || typeof text !== 'string') return null;
  if (text.length !== buckets * HEX_PER_BUCKET || !/^[0-9a-f]*$/.test(text)) return null;
  const words = new Uint32Array(2 * buckets);
  for (let i = 0; i < words.length; i++) words[i] = Number.parseInt(text.slice(8 * i, 8 * i + 8), 16);
  return { buckets, words };
}

export interface RealizationTracker {
  /** The realization of every input policy, given each node's latest digests (a node without a
   *  NodePolicyStatus is absent). Call with the full input each time: policies left out are
   *  forgotten. */
  update(policies: readonly Realizable[], nodes: ReadonlyMap<string, NodeDigest>): Map<string, Realization>;
  /** Drops every proof of a node: its NodePolicyStatus was deleted or re-created. */
  forgetNode(node: string): void;
}

interface Tracked {
  readonly uid: string;
  generation: number;
  /** The bucket and 64-bit hash of (uid, generation). */
  readonly bucket: number;
  readonly hi: number;
  readonly lo: number;
  /** Desired nodes, sorted and unique, as of the last update (the input's own array when it
   *  already is: a copy per policy was most of the tracker's memory). */
  desired: readonly string[];
  /** Desired nodes not yet proven to hold `generation`; null when none (at rest: an empty Set
   *  per policy cost more than everything else the tracker holds). */
  pending: Set<string> | null;
  /** The update that last saw the policy: those an update leaves out are forgotten. */
  seen: number;
}

/** Realization of a policy with nothing pending shares this list. */
const NONE: readonly string[] = Object.freeze([]);

export function createRealizationTracker(buckets: number = DIGEST_BUCKETS): RealizationTracker {
  const tracked = new Map<string, Tracked>();
  const forgotten = new Set<string>();
  let round = 0;

  return {
    forgetNode(node) {
      forgotten.add(node);
    },

    update(policies, nodes) {
      const now = ++round;
      // The policies of this update, once per uid (a duplicate would double its hash).
      const current: Tracked[] = [];
      // What each node should report: the digests of the policies it should enforce.
      const expected = new Map<string, Uint32Array>();
      for (const p of policies) {
        let t = tracked.get(p.uid);
        if (t?.seen === now) continue;
        const desired = sortedUnique(p.desiredNodes);
        if (t === undefined || t.generation !== p.generation) {
          // A new generation: no node has proven it yet.
          const [hi, lo] = entryHash(p.uid, p.generation);
          t = { uid: p.uid, generation: p.generation, bucket: bucketOf(p.uid, buckets), hi, lo, desired, pending: desired.length === 0 ? null : new Set(desired), seen: now };
          tracked.set(p.uid, t);
        } else {
          if (!sameStrings(t.desired, desired)) {
            const before = new Set(t.desired);
            for (const n of desired) if (!before.has(n)) (t.pending ??= new Set()).add(n);
            if (t.pending !== null) {
              const still = new Set(desired);
              for (const n of t.pending) if (!still.has(n)) t.pending.delete(n);
            }
          }
          // The latest array, equal or not, so that an old input is not kept alive.
          t.desired = desired;
          t.seen = now;
        }
        for (const n of forgotten) if (desired.includes(n)) (t.pending ??= new Set()).add(n);
        for (const n of desired) {
          let w = expected.get(n);
          if (w === undefined) expected.set(n, (w = new Uint32Array(2 * buckets)));
          w[2 * t.bucket] ^= t.hi;
          w[2 * t.bucket + 1] ^= t.lo;
        }
        current.push(t);
      }
      const matches = (node: string, bucket: number): boolean => {
        const got = nodes.get(node);
        const want = expected.get(node);
        if (got === undefined || want === undefined || got.buckets !== buckets) return false;
        return got.words[2 * bucket] === want[2 * bucket] && got.words[2 * bucket + 1] === want[2 * bucket + 1];
      };

      const out = new Map<string, Realization>();
      for (const t of current) {
        if (t.pending !== null) {
          for (const n of t.pending) if (matches(n, t.bucket)) t.pending.delete(n);
          if (t.pending.size === 0) t.pending = null;
        }
        const pending = t.pending === null ? NONE : [...t.pending].sort();
        out.set(t.uid, { desired: t.desired.length, realized: t.desired.length - pending.length, pending });
      }
      for (const [uid, t] of tracked) if (t.seen !== now) tracked.delete(uid);
      forgotten.clear();
      return out;
    },
  };
}

/** The list sorted and without duplicates: the list itself when it already is. */
function sortedUnique(list: readonly string[]): readonly string[] {
  for (let i = 1; i < list.length; i++) if (!(list[i - 1] < list[i])) return [...new Set(list)].sort();
  return list;
}
