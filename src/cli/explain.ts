// `weir explain SRC DST --port N [--protocol P]`: why a new connection passes or is dropped,
// from the chains calc computes for the nodes of both ends, fed by the agent's own sources (a
// manifests directory, or the API server through the kubeconfig as the agent reads it). Its
// flags are its own, plus the agent's that shape the chains (prefix, marks, bridge, audit).

import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { calcConfig } from '../agent/config.ts';
import type { AgentConfig } from '../agent/config.ts';
import { ConfigError } from '../errors.ts';
import type { Explainer, ExplainConfig, Explanation, ExplainRequest } from '../explain/explain.ts';
import { explainer } from '../explain/explain.ts';
import { formatExplanation, formatNodeChecks } from '../explain/format.ts';
import type { KernelState, NodeCheck } from '../explain/node-check.ts';
import { checksFor, kernelStateOf } from '../explain/node-check.ts';
import { createIpset } from '../dataplane/ipset.ts';
import { createIptables, detectBackend } from '../dataplane/iptables.ts';
import { type CommandRunner, processRunner } from '../exec/runner.ts';
import { ExplainInputError } from '../explain/resolve.ts';
import { createKubeClient } from '../kube/client.ts';
import { loadKubeConfig } from '../kube/kubeconfig.ts';
import type { Logger } from '../log.ts';
import type { Family, ModelEvent, Protocol } from '../model/types.ts';
import { createKubeSource, toNode } from '../sources/index.ts';
import { createPodInterfaceScanner, type PortBindings } from '../sources/pod-interfaces.ts';
import type { SourceBatch } from '../sources/types.ts';
import { envName, FLAGS, type FlagName, toConfig } from './flags.ts';
import { loadOnce } from './render.ts';

/** The agent's flags that change the chains explain computes, read as the agent reads them. */
const AGENT_FLAGS = [
  'node-name',
  'backend',
  'manifests',
  'kubeconfig',
  'chain-prefix',
  'mark-mask',
  'families',
  'pod-bridge',
  'allow-action',
  'source-binding',
  'audit',
  'audit-default',
  'audit-nflog-group',
  'audit-rate',
  'log-level',
] as const satisfies readonly FlagName[];

const OWN_FLAGS = {
  port: { type: 'string', help: 'the destination port, 1 to 65535 (required)' },
  protocol: { type: 'string', help: 'tcp (default), udp or sctp' },
  family: { type: 'string', help: '4 or 6: only that IP family (default: every family both ends have)' },
  output: { type: 'string', short: 'o', help: 'text (default: short and readable) or json' },
  timeout: { type: 'string', help: "seconds to wait for the cluster's lists (default 30)" },
  'node-check': {
    type: 'boolean',
    help: 'on the node named by --node-name, as root: read its kernel (iptables-save, ipset save) and say whether it holds the chains and sets explain judged by, or which part differs (exit 3)',
  },
  help: { type: 'boolean', help: 'show this help' },
} as const;

export function explainUsage(): string {
  const lines = [
    'Usage: weir explain SRC DST --port N [--protocol tcp|udp|sctp] [-o json] [--manifests DIR | --kubeconfig F]',
    '',
    'Why a new connection from SRC to DST passes or is dropped: for each IP family, the egress',
    "verdict at the source's node and the ingress verdict at the destination's, the policies and",
    'rules behind each, and the chain, rule position and sets that decide it, as calc computes',
    'them for the agent. SRC and DST are each a pod (NAMESPACE/NAME, or a NAME one namespace',
    'holds) or an IP address. Exit 0 when explained (whatever the verdict), 2 for bad input, 1 when',
    'the cluster or the kernel cannot be read, 3 when --node-check finds the kernel differs.',
    '',
    'Flags:',
  ];
  for (const [name, f] of Object.entries(OWN_FLAGS)) lines.push(`  --${name.padEnd(18)} ${f.help}`);
  lines.push('', "The agent's flags that shape the chains (each also its WEIR_* environment variable; give the agents' values):");
  for (const name of AGENT_FLAGS) lines.push(`  --${name.padEnd(18)} ${envName(name).padEnd(22)} ${FLAGS[name].help}`);
  return lines.join('\n');
}

export interface ExplainIo {
  readonly stdout: (s: string) => void;
  readonly stderr: (s: string) => void;
}

const processIo: ExplainIo = { stdout: (s) => process.stdout.write(s), stderr: (s) => process.stderr.write(s) };

/** Runs the command; resolves to the exit code (0 explained, 1 failed, 2 bad flags or input). */
export interface ExplainDeps {
  /** How --node-check runs its commands (default: on this host; tests: in a node's netns). */
  readonly runner?: CommandRunner;
}

