// Flags and environment variables: every flag --some-flag is also WEIR_SOME_FLAG.
// Parsing collects every problem and reports them together.

import { parseArgs } from 'node:util';
import { defaultConfig, validateConfig, type AgentConfig, type Backend } from '../agent/config.ts';
import { type ControllerConfig, DEFAULT_CONTROLLER_LEASE_NAME } from '../controller/controller.ts';
import { ConfigError } from '../errors.ts';
import { parseDaemonSetRef } from '../lifecycle/daemonset-ref.ts';
import type { UninstallConfig } from '../lifecycle/uninstall.ts';
import type { Family } from '../model/types.ts';

export const FLAGS = {
  'node-name': { type: 'string', help: 'name of this node (pods with spec.nodeName equal to it are policed here)' },
  manifests: { type: 'string', help: 'directory of *.yaml, *.yml, *.json manifests (Namespaces, Nodes, Pods, NetworkPolicies) to enforce instead of the API server' },
  kubeconfig: { type: 'string', help: 'kubeconfig file for out-of-cluster use (default: in-cluster service account)' },
  'metrics-addr': { type: 'string', help: 'HOST:PORT serving /metrics, /healthz, /readyz (default: off; ":PORT" is loopback, 0.0.0.0:PORT every interface)' },
  'chain-prefix': { type: 'string', help: 'prefix of every chain and set Weir owns (default cali)' },
  'mark-mask': { type: 'string', help: 'packet mark bits Weir may use (default 0xffff0000; accept = lowest bit, pass = next)' },
  families: { type: 'string', help: 'IP families to police: 4, 6 or 4,6 (default 4,6)' },
  backend: { type: 'string', help: 'iptables backend: auto, nft or legacy (default auto: follow kube-proxy hint chains)' },
  'pod-bridge': { type: 'string', help: 'bridge the local pods hang off (default cni0): traffic through it that belongs to no known local pod is dropped' },
  'allow-action': { type: 'string', help: 'ACCEPT (default) or RETURN: what happens to a connection policy allows; RETURN lets later FORWARD rules still apply' },
  'source-binding': { type: 'string', help: "on (default) or off: bind each local pod's address to its bridge port (needs CAP_SYS_ADMIN and /var/run/netns)" },
  ipvs: { type: 'string', help: "kube-proxy's IPVS mode: auto (default: while kube-ipvs0 exists), on or off; also hooks OUTPUT, where IPVS sends Service traffic" },
  audit: {
    type: 'string',
    help: 'on or off (default off, on when --audit-log-file or --audit-stdout is given): write NFLOG rules where weir.dev/audit annotations (or --audit-default) ask, and log each connection they see',
  },
  'audit-default': { type: 'string', help: 'off (default), deny or all: the audit level of policies whose own and namespace annotations say nothing' },
  'audit-log-file': { type: 'string', help: 'the audit log, JSON lines (default /var/log/weir/audit.log); given without --audit, it turns the audit log on' },
  'audit-log-max-size': { type: 'string', help: 'bytes an audit log file may reach before it is rotated (default 10485760)' },
  'audit-log-max-files': { type: 'string', help: 'rotated audit log files kept (default 5)' },
  'audit-stdout': { type: 'boolean', help: 'write every audit line to standard output too; given without --audit, it turns the audit log on' },
  'audit-nflog-group': { type: 'string', help: "NFLOG group of the audit rules (default 77; 1 to 3 are Calico's)" },
  'audit-rate': {
    type: 'string',
    help: "cap on audit lines written per second on this node, bursts of twice that (default 1000); what it refuses is counted by namespace. The kernel's own ceiling is ten times it",
  },
  'audit-rate-per-source': {
    type: 'string',
    help: 'kernel-side cap on audit events per second from one source address, bursts of twice that (default 100): one noisy pod cannot spend the cap of the others',
  },
  'log-level': { type: 'string', help: 'fatal, error, warn, info, debug, trace or silent (default info)' },
  'debounce-ms': { type: 'string', help: 'a batch within this many ms of the previous one waits this long, so bursts coalesce; one after a quiet spell is written at once (default 20)' },
  'resync-interval': { type: 'string', help: 'seconds between full kernel read-backs that repair drift (default 30)' },
  'favour-memory': {
    type: 'boolean',
    help: 'once the first full state is written, let V8 hold less memory at rest, for more garbage collections during changes and a little more CPU at rest: for a very large cluster (figures in docs/design/agent.md)',
  },
  'first-compute-slice': {
    type: 'string',
    help: "objects per step of the first full state's compute, with a full garbage collection between steps (default 50000); fewer lower the start's peak memory on a large cluster, for more time before enforcement",
  },
  'cut-existing': {
    type: 'boolean',
    help: 'after each write, delete the tracked connections of every local pod that its new rules deny (default: only for pods opted in by the weir.dev/cut-existing annotation on their namespace or a policy selecting them)',
  },
  'tidy-delay': { type: 'string', help: 'seconds without writes before the rules a change left shadowed (nf_tables) are removed (default 1)' },
  'hook-check-interval': {
    type: 'string',
    help: "seconds between cheap checks of Weir's hooks, which resync at once when another program removed or moved one (default 5; 0: off; own chains are compared by the resync)",
  },
  'watch-idle-timeout': { type: 'string', help: 'seconds a watch may stay silent (not even a bookmark) before it is restarted (default 180)' },
  'relist-interval': { type: 'string', help: 'seconds between full relists that repair missed watch events (default 300, randomised up to 2x)' },
  daemonset: { type: 'string', help: "NAMESPACE/NAME of the agents' DaemonSet, watched for `weir uninstall` (the chart passes it; default: none)" },
  'uninstall-timeout': { type: 'string', help: 'uninstall only: seconds to wait for every node to confirm it removed the rules (default 60)' },
  'cleanup-image': { type: 'string', help: 'uninstall only: the image named in the command that cleans a node by hand (default weir:latest)' },
  identity: { type: 'string', help: "controller only: this replica's name in the Lease (default: the host name; the chart passes the pod name)" },
  'lease-namespace': { type: 'string', help: 'controller only: namespace of the Lease that elects the replica writing status (default kube-system)' },
  'lease-name': { type: 'string', help: 'controller only: name of that Lease (default weir-controller)' },
  examples: { type: 'string', help: 'demo only: the manifests directory to load (default: the examples/ shipped with Weir)' },
  once: { type: 'boolean', help: 'demo only: print the matrix once and exit instead of watching' },
  help: { type: 'boolean', help: 'show help' },
} as const;

