// The cluster controller's composition root. One Deployment of it (two replicas, one leader)
// does what concerns a policy across nodes: NetworkPolicyStatus and the conditions on each
// ClusterNetworkPolicy from the nodes' digests, the Events on policies, the deletion of statuses whose policy is gone. Agents write only their
// own node's NodePolicyStatus, so no agent token can speak for the cluster. Nothing here takes
// part in enforcement: with no controller running, status goes stale and packets are as before.

import { Registry, collectDefaultMetrics } from 'prom-client';
import { listHeapGuard, v8Collector } from '../agent/gc.ts';
import { createKubeClient } from '../kube/client.ts';
import { loadKubeConfig } from '../kube/kubeconfig.ts';
import type { Logger } from '../log.ts';
import { startHealthServer } from '../metrics/server.ts';
import { INVALID_POLICY_EFFECT, formatPolicyErrors } from '../model/policy-errors.ts';
import { createKubeSource } from '../sources/index.ts';
import { createPolicyStatusAggregator } from './aggregator.ts';
import { createEventRecorder } from './events.ts';
import { createControllerMetrics } from './metrics.ts';
import { watchNodeReports } from './node-reports.ts';
import type { NodeReport } from './node-reports.ts';
import { ControllerModel } from './policy-inputs.ts';
import type { DaemonSetRef } from '../lifecycle/daemonset-ref.ts';
import { watchUninstallSignal } from '../lifecycle/uninstall-signal.ts';

export interface ControllerConfig {
  readonly kubeconfig: string | undefined;
  /** This replica's name in the Lease: its pod name. */
  readonly identity: string;
  readonly leaseNamespace: string;
  readonly leaseName: string;
  /** HOST:PORT of /metrics, /healthz, /readyz; none when undefined. */
  readonly metricsAddr: string | undefined;
  /** How often the leader recomputes every policy's desired nodes (when anything changed). */
  readonly aggregateEveryMs?: number;
  /** The agents' DaemonSet, watched for `weir uninstall`; none when undefined. */
  readonly daemonSet?: DaemonSetRef;
}

export interface RunningController {
  isLeader(): boolean;
  readonly port: number | undefined;
  /** Resolves with the reason when the controller must exit to start over (an uninstall called off). */
  readonly exitRequested: Promise<string>;
  stop(): Promise<void>;
}

export const DEFAULT_CONTROLLER_LEASE_NAME = 'weir-controller';
const CONTROLLER_LEASE_DURATION_SECONDS = 8;

