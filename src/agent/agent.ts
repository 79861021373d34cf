// The composition root: builds names, calc, dataplane, source, reconciler and the health
// server in one place. Order matters: the source starts last, so its first batch finds the
// loop ready; nothing is written before that batch says the source is synced.

import type { KubeConfig } from '@kubernetes/client-node';
import { createAuditLog } from '../audit/index.ts';
import { Calculator, makeNames } from '../calc/index.ts';
import { createDataplane, processRunner, type CommandRunner } from '../dataplane/index.ts';
import { WeirError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { loadKubeConfig } from '../kube/kubeconfig.ts';
import { startRemovalWatch } from './removal.ts';
import { createMetrics, type Metrics } from '../metrics/index.ts';
import { startHealthServer } from '../metrics/server.ts';
import { createKubeSource, createManifestSource } from '../sources/index.ts';
import { createLinkMonitor, createPodInterfaceScanner, withPodInterfaces } from '../sources/pod-interfaces.ts';
import type { Source } from '../sources/types.ts';
import type { ModelEvent } from '../model/types.ts';
import type { AgentConfig } from './config.ts';
import { calcConfig } from './config.ts';
import { judgeByCalc } from '../explain/flow-judge.ts';
import { listHeapGuard, v8Collector } from './gc.ts';
import { preflight } from './preflight.ts';
import { Reconciler } from './reconciler.ts';
import { startReporting, type Reporting } from './reporting.ts';

export interface AgentDeps {
  readonly log: Logger;
  readonly runner?: CommandRunner;
  readonly source?: Source;
  readonly metrics?: Metrics;
  /** Called once, after the first successful write: the cold start is over. */
  readonly onFirstWrite?: () => void;
}

export interface RunningAgent {
  readonly reconciler: Reconciler;
  readonly calc: Calculator;
  readonly metrics: Metrics;
  /** The health server's port, when one was asked for. */
  readonly port: number | undefined;
  /** Resolves with the reason when the agent must exit to start over (an uninstall called off). */
  readonly exitRequested: Promise<string>;
  stop(): Promise<void>;
}

export async function startAgent(cfg: AgentConfig, deps: AgentDeps): Promise<RunningAgent> {
  const { log } = deps;
  const runner =
    deps.runner ??
    processRunner({
      onFallback: (err) => log.warn({ err }, 'commands are started from the agent itself: each start now pauses its event loop for a fork of the whole process'),
    });
  const metrics = deps.metrics ?? createMetrics();
  const collectGarbage = v8Collector();
  // Construction does no I/O, so a wrong source configuration is reported before anything runs.
  const kubeConfig = deps.source || cfg.manifestsDir ? null : loadKubeConfig(cfg.kubeconfig);
  const clusterSource =
    deps.source ?? (kubeConfig ? createKubeSourceFor(cfg, kubeConfig, log, metrics, collectGarbage) : createManifestSource({ dir: cfg.manifestsDir, log, debounceMs: cfg.debounceMs }));
  const names = makeNames(cfg.chainPrefix);
  const lockRetry = { attempts: cfg.lockRetries, delayMs: cfg.lockRetryDelayMs, waitSeconds: cfg.lockWaitSeconds };
  // Every retry on the xtables lock is counted (iptables.ts logs it).
  const onRetry = (info: { tool: string }) => metrics.commandRetries.inc({ command: info.tool });
  const { backend, problems } = await preflight({ runner, names, families: cfg.families, backend: cfg.backend, log, lockRetry, onRetry });
  // Each local pod's address is bound to its bridge port, learned from this node's kernel:
  // scanned on link events (polled every 2 s only while the link monitor is down).
  const source = cfg.sourceBinding
    ? withPodInterfaces(clusterSource, {
        nodeName: cfg.nodeName,
        scanner: createPodInterfaceScanner(runner, cfg.podBridge, log),
        monitor: createLinkMonitor(runner),
        log,
        rescanMs: 2_000,
        safetyRescanMs: 30_000,
        unboundRescanMs: 100,
      })
    : clusterSource;
  const calc = new Calculator(calcConfig(cfg, names));
  const dataplane = createDataplane({
    runner,
    names,
    families: cfg.families,
    backend,
    ipvs: cfg.ipvs,
    log,
    lockRetry,
    onMetric: {
      step: (step, seconds, ok) => {
        metrics.applyDuration.observe({ step }, seconds);
        if (!ok) metrics.errors.inc({ reason: `dataplane_${step}` });
      },
      retry: onRetry,
    },
  });
  // Chains or sets named like Weir's that Weir did not write (Felix's): refuse to run at all.
  await dataplane.checkOwnership();
  if (cfg.audit.notice !== undefined) log.info({ file: cfg.audit.file }, cfg.audit.notice);
  // The audit log is a side stage: it reads calc's catalog and the model's pods, and never
  // holds up the loop (its reader and file retry on their own).
  const audit = cfg.audit.enabled
    ? createAuditLog({
        config: { ...cfg.audit, node: cfg.nodeName },
        catalog: calc.auditCatalog,
        registry: metrics.registry,
        log,
        onError: (err) => metrics.errors.inc({ reason: err instanceof WeirError ? err.code : 'audit' }),
      })
    : undefined;
  // Status goes back to the cluster only when the cluster is the source.
  let reporting: Reporting | undefined;
  let wrote = false;
  const reconciler = new Reconciler({
    calc,
    dataplane,
    log,
    metrics,
    debounceMs: cfg.debounceMs,
    retryMinMs: cfg.retryMinMs,
    retryMaxMs: cfg.retryMaxMs,
    resyncIntervalMs: cfg.resyncIntervalMs,
    hookCheckIntervalMs: cfg.hookCheckIntervalMs,
    tidyDelayMs: cfg.tidyDelayMs,
    collectGarbage,
    firstComputeSlice: cfg.firstComputeSlice,
    cut: {
      dataplane,
      targets: () => calc.cutTargets(cfg.cutExisting),
      judge: () => judgeByCalc(calc, names, cfg.podBridge),
    },
    onPass: (outcome) => {
      if (outcome.ok && !wrote) {
        wrote = true;
        deps.onFirstWrite?.();
      }
      reporting?.onPass(outcome);
    },
  });
  if (kubeConfig) {
    reporting = startReporting({
      kubeConfig,
      nodeName: cfg.nodeName,
      calc,
      log,
      metrics,
      synced: () => reconciler.synced,
      counts: () => dataplane.status(),
      problems,
    });
  }

  let requestExit: (why: string) => void = () => {};
  const exitRequested = new Promise<string>((resolve) => {
    requestExit = resolve;
  });
  let sourceStarted = false;
  let stoppingEnforcement: Promise<void> | undefined;
  // A removal waits for the start-up to finish, so no write of the start-up lands after it.
  let startedUp: () => void = () => {};
  const startup = new Promise<void>((resolve) => {
    startedUp = resolve;
  });
  const removal =
    kubeConfig && cfg.daemonSet
      ? await startRemovalWatch({
          kubeConfig,
          daemonSet: cfg.daemonSet,
          log,
          remove: async (token) => {
            await startup;
            log.warn({ token }, `uninstall ${token}: this node stops enforcing and removes every rule and set of Weir's`);
            await stopEnforcing();
            const stats = await dataplane.cleanup();
            reporting?.removed(token);
            log.info({ token, ...stats }, 'removed everything Weir owned');
          },
          calledOff: (token) => requestExit(`the uninstall ${token} was called off (its annotation is gone): starting over to enforce policy again`),
        })
      : undefined;

  let server: Awaited<ReturnType<typeof startHealthServer>> | undefined;
  if (cfg.metricsAddr) {
    server = await startHealthServer(cfg.metricsAddr, metrics.registry, {
      health: () => (removal?.isRemoved() ? { healthy: true, reason: 'Removed' } : reconciler.health()),
      readiness: () => (removal?.isRemoved() ? { ready: false, revision: '', reason: 'Removed' } : reconciler.readiness()),
    });
    log.info({ addr: cfg.metricsAddr, host: server.host, port: server.port }, `serving /metrics, /healthz and /readyz on ${server.host}:${server.port}`);
  }

  if (removal?.pendingAtStart != null) {
    log.warn({ token: removal.pendingAtStart }, 'the DaemonSet asks for an uninstall: enforcing nothing on this node');
    startedUp();
    return { reconciler, calc, metrics, port: server?.port, exitRequested, stop: stopAll };
  }
  // The fail-closed skeleton on a fresh node: the only write before the source is synced.
  await reconciler.start();
  await audit?.start();
  try {
    sourceStarted = true;
    await source.start((batch) => {
      audit?.applyModel(batch.events.filter((e): e is ModelEvent => e.kind !== 'PodInterface'));
      reconciler.onBatch(batch);
    });
  } catch (err) {
    await audit?.stop();
    await reconciler.stop();
    startedUp();
    await removal?.stop();
    await reporting?.stop();
    server?.server.close();
    throw err;
  }
  startedUp();
  log.info({ node: cfg.nodeName, families: cfg.families, prefix: cfg.chainPrefix }, 'agent started');

  return {
    reconciler,
    calc,
    metrics,
    port: server?.port,
    exitRequested,
    stop: stopAll,
  };

  /** The source, the loop and the audit log, once: a removal stops them before the process does. */
  function stopEnforcing(): Promise<void> {
    stoppingEnforcement ??= (async () => {
      if (sourceStarted) await source.stop();
      await reconciler.stop();
      await audit?.stop();
    })();
    return stoppingEnforcement;
  }

  async function stopAll(): Promise<void> {
    await removal?.stop();
    await stopEnforcing();
    await reporting?.stop();
    await new Promise<void>((resolve) => (server ? server.server.close(() => resolve()) : resolve()));
    server?.server.closeAllConnections();
  }
}

function createKubeSourceFor(cfg: AgentConfig, kubeConfig: KubeConfig, log: Logger, metrics: Metrics, collect: ((compact: boolean) => void) | undefined): Source {
  return createKubeSource({
    kubeConfig,
    nodeName: cfg.nodeName,
    log,
    timings: { watchdogMs: cfg.watchIdleTimeoutMs, relistMs: [cfg.relistIntervalMs, 2 * cfg.relistIntervalMs] },
    onWatchEvent: (e) => {
      if (e.type === 'event' || e.type === 'bookmark') metrics.watchEvents.inc({ kind: e.kind, type: e.type });
      if (e.type === 'restart' || e.type === 'watchdog' || e.type === 'relist') metrics.watchRestarts.inc({ kind: e.kind, reason: e.type });
      if (e.type === 'error') log.warn({ kind: e.kind, detail: e.detail }, 'watch error; restarting with backoff');
      if (e.type === 'listed') log.debug({ kind: e.kind }, `${e.kind} listed: ${e.detail}`);
    },
    startList:
      collect &&
      listHeapGuard(collect, {
        onCollect: (before, after, ms) => log.debug({ heapUsedMB: [mb(before), mb(after)], ms: Math.round(ms) }, 'collected garbage while lists arrive'),
      }),
  });
}

const mb = (bytes: number): number => Math.round(bytes / 2 ** 20);