export type FlagName = keyof typeof FLAGS;

export function envName(flag: string): string {
  return `WEIR_${flag.toUpperCase().replaceAll('-', '_')}`;
}

export interface Parsed {
  readonly command: string | undefined;
  readonly values: Partial<Record<FlagName, string | boolean>>;
  readonly rest: readonly string[];
}

export function parse(argv: readonly string[], env: NodeJS.ProcessEnv): Parsed {
  const options = Object.fromEntries(Object.entries(FLAGS).map(([k, v]) => [k, { type: v.type }])) as Record<FlagName, { type: 'string' | 'boolean' }>;
  const parsed = (() => {
    try {
      return parseArgs({ args: [...argv], options, allowPositionals: true, strict: true });
    } catch (err) {
      throw new ConfigError([(err as Error).message]);
    }
  })();
  const values: Partial<Record<FlagName, string | boolean>> = {};
  for (const name of Object.keys(FLAGS) as FlagName[]) {
    const fromEnv = env[envName(name)];
    const v =
      (parsed.values as Record<string, string | boolean | undefined>)[name] ??
      (fromEnv !== undefined && FLAGS[name].type === 'boolean' ? ['1', 'true', 'yes'].includes(fromEnv.toLowerCase()) : fromEnv);
    if (v !== undefined) values[name] = v;
  }
  const [command, ...rest] = parsed.positionals;
  return { command, values, rest };
}

