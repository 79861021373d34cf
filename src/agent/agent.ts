// The composition root: builds names, calc, dataplane, source, reconciler and the health
// server in one place. Order matters: the source starts last, so its first batch finds the
// loop ready; nothing is written before that batch says the source is synced.

import { KubeConfig } from '@kubernetes/client-node';
import { readFile } from 'node:fs/promises';
import { Calculator, makeNames } from '../calc/index.ts';
import { createDataplane, execaRunner, type CommandRunner } from '../dataplane/index.ts';
import { ConfigError, PreconditionError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { createMetrics, type Metrics } from '../metrics/index.ts';
import { startHealthServer } from '../metrics/server.ts';
import { createKubeSource, createManifestSource } from '../sources/index.ts';
import { createPodInterfaceScanner, withPodInterfaces } from '../sources/pod-interfaces.ts';
import type { Source } from '../sources/types.ts';
import type { AgentConfig } from './config.ts';
import { markBits } from './config.ts';
import { Reconciler } from './reconciler.ts';
import { startReporting, type Reporting } from './reporting.ts';
import type { NodeProblem } from '../status/index.ts';

export interface AgentDeps {
  readonly log: Logger;
  readonly runner?: CommandRunner;
  readonly source?: Source;
  readonly metrics?: Metrics;
}

export interface RunningAgent {
  readonly reconciler: Reconciler;
  readonly calc: Calculator;
  readonly metrics: Metrics;
  /** The health server's port, when one was asked for. */
  readonly port: number | undefined;
  stop(): Promise<void>;
}

export async function startAgent(cfg: AgentConfig, deps: AgentDeps): Promise<RunningAgent> {
  const { log } = deps;
  const runner = deps.runner ?? execaRunner();
  const metrics = deps.metrics ?? createMetrics();
  // Construction does no I/O, so a wrong source configuration is reported before anything runs.
  const kubeConfig = deps.source || cfg.manifestsDir ? null : loadKubeConfig(cfg);
  const clusterSource =
    deps.source ??
    (kubeConfig ? createKubeSourceFor(cfg, kubeConfig, log, metrics) : createManifestSource({ dir: cfg.manifestsDir, log, debounceMs: cfg.debounceMs }));
  const problems = await preflight(runner, cfg, log);

  const names = makeNames(cfg.chainPrefix);
  // Each local pod's address is bound to its bridge port, learned from this node's kernel.
  const source = cfg.sourceBinding
    ? withPodInterfaces(clusterSource, {
        nodeName: cfg.nodeName,
        scanner: createPodInterfaceScanner(runner, cfg.podBridge, log),
        log,
        rescanMs: 2_000,
        unboundRescanMs: 100,
      })
    : clusterSource;
  const calc = new Calculator({
    nodeName: cfg.nodeName,
    names,
    families: cfg.families,
    marks: markBits(cfg.markMask),
    podBridge: cfg.podBridge,
    allowAction: cfg.allowAction,
    sourceBinding: cfg.sourceBinding,
  });
  const dataplane = createDataplane({
    runner,
    names,
    families: cfg.families,
    backend: cfg.backend,
    log,
    lockRetry: { attempts: cfg.lockRetries, delayMs: cfg.lockRetryDelayMs },
    onMetric: {
      step: (step, seconds, ok) => {
        metrics.applyDuration.observe({ step }, seconds);
        if (!ok) metrics.errors.inc({ reason: `dataplane_${step}` });
      },
      retry: (info) => {
        metrics.commandRetries.inc({ command: info.tool });
        log.warn(info, 'xtables lock held; retrying');
      },
    },
  });
  // Chains or sets named like Weir's that Weir did not write (Felix's): refuse to run at all.
  await dataplane.checkOwnership();
  // Status goes back to the cluster only when the cluster is the source.
  let reporting: Reporting | undefined;
  const reconciler = new Reconciler({
    calc,
    dataplane,
    log,
    metrics,
    debounceMs: cfg.debounceMs,
    retryMinMs: cfg.retryMinMs,
    retryMaxMs: cfg.retryMaxMs,
    resyncIntervalMs: cfg.resyncIntervalMs,
    onPass: (outcome) => reporting?.onPass(outcome),
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

  let server: Awaited<ReturnType<typeof startHealthServer>> | undefined;
  if (cfg.metricsAddr) {
    server = await startHealthServer(cfg.metricsAddr, metrics.registry, {
      healthy: () => true,
      readiness: () => reconciler.readiness(),
    });
    log.info({ addr: cfg.metricsAddr, port: server.port }, 'serving /metrics, /healthz and /readyz');
  }

  reconciler.start();
  try {
    await source.start((batch) => reconciler.onBatch(batch));
  } catch (err) {
    await reconciler.stop();
    await reporting?.stop();
    server?.server.close();
    throw err;
  }
  log.info({ node: cfg.nodeName, families: cfg.families, prefix: cfg.chainPrefix }, 'agent started');

  return {
    reconciler,
    calc,
    metrics,
    port: server?.port,
    async stop() {
      await source.stop();
      await reconciler.stop();
      await reporting?.stop();
      await new Promise<void>((resolve) => (server ? server.server.close(() => resolve()) : resolve()));
      server?.server.closeAllConnections();
    },
  };
}

/** The cluster's configuration: the kubeconfig when given, else in-cluster. */
function loadKubeConfig(cfg: AgentConfig): KubeConfig {
  if (!cfg.kubeconfig && !process.env.KUBERNETES_SERVICE_HOST) {
    throw new ConfigError(['not running in a cluster (KUBERNETES_SERVICE_HOST is unset): pass --kubeconfig or --manifests']);
  }
  const kubeConfig = new KubeConfig();
  try {
    if (cfg.kubeconfig) kubeConfig.loadFromFile(cfg.kubeconfig);
    else kubeConfig.loadFromCluster();
  } catch (err) {
    throw new ConfigError([`cannot load ${cfg.kubeconfig ? `kubeconfig ${cfg.kubeconfig}` : 'the in-cluster configuration'}: ${(err as Error).message}`]);
  }
  return kubeConfig;
}

function createKubeSourceFor(cfg: AgentConfig, kubeConfig: KubeConfig, log: Logger, metrics: Metrics): Source {
  return createKubeSource({
    kubeConfig,
    nodeName: cfg.nodeName,
    log,
    timings: { watchdogMs: cfg.watchIdleTimeoutMs, relistMs: [cfg.relistIntervalMs, 2 * cfg.relistIntervalMs] },
    onWatchEvent: (e) => {
      if (e.type === 'event' || e.type === 'bookmark') metrics.watchEvents.inc({ kind: e.kind, type: e.type });
      if (e.type === 'restart' || e.type === 'watchdog' || e.type === 'relist') metrics.watchRestarts.inc({ kind: e.kind, reason: e.type });
      if (e.type === 'error') log.warn({ kind: e.kind, detail: e.detail }, 'watch error; restarting with backoff');
    },
  });
}

/** Fails early, with a clear message, when the host lacks what Weir needs. */
async function preflight(runner: CommandRunner, cfg: AgentConfig, log: Logger): Promise<NodeProblem[]> {
  const problems: NodeProblem[] = [];
  const missing: string[] = [];
  for (const [cmd, args] of [['ipset', ['version']], ['iptables-restore', ['--version']]] as const) {
    const r = await runner.run(cmd, args).catch((err: unknown) => ({ exitCode: -1, stdout: '', stderr: String(err) }));
    if (r.exitCode !== 0) missing.push(`${cmd}: ${r.stderr.trim().split('\n').pop() || `exit ${r.exitCode}`}`);
  }
  if (missing.length > 0) {
    throw new PreconditionError(
      `Weir needs iptables and ipset, run as root (CAP_NET_ADMIN):\n  - ${missing.join('\n  - ')}`,
    );
  }
  // Same-node pods talk across the cni0 bridge; only with this sysctl do those frames
  // traverse FORWARD, where Weir's chains are.
  for (const f of cfg.families) {
    const file = `/proc/sys/net/bridge/bridge-nf-call-${f === 4 ? 'iptables' : 'ip6tables'}`;
    const v = await readFile(file, 'utf8').catch(() => 'missing');
    if (v.trim() !== '1') {
      const message = `${file} is ${v.trim()}, not 1: traffic between pods of the same node bypasses policy`;
      log.warn({ file, value: v.trim() }, message);
      problems.push({ reason: 'BrNetfilterDisabled', message });
    }
  }
  return problems;
}
