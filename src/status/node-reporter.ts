// Writes this node's NodePolicyStatus: the agent calls update() after every apply, and the
// reporter writes the latest state later, rate limited, only when it changed, with server-side
// apply under the node's own field manager. Nothing here can block or fail enforcement.

import { agentFieldManager, applyQuery, nodeObjectBody, nodePath, nodeStatusBody, nodeStatusPath } from './bodies.ts';
import { systemClock } from '../clock.ts';
import { createFailureLog, passReporter } from './failures.ts';
import { APPLY_PATCH, createKubeClient, isStatus, KubeApiError } from '../kube/client.ts';
import { buildNodeStatus, nodeStatusNeedsWrite, parseNodeStatus } from './node-status.ts';
import type { NodeStatus, NodeStatusInput } from './node-status.ts';
import { createPacer } from '../pacer.ts';
import { DEFAULT_RETRY_MAX_MS, DEFAULT_RETRY_MIN_MS, type PacedWriterOptions } from './pacing.ts';

export interface NodeStatusReporterOptions extends PacedWriterOptions {
  readonly nodeName: string;
  /** A change of lastSyncTime alone is written at most this often. */
  readonly heartbeatMs?: number;
}

export interface NodeStatusReporter {
  /** Stores the input and schedules a write; returns at once and never throws. */
  update(input: NodeStatusInput): void;
  stop(): Promise<void>;
}

export const DEFAULT_NODE_MIN_INTERVAL_MS = 1_000;
export const DEFAULT_HEARTBEAT_MS = 5 * 60_000;

const GRANT = 'get on nodes; get, create, patch on nodepolicystatuses.weir.dev and patch on nodepolicystatuses/status';

export function createNodeStatusReporter(o: NodeStatusReporterOptions): NodeStatusReporter {
  const clock = o.clock ?? systemClock;
  const node = o.nodeName;
  const log = o.log.child({ component: 'status', node });
  const client = createKubeClient(o.kubeConfig, o.onRequest ? { onRequest: o.onRequest } : {});
  const manager = agentFieldManager(node);
  const heartbeatMs = o.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
  const failures = createFailureLog(log, 'node status', GRANT);
  const abort = new AbortController();
  const signal = abort.signal;

  let latest: NodeStatusInput | null = null;
  let nodeUid: string | null = null;
  /** What the API server holds: undefined until read, null when there is no status yet. */
  let stored: NodeStatus | null | undefined;
  /** The object exists with the ownerReference to the current Node uid. */
  let ensured = false;

  async function pass(): Promise<'ok' | 'skipped'> {
    const input = latest;
    if (input === null) return 'skipped';
    if (nodeUid === null) {
      const nodeObj = (await client.send({ method: 'GET', path: nodePath(node), signal })) as { metadata?: { uid?: unknown } };
      const uid = nodeObj?.metadata?.uid;
      if (typeof uid !== 'string' || uid === '') throw new KubeApiError('GET', nodePath(node), 200, '', 'the Node has no metadata.uid');
      nodeUid = uid;
    }
    if (stored === undefined) {
      // Read once per process, so that a restart keeps the transition times and writes nothing
      // when nothing changed.
      try {
        const obj = (await client.send({ method: 'GET', path: nodeStatusPath(node), signal })) as {
          metadata?: { ownerReferences?: { uid?: unknown }[] };
          status?: unknown;
        };
        stored = parseNodeStatus(obj?.status);
        ensured = (obj?.metadata?.ownerReferences ?? []).some((r) => r?.uid === nodeUid);
      } catch (err) {
        if (!isStatus(err, 404)) throw err;
        stored = null;
        ensured = false;
      }
    }
    if (!ensured) {
      // The status subresource cannot create an object: apply the object (owner only) first.
      await client.send({
        method: 'PATCH',
        path: nodeStatusPath(node),
        query: applyQuery(manager),
        body: nodeObjectBody(node, nodeUid),
        contentType: APPLY_PATCH,
        signal,
      });
      ensured = true;
    }
    const next = buildNodeStatus(input, stored?.conditions, clock.now());
    if (!nodeStatusNeedsWrite(stored ?? null, next, heartbeatMs)) return 'skipped';
    try {
      await client.send({
        method: 'PATCH',
        path: nodeStatusPath(node, 'status'),
        query: applyQuery(manager),
        body: nodeStatusBody(node, next),
        contentType: APPLY_PATCH,
        signal,
      });
    } catch (err) {
      // Deleted behind our back (or by the garbage collector after the Node was re-created):
      // read everything again on the retry.
      if (isStatus(err, 404)) {
        nodeUid = null;
        stored = undefined;
        ensured = false;
      }
      throw err;
    }
    stored = next;
    return 'ok';
  }

  const pacer = createPacer({
    clock,
    minIntervalMs: o.minIntervalMs ?? DEFAULT_NODE_MIN_INTERVAL_MS,
    retryMinMs: o.retryMinMs ?? DEFAULT_RETRY_MIN_MS,
    retryMaxMs: o.retryMaxMs ?? DEFAULT_RETRY_MAX_MS,
    run: pass,
    onResult: passReporter(failures, signal, o.onWrite),
  });

  return {
    update(input) {
      latest = input;
      pacer.poke();
    },
    async stop() {
      abort.abort();
      await pacer.stop();
      await client.close();
    },
  };
}