export function toConfig(values: Parsed['values'], need: { nodeName: boolean; manifestsDir: boolean }): AgentConfig {
  const d = defaultConfig();
  const problems: string[] = [];
  const str = (k: FlagName) => (typeof values[k] === 'string' ? (values[k] as string) : undefined);
  const num = (k: FlagName, fallback: number, scale = 1) => {
    const s = str(k);
    if (s === undefined) return fallback;
    const n = Number(s);
    if (!Number.isFinite(n) || n < 0) {
      problems.push(`--${k} (${envName(k)}) must be a non-negative number, got "${s}"`);
      return fallback;
    }
    return n * scale;
  };
  const onOff = (k: FlagName, fallback: boolean) => {
    const s = str(k)?.toLowerCase();
    if (s === undefined) return fallback;
    if (s !== 'on' && s !== 'off') problems.push(`--${k} (${envName(k)}) must be on or off, got "${s}"`);
    return s === 'on' || (s !== 'off' && fallback);
  };
  let families: Family[] = [...d.families];
  const fam = str('families');
  if (fam !== undefined) {
    const parts = fam.split(',').map((x) => x.trim());
    if (parts.some((p) => p !== '4' && p !== '6')) problems.push(`--families must be 4, 6 or 4,6, got "${fam}"`);
    else families = [...new Set(parts.map(Number) as Family[])].sort();
  }
  let markMask = d.markMask;
  const mm = str('mark-mask');
  if (mm !== undefined) {
    markMask = Number(mm);
    if (!/^(0x[0-9a-f]{1,8}|\d+)$/i.test(mm) || !Number.isFinite(markMask)) problems.push(`--mark-mask must be a number like 0xffff0000, got "${mm}"`);
  }
  const cfg: AgentConfig = {
    ...d,
    nodeName: str('node-name') ?? d.nodeName,
    manifestsDir: str('manifests') ?? d.manifestsDir,
    kubeconfig: str('kubeconfig') ?? d.kubeconfig,
    daemonSet: str('daemonset') ?? d.daemonSet,
    metricsAddr: str('metrics-addr') ?? d.metricsAddr,
    chainPrefix: str('chain-prefix') ?? d.chainPrefix,
    markMask,
    families,
    backend: (str('backend') ?? d.backend) as Backend,
    logLevel: str('log-level') ?? d.logLevel,
    podBridge: str('pod-bridge') ?? d.podBridge,
    allowAction: (str('allow-action')?.toUpperCase() ?? d.allowAction) as AgentConfig['allowAction'],
    sourceBinding: onOff('source-binding', d.sourceBinding),
    debounceMs: num('debounce-ms', d.debounceMs),
    resyncIntervalMs: num('resync-interval', d.resyncIntervalMs, 1000),
    hookCheckIntervalMs: num('hook-check-interval', d.hookCheckIntervalMs, 1000),
    tidyDelayMs: num('tidy-delay', d.tidyDelayMs, 1000),
    watchIdleTimeoutMs: num('watch-idle-timeout', d.watchIdleTimeoutMs, 1000),
    relistIntervalMs: num('relist-interval', d.relistIntervalMs, 1000),
    favourMemory: values['favour-memory'] === true || d.favourMemory,
    firstComputeSlice: num('first-compute-slice', d.firstComputeSlice),
    ipvs: (str('ipvs')?.toLowerCase() ?? d.ipvs) as AgentConfig['ipvs'],
    cutExisting: values['cut-existing'] === true || d.cutExisting,
    audit: {
      ...auditSwitch(str('audit') === undefined ? undefined : onOff('audit', d.audit.enabled), str('audit-log-file') !== undefined, values['audit-stdout'] === true, d.audit.enabled),
      defaultLevel: (str('audit-default')?.toLowerCase() ?? d.audit.defaultLevel) as AgentConfig['audit']['defaultLevel'],
      nflogGroup: num('audit-nflog-group', d.audit.nflogGroup),
      rate: num('audit-rate', d.audit.rate),
      ratePerSource: num('audit-rate-per-source', d.audit.ratePerSource),
      file: str('audit-log-file') ?? d.audit.file,
      maxSize: num('audit-log-max-size', d.audit.maxSize),
      maxFiles: num('audit-log-max-files', d.audit.maxFiles),
      stdout: values['audit-stdout'] === true || d.audit.stdout,
    },
  };
  try {
    const valid = validateConfig(cfg, need);
    if (problems.length > 0) throw new ConfigError(problems);
    return valid;
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError([...problems, ...err.problems.filter((p) => !problems.includes(p))]);
    throw err;
  }
}

/** Whether the audit log is on, and what the agent says about it at start. A log file or
 *  --audit-stdout asks for the audit log: without --audit it turns it on; beside --audit off
 *  nothing is written, and the agent says so rather than ignore it in silence. */
function auditSwitch(flag: boolean | undefined, file: boolean, stdout: boolean, fallback: boolean): { enabled: boolean; notice?: string } {
  if (!file && !stdout) return { enabled: flag ?? fallback };
  if (flag === undefined) {
    const given = [file && '--audit-log-file (WEIR_AUDIT_LOG_FILE)', stdout && '--audit-stdout (WEIR_AUDIT_STDOUT)'].filter(Boolean).join(' and ');
    return { enabled: true, notice: `audit log on: ${given} ${file && stdout ? 'were' : 'was'} given without --audit (WEIR_AUDIT)` };
  }
  if (!flag) {
    const where = [file && '--audit-log-file', stdout && 'standard output (--audit-stdout)'].filter(Boolean).join(' nor to ');
    return { enabled: false, notice: `audit log off (--audit off): nothing will be written to ${where}` };
  }
  return { enabled: true };
}

