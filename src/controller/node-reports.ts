// What the controller reads from the nodes' NodePolicyStatus besides the digests (which the
// aggregator reads): the policies a node could not apply, to become Events on those policies,
// statuses it cannot read, to be named in the log, and the conditions and last sync time that
// its metrics serve (./metrics.ts). A node's report changes nothing of
// another node's, and an unreadable one proves nothing (the aggregator then counts that node
// as not having realized anything).

import type { KubeClient } from '../kube/client.ts';
import { parseConditions } from '../status/conditions.ts';
import type { ConditionStatus } from '../status/conditions.ts';
import { rawRefOf } from '../kube/collection.ts';
import { isRecord } from '../records.ts';
import { watchCollection } from '../kube/side-watch.ts';
import type { Codec } from '../kube/collection.ts';
import type { Logger } from '../log.ts';
import { nodeStatusListPath } from '../status/bodies.ts';
import { nodeDigestOf, parseFailing } from '../status/node-status.ts';
import type { FailingPolicy } from '../status/node-status.ts';

export interface NodeReport {
  readonly node: string;
  readonly applyFailures: readonly FailingPolicy[];
  /** Why the status cannot prove anything, when it cannot (no status yet is not a problem). */
  readonly unreadable: string | null;
  /** Its conditions' types and statuses, in the status's order (reasons are in the object). */
  readonly conditions: readonly { readonly type: string; readonly status: ConditionStatus }[];
  /** Its lastSyncTime, epoch ms; null when it has none or it cannot be read. */
  readonly lastSyncTime: number | null;
}

export interface NodeReportsOptions {
  readonly client: KubeClient;
  readonly log: Logger;
  /** A node's report changed, or its NodePolicyStatus is gone (undefined). */
  readonly onChange: (node: string, report: NodeReport | undefined) => void;
}

/** Reads one NodePolicyStatus; exported for tests. */
export function readNodeReport(raw: unknown): NodeReport {
  const node = rawRefOf(raw, false).name;
  const status = isRecord(raw) ? raw.status : undefined;
  let unreadable: string | null = null;
  if (isRecord(status) && status.policyDigest !== undefined && nodeDigestOf(status) === null) {
    unreadable = 'its status.policyDigest cannot be read (buckets and digests do not agree, or are not hex): the node is counted as enforcing no policy until it writes a readable one';
  }
  const conditions = parseConditions(isRecord(status) ? status.conditions : undefined).map((c) => ({ type: c.type, status: c.status }));
  const synced = isRecord(status) && typeof status.lastSyncTime === 'string' ? Date.parse(status.lastSyncTime) : Number.NaN;
  return {
    node,
    applyFailures: parseFailing(isRecord(status) ? status.applyFailures : undefined),
    unreadable,
    conditions,
    lastSyncTime: Number.isFinite(synced) ? synced : null,
  };
}

const codec: Codec<NodeReport> = {
  decode(raw) {
    const report = readNodeReport(raw);
    return { key: report.node, name: report.node, value: report, warnings: [] };
  },
  same: (a, b) => JSON.stringify(a) === JSON.stringify(b),
  ref: (raw) => rawRefOf(raw, false),
};

/** Lists and watches until `signal` aborts; never rejects. */
export function watchNodeReports(o: NodeReportsOptions, signal: AbortSignal): Promise<void> {
  return watchCollection(
    { kind: 'NodePolicyStatus', path: nodeStatusListPath() },
    codec,
    { client: o.client, log: o.log, relistMs: [1_800_000, 3_600_000] },
    { change: (node, report) => o.onChange(node, report), listed: () => {} },
    signal,
  );
}
