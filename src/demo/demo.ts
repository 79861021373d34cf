// `weir demo`: a simulated Flannel cluster in network namespaces (nodes with a cni0 bridge,
// pods serving TCP and UDP), one Weir agent per node, and the connectivity matrix printed
// again each time a manifest in the examples directory changes. Ctrl-C removes everything.

import { watch } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { startAgent, type RunningAgent } from '../agent/agent.ts';
import { defaultConfig, type AgentConfig } from '../agent/config.ts';
import { processRunner, netnsRunner } from '../dataplane/index.ts';
import { ConfigError } from '../errors.ts';
import { createLogger } from '../log.ts';
import type { Pod } from '../model/types.ts';
import { loadOnce } from '../cli/render.ts';
import { createCluster, type Cluster } from '../sim/cluster.ts';
import { registerExitCleanup } from '../sim/cleanup.ts';
import { probeMatrix, renderMatrix } from '../sim/prober.ts';
import { manifestRevision } from '../sources/index.ts';

export const DEFAULT_EXAMPLES = fileURLToPath(new URL('../../examples/', import.meta.url));

export async function runDemo(values: Record<string, string | boolean | undefined>): Promise<number> {
  const dir = typeof values.examples === 'string' ? values.examples : ((values.manifests as string | undefined) ?? DEFAULT_EXAMPLES);
  const log = createLogger(typeof values['log-level'] === 'string' ? values['log-level'] : 'warn');
  if (process.getuid?.() !== 0) throw new ConfigError(['weir demo builds network namespaces and needs root']);

  const first = await loadOnce(dir, log);
  const nodes = first.events.flatMap((e) => (e.kind === 'Node' && e.op === 'upsert' ? [e.object] : []));
  const pods = first.events.flatMap((e) => (e.kind === 'Pod' && e.op === 'upsert' ? [e.object] : [])).filter(simulable);
  if (nodes.length === 0) throw new ConfigError([`${dir} holds no Node objects: the demo builds one simulated node per Node`]);

  console.log(`Building ${nodes.length} nodes and ${pods.length} pods in network namespaces...`);
  const cluster = await createCluster({
    tag: 'wdemo',
    nodes: nodes.map((n) => ({ name: n.name, podCIDRs: n.podCIDRs })),
    pods: pods.map((p) => ({ namespace: p.namespace, name: p.name, node: p.nodeName, ips: p.ips })),
  });
  const agents: RunningAgent[] = [];
  let unregister = () => {};
  const shutdown = async () => {
    unregister();
    await Promise.allSettled(agents.map((a) => a.stop()));
    await cluster.destroy();
  };
  unregister = registerExitCleanup(() => void cluster.destroy());
  try {
    for (const node of cluster.nodes) {
      const cfg: AgentConfig = { ...defaultConfig(), nodeName: node.name, manifestsDir: dir, logLevel: 'warn' };
      agents.push(await startAgent(cfg, { log: log.child({ node: node.name }), runner: netnsRunner(node.netns, processRunner()) }));
    }
    await showMatrix(cluster, agents, dir);
    if (values.once) return 0;
    console.log(`\nWatching ${dir}: edit a policy there and the matrix is printed again. Ctrl-C stops and removes every namespace.`);
    await watchUntilSignal(dir, () => showMatrix(cluster, agents, dir));
  } finally {
    await shutdown();
  }
  console.log('Removed every namespace the demo made.');
  return 0;
}

function simulable(p: Pod): boolean {
  return p.ips.length > 0 && !p.hostNetwork && p.phase === 'Running' && p.nodeName !== '';
}

/** Waits until every agent holds the current content of the directory, then probes. */
async function showMatrix(cluster: Cluster, agents: readonly RunningAgent[], dir: string): Promise<void> {
  const want = await currentRevision(dir);
  const deadline = Date.now() + 10_000;
  while (!agents.every((a) => a.reconciler.readiness().ready && a.reconciler.readiness().revision === want)) {
    if (Date.now() > deadline) {
      console.log('(agents have not caught up yet; showing the matrix anyway)');
      break;
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  const matrix = await probeMatrix(cluster);
  const rules = agents.map((a) => `${a.calc.localPodCount} pods`).join(', ');
  console.log(`\n=== connectivity at ${new Date().toISOString()} (agents: ${rules}) ===`);
  console.log(renderMatrix(matrix));
}

async function currentRevision(dir: string): Promise<string> {
  const { readdir, readFile } = await import('node:fs/promises');
  const names = (await readdir(dir)).filter((n) => /\.(ya?ml|json)$/.test(n)).sort();
  return manifestRevision(await Promise.all(names.map(async (name) => ({ name, content: await readFile(`${dir}/${name}`, 'utf8') }))));
}

function watchUntilSignal(dir: string, onChange: () => Promise<void>): Promise<void> {
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    let busy = Promise.resolve();
    const watcher = watch(dir, () => {
      clearTimeout(timer);
      timer = setTimeout(() => (busy = busy.then(onChange).catch((err: unknown) => console.error(err))), 150);
    });
    const stop = () => {
      watcher.close();
      clearTimeout(timer);
      void busy.then(resolve);
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}