/** The controller's configuration; it shares --kubeconfig, --metrics-addr and --log-level. */
export function toControllerConfig(values: Parsed['values'], hostname: string): ControllerConfig & { readonly logLevel: string } {
  const str = (k: FlagName) => (typeof values[k] === 'string' ? (values[k] as string) : undefined);
  const identity = str('identity') ?? hostname;
  const problems: string[] = [];
  if (identity === '') problems.push(`--identity (${envName('identity')}) must not be empty`);
  const leaseName = str('lease-name') ?? DEFAULT_CONTROLLER_LEASE_NAME;
  const leaseNamespace = str('lease-namespace') ?? 'kube-system';
  for (const [k, v] of [
    ['lease-name', leaseName],
    ['lease-namespace', leaseNamespace],
  ] as const) {
    if (!/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(v)) problems.push(`--${k} (${envName(k)}) must be a Kubernetes object name, got "${v}"`);
  }
  const metricsAddr = str('metrics-addr');
  const ds = str('daemonset');
  const daemonSet = ds === undefined || ds === '' ? undefined : parseDaemonSetRef(ds);
  if (daemonSet === null) problems.push(`--daemonset (${envName('daemonset')}) must be NAMESPACE/NAME, got "${ds}"`);
  if (problems.length > 0) throw new ConfigError(problems);
  return {
    kubeconfig: str('kubeconfig'),
    identity,
    leaseName,
    leaseNamespace,
    metricsAddr: metricsAddr === '' ? undefined : metricsAddr,
    logLevel: str('log-level') ?? 'info',
    ...(daemonSet ? { daemonSet } : {}),
  };
}

/** The uninstall hook's configuration; the controller's Lease defaults to the chart's name in
 *  the DaemonSet's namespace. */
export function toUninstallConfig(values: Parsed['values']): UninstallConfig & { readonly kubeconfig: string | undefined; readonly logLevel: string } {
  const str = (k: FlagName) => (typeof values[k] === 'string' ? (values[k] as string) : undefined);
  const problems: string[] = [];
  const ds = str('daemonset') ?? '';
  const daemonSet = parseDaemonSetRef(ds);
  if (daemonSet === null) problems.push(`--daemonset (${envName('daemonset')}) is required as NAMESPACE/NAME, got "${ds}"`);
  const timeout = str('uninstall-timeout') ?? '60';
  if (!/^\d+$/.test(timeout) || Number(timeout) < 1) problems.push(`--uninstall-timeout (${envName('uninstall-timeout')}) must be a whole number of seconds, at least 1, got "${timeout}"`);
  // The agents' own parser: the flags cleanup needs, checked, and named only when not defaults.
  let cleanupFlags: string[] = [];
  try {
    const agent = toConfig(values, { nodeName: false, manifestsDir: false });
    const d = defaultConfig();
    cleanupFlags = [
      ...(agent.chainPrefix === d.chainPrefix ? [] : [`--chain-prefix=${agent.chainPrefix}`]),
      ...(agent.families.join(',') === d.families.join(',') ? [] : [`--families=${agent.families.join(',')}`]),
      ...(agent.backend === d.backend ? [] : [`--backend=${agent.backend}`]),
    ];
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }
  if (problems.length > 0 || daemonSet === null) throw new ConfigError(problems);
  return {
    kubeconfig: str('kubeconfig'),
    logLevel: str('log-level') ?? 'info',
    daemonSet,
    lease: { namespace: str('lease-namespace') ?? daemonSet.namespace, name: str('lease-name') ?? DEFAULT_CONTROLLER_LEASE_NAME },
    timeoutMs: Number(timeout) * 1000,
    image: str('cleanup-image') ?? 'weir:latest',
    cleanupFlags,
  };
}

export function usage(): string {
  const lines = [
    'Usage: weir <command> [flags]',
    '',
    'Commands:',
    "  agent    --node-name NAME [--kubeconfig F]  enforce the cluster's NetworkPolicies on this node (in-cluster config by default)",
    '  agent    --node-name NAME --manifests DIR   enforce the NetworkPolicies of a manifests directory instead, watching it',
    '  render   --node-name NAME --manifests DIR   print the ipset and iptables payloads the agent would write, and exit',
    '  controller [--kubeconfig F] [--identity N]  write NetworkPolicyStatus and policy Events for the cluster (one replica leads)',
    '  cleanup                                      remove every chain, hook rule and ipset Weir owns, nothing else',
    "  uninstall --daemonset NS/NAME               tell every agent to remove Weir's rules, wait for them, delete the policy statuses (helm's pre-delete hook)",
    '  demo                                         a simulated Flannel node in network namespaces, enforcing examples/',
    '',
    'Flags (each also settable as an environment variable):',
  ];
  for (const [name, f] of Object.entries(FLAGS)) lines.push(`  --${name.padEnd(16)} ${envName(name).padEnd(22)} ${f.help}`);
  return lines.join('\n');
}