export async function startController(cfg: ControllerConfig, deps: { readonly log: Logger }): Promise<RunningController> {
  const log = deps.log.child({ component: 'controller', identity: cfg.identity });
  const kubeConfig = loadKubeConfig(cfg.kubeconfig);
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'weir_controller_' });
  // The reports are filled below; the metrics read them only when scraped.
  const reports = new Map<string, NodeReport>();
  const { statusWrites, leader } = createControllerMetrics(registry, { nodes: () => reports.values(), notEnforcedMs: () => aggregator.notEnforcedMs() });
  const written = (kind: string) => (result: string) => statusWrites.inc({ kind, result });

  const model = new ControllerModel();
  const aggregator = createPolicyStatusAggregator({
    kubeConfig,
    identity: cfg.identity,
    log,
    leaseNamespace: cfg.leaseNamespace,
    leaseName: cfg.leaseName,
    // Killing the leader hands status over within this plus a third of it (the others' retry).
    leaseDurationSeconds: CONTROLLER_LEASE_DURATION_SECONDS,
    onWrite: written('NetworkPolicyStatus'),
  });
  const events = createEventRecorder({ kubeConfig, component: 'weir-controller', host: cfg.identity, log, onWrite: written('Event') });
  const client = createKubeClient(kubeConfig);
  const abort = new AbortController();

  // Invalid policies not yet told about at their current generation, by uid.
  const untold = new Map<string, { generation: number }>();
  // The apply failures already told (node, uid, generation), from the nodes' reports.
  const toldFailures = new Set<string>();
  const warnedUnknown = new Set<string>();

  let synced = false;
  let changed = true;
  let wasLeader = false;
  /** The uninstall under way: no more writes, the Lease let go, for good. */
  let uninstalling: string | null = null;
  /** The Lease let go and the writers stopped, once: an uninstall does it before the process. */
  let stoppedWriting: Promise<unknown> | undefined;
  const stopWriting = () => (stoppedWriting ??= Promise.allSettled([aggregator.stop(), events.stop()]));
  let requestExit: (why: string) => void = () => {};
  const exitRequested = new Promise<string>((resolve) => {
    requestExit = resolve;
  });

  const collect = v8Collector();
  const source = createKubeSource({
    kubeConfig,
    log,
    startList: collect && listHeapGuard(collect, {}),
    onWatchEvent: (e) => {
      if (e.type === 'error') log.warn({ kind: e.kind, detail: e.detail }, 'watch error; restarting with backoff');
    },
  });

  /** The leader's periodic work: desired nodes to the aggregator when the model changed, and
   *  the Events owed. Followers only keep their model current. */
  const tick = (): void => {
    if (uninstalling !== null) return;
    const isLeader = aggregator.isHolder();
    leader.set(isLeader ? 1 : 0);
    const became = isLeader && !wasLeader;
    wasLeader = isLeader;
    if (!isLeader || !synced) return;
    if (changed || became) {
      changed = false;
      aggregator.update({ policies: model.statusInputs(), clusterPolicies: model.clusterStatusInputs() });
    }
    tellRejected();
    tellApplyFailures();
  };

  function tellRejected(): void {
    for (const [uid, { generation }] of untold) {
      untold.delete(uid);
      const p = model.policyByUid(uid);
      if (p === undefined || p.generation !== generation || p.errors.length === 0) continue;
      events.record(p, 'Warning', 'PolicyRejected', `invalid: it ${INVALID_POLICY_EFFECT}: ${formatPolicyErrors(p.errors)}`);
    }
  }

  function tellApplyFailures(): void {
    const current = new Set<string>();
    for (const r of reports.values()) {
      for (const f of r.applyFailures) {
        const key = `${r.node}\0${f.uid}\0${f.generation}`;
        current.add(key);
        if (toldFailures.has(key)) continue;
        toldFailures.add(key);
        const p = model.policyByUid(f.uid);
        if (p === undefined) {
          // A node may name a policy deleted since; anything else is a report we cannot place.
          if (!warnedUnknown.has(key))
            log.warn({ node: r.node, policy: `${f.namespace}/${f.name}`, uid: f.uid }, 'a NodePolicyStatus names an apply failure of a policy uid the cluster does not hold: no Event');
          warnedUnknown.add(key);
          continue;
        }
        events.record(p, 'Warning', 'ApplyFailed', `node ${r.node}: ${f.error}`);
      }
    }
    for (const k of toldFailures) if (!current.has(k)) toldFailures.delete(k);
    for (const k of warnedUnknown) if (!current.has(k)) warnedUnknown.delete(k);
  }

  aggregator.start();
  const nodeWatch = watchNodeReports(
    {
      client,
      log,
      onChange: (node, report) => {
        if (report === undefined) reports.delete(node);
        else {
          if (report.unreadable !== null && reports.get(node)?.unreadable !== report.unreadable) log.warn({ node }, `NodePolicyStatus ${node}: ${report.unreadable}`);
          reports.set(node, report);
        }
      },
    },
    abort.signal,
  );
  const timer = setInterval(tick, cfg.aggregateEveryMs ?? 2_000);
  const uninstallWatch =
    cfg.daemonSet &&
    watchUninstallSignal(
      {
        client,
        log,
        daemonSet: cfg.daemonSet,
        onChange: (token) => {
          if (token !== null && uninstalling === null) {
            uninstalling = token;
            leader.set(0);
            log.warn({ token }, `uninstall ${token}: writing no more status, and letting go of the Lease`);
            void stopWriting();
          } else if (token === null && uninstalling !== null) {
            requestExit(`the uninstall ${uninstalling} was called off (its annotation is gone): starting over`);
          }
        },
      },
      abort.signal,
    );

  let server: Awaited<ReturnType<typeof startHealthServer>> | undefined;
  if (cfg.metricsAddr) {
    server = await startHealthServer(cfg.metricsAddr, registry, {
      health: () => ({ healthy: true, reason: 'running' }),
      readiness: () =>
        uninstalling !== null
          ? { ready: false, revision: '', reason: 'uninstalling' }
          : synced
            ? { ready: true, revision: '', reason: aggregator.isHolder() ? 'leader' : 'standby' }
            : { ready: false, revision: '', reason: 'waiting for the first complete view of the cluster' },
    });
    log.info({ addr: cfg.metricsAddr, port: server.port }, `serving /metrics, /healthz and /readyz on ${server.host}:${server.port}`);
  }

  await source.start((batch) => {
    for (const p of model.apply(batch.events)) {
      if (p.errors.length > 0) untold.set(p.uid, { generation: p.generation });
      else untold.delete(p.uid);
    }
    changed = true;
    if (batch.synced && !synced) {
      synced = true;
      // The lists' garbage: V8 would otherwise keep its pages for good.
      collect?.(true);
      log.info('every kind listed: this replica can write status once it holds the Lease');
    }
  });
  log.info({ lease: `${cfg.leaseNamespace}/${cfg.leaseName}` }, 'controller started');

  return {
    isLeader: () => uninstalling === null && aggregator.isHolder(),
    port: server?.port,
    exitRequested,
    async stop() {
      clearInterval(timer);
      abort.abort();
      await source.stop();
      await Promise.allSettled([stopWriting(), nodeWatch, uninstallWatch]);
      await client.close();
      await new Promise<void>((resolve) => (server ? server.server.close(() => resolve()) : resolve()));
      server?.server.closeAllConnections();
    },
  };
}