export async function runExplain(argv: readonly string[], env: NodeJS.ProcessEnv, io: ExplainIo = processIo, deps: ExplainDeps = {}): Promise<number> {
  let parsed: ReturnType<typeof parseFlags>;
  try {
    parsed = parseFlags(argv, env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    io.stderr(`weir explain: ${err.problems.join('\n  ')}\n(weir explain --help lists the flags)\n`);
    return 2;
  }
  if (parsed === 'help') {
    io.stdout(`${explainUsage()}\n`);
    return 0;
  }
  const { agent, request, json, timeoutMs, nodeCheck } = parsed;
  const log = pino({ level: agent.logLevel === 'info' && env[envName('log-level')] === undefined ? 'warn' : agent.logLevel }, pino.destination(2));
  let events: ModelEvent[];
  try {
    events = await loadEvents(agent, timeoutMs, log, (m) => io.stderr(`weir explain: warning: ${m}\n`));
  } catch (err) {
    io.stderr(`weir explain: ${err instanceof Error ? err.message : String(err)}\n`);
    return err instanceof ConfigError ? 2 : 1;
  }
  const runner = deps.runner ?? processRunner();
  // The node's real bridge ports, as its agent scans them: its chains then name them too.
  let ports: PortBindings | undefined;
  if (nodeCheck && agent.sourceBinding) {
    try {
      ports = await createPodInterfaceScanner(runner, agent.podBridge, log).scan();
    } catch (err) {
      io.stderr(`weir explain: cannot read this node's bridge ports for --node-check: ${err instanceof Error ? err.message : String(err)}\n`);
      return 1;
    }
  }
  let ex: Explainer;
  let x: Explanation;
  try {
    ex = explainer(events, explainConfig(agent), ports ? { bridgePorts: { node: agent.nodeName, ports } } : {});
    x = ex(request);
  } catch (err) {
    if (!(err instanceof ExplainInputError)) throw err;
    io.stderr(`weir explain: ${err.message}\n`);
    return 2;
  }
  if (!nodeCheck) {
    io.stdout(json ? `${JSON.stringify(x, null, 2)}\n` : formatExplanation(x));
    return 0;
  }
  let checks: NodeCheck[];
  try {
    const here = x.families.flatMap((f) => f.directions.filter((d) => d.node === agent.nodeName).map((d) => ({ family: f.family, d })));
    const setNames = here.flatMap(({ d }) => d.path.flatMap((p) => p.lookups.map((l) => l.set)));
    const kernel = await readKernel(
      agent,
      here.map((h) => h.family),
      setNames,
      log,
      runner,
    );
    checks = checksFor(x, agent.nodeName, ex.desired(agent.nodeName), (f) => kernel.get(f)!);
  } catch (err) {
    io.stderr(`weir explain: cannot read this node's kernel for --node-check: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
  io.stdout(json ? `${JSON.stringify({ ...x, nodeCheck: checks }, null, 2)}\n` : `${formatExplanation(x)}${formatNodeChecks(agent.nodeName, checks)}`);
  return checks.every((c) => c.same) ? 0 : 3;
}

/** How --node-check reads the node's kernel: iptables-save (mangle) per family and `ipset
 *  save` of each set named (one the kernel lacks is left out), through the agent's runner and
 *  backend choice. */
export async function readKernel(cfg: AgentConfig, families: readonly Family[], setNames: readonly string[], log: Logger, runner: CommandRunner = processRunner()): Promise<Map<Family, KernelState>> {
  const backend = await detectBackend(runner, cfg.backend, log);
  const iptables = createIptables({ runner, backend, log });
  const ipset = createIpset(runner);
  let sets = '';
  for (const name of new Set(setNames)) sets += await ipset.save(name).catch(() => '');
  const out = new Map<Family, KernelState>();
  for (const f of new Set(families)) out.set(f, kernelStateOf(await iptables.save(f), sets));
  return out;
}

type Parsed = { agent: AgentConfig; request: ExplainRequest; json: boolean; timeoutMs: number; nodeCheck: boolean };

function parseFlags(argv: readonly string[], env: NodeJS.ProcessEnv): Parsed | 'help' {
  const options: Record<string, { type: 'string' | 'boolean'; short?: string }> = {};
  for (const name of AGENT_FLAGS) options[name] = { type: FLAGS[name].type };
  for (const [name, f] of Object.entries(OWN_FLAGS)) options[name] = { type: f.type, ...('short' in f ? { short: f.short } : {}) };
  let values: Record<string, string | boolean | undefined>;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({ args: [...argv], options, allowPositionals: true, strict: true }));
  } catch (err) {
    throw new ConfigError([(err as Error).message]);
  }
  if (values.help === true) return 'help';
  const problems: string[] = [];
  // The agent's flags, from the command line or else the agent's environment variables.
  const agentValues: Partial<Record<FlagName, string | boolean>> = {};
  for (const name of AGENT_FLAGS) {
    const v = values[name] ?? env[envName(name)];
    if (v !== undefined) agentValues[name] = v;
  }
  let agent: AgentConfig | undefined;
  try {
    agent = toConfig(agentValues, { nodeName: false, manifestsDir: false });
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }
  if (positionals.length !== 2)
    problems.push(`expected SRC and DST (a pod NAMESPACE/NAME or an IP address each), got ${positionals.length === 0 ? 'none' : positionals.map((p) => `"${p}"`).join(' ')}`);
  const str = (k: keyof typeof OWN_FLAGS) => (typeof values[k] === 'string' ? (values[k] as string) : undefined);
  const portText = str('port');
  const port = Number(portText);
  if (portText === undefined) problems.push('--port is required: policies allow connections by destination port');
  else if (!/^\d+$/.test(portText) || port < 1 || port > 65535) problems.push(`--port must be a number from 1 to 65535, got "${portText}"`);
  const protocolText = (str('protocol') ?? 'tcp').toUpperCase();
  if (!['TCP', 'UDP', 'SCTP'].includes(protocolText)) problems.push(`--protocol must be tcp, udp or sctp, got "${str('protocol')}"`);
  const familyText = str('family');
  if (familyText !== undefined && familyText !== '4' && familyText !== '6') problems.push(`--family must be 4 or 6, got "${familyText}"`);
  const output = str('output') ?? 'text';
  if (output !== 'text' && output !== 'json') problems.push(`--output (-o) must be text or json, got "${output}"`);
  const timeoutText = str('timeout') ?? '30';
  if (!/^\d+$/.test(timeoutText) || Number(timeoutText) < 1) problems.push(`--timeout must be a whole number of seconds, at least 1, got "${timeoutText}"`);
  const nodeCheck = values['node-check'] === true;
  if (nodeCheck && agent && !agent.nodeName) problems.push('--node-check needs --node-name (WEIR_NODE_NAME): the node whose kernel is read');
  if (problems.length > 0 || !agent) throw new ConfigError(problems);
  const request: ExplainRequest = {
    source: positionals[0],
    destination: positionals[1],
    protocol: protocolText as Protocol,
    port,
    ...(familyText ? { family: Number(familyText) as Family } : {}),
  };
  return { agent, request, json: output === 'json', timeoutMs: Number(timeoutText) * 1000, nodeCheck };
}

/** The Calculator's configuration, exactly as the agent builds it from the same flags. */
export function explainConfig(cfg: AgentConfig): ExplainConfig {
  const { nodeName: _, ...rest } = calcConfig(cfg);
  return rest;
}

/** One full view of the cluster: the manifests directory, or the kube source's first batch
 *  (as the controller lists it: no Node) and every Node, whose pod CIDRs place addresses. */
export async function loadEvents(cfg: AgentConfig, timeoutMs: number, log: Logger, warn: (message: string) => void): Promise<ModelEvent[]> {
  if (cfg.manifestsDir) return (await loadOnce(cfg.manifestsDir, log)).events;
  const kubeConfig = loadKubeConfig(cfg.kubeconfig);
  const source = createKubeSource({ kubeConfig, log });
  const client = createKubeClient(kubeConfig);
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the cluster's pods, namespaces and policies were not listed within ${timeoutMs / 1000} s (see --timeout; --log-level info says why)`)), timeoutMs);
  });
  try {
    let first: SourceBatch | undefined;
    await Promise.race([source.start((b) => (first ??= b)), deadline]);
    if (!first) throw new Error('the kube source started without a first batch');
    const batch: SourceBatch = first;
    const nodes: ModelEvent[] = [];
    try {
      await Promise.race([
        client.list({ method: 'GET', path: '/api/v1/nodes' }, (item) => {
          nodes.push({ kind: 'Node', op: 'upsert', object: toNode(item, warn) });
        }),
        deadline,
      ]);
    } catch (err) {
      // Without nodes explain cannot tell a pod CIDR's unknown addresses from outside ones, and
      // the chains lack the fail-closed rules of pod CIDRs: it says so and goes on.
      warn(`cannot list Nodes (${err instanceof Error ? err.message : String(err)}): addresses are placed by pods alone, and no pod CIDR fails closed`);
    }
    return [...batch.events, ...nodes];
  } finally {
    clearTimeout(timer);
    await source.stop();
    await client.close();
  }
}
