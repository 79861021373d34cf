// Agent configuration: a plain value with named defaults and one validation that reports
// every problem at once. Flags and environment variables both land here (cli/).

import { makeNames, validatePrefix } from '../calc/names.ts';
import type { AuditConfig, CalcConfig } from '../calc/config.ts';
import type { Names } from '../calc/names.ts';
import { parseDaemonSetRef } from '../lifecycle/daemonset-ref.ts';
import type { AuditLogConfig } from '../audit/index.ts';
import type { IpvsChoice } from '../dataplane/index.ts';
import { AUDIT_LEVELS } from '../model/annotations.ts';
import type { AuditLevel, Family } from '../model/types.ts';
import { ConfigError } from '../errors.ts';

export type Backend = 'auto' | 'nft' | 'legacy';

export interface AgentConfig {
  readonly nodeName: string;
  /** Directory of manifests (the embedded default source). Empty: watch the API server. */
  readonly manifestsDir: string;
  /** Out-of-cluster kubeconfig; empty means in-cluster configuration. */
  readonly kubeconfig: string;
  /** `NAMESPACE/NAME` of the agents' DaemonSet, watched for an uninstall; empty: none. */
  readonly daemonSet: string;
  /** HOST:PORT for /metrics, /healthz, /readyz (":PORT" is loopback); '' disables the server. */
  readonly metricsAddr: string;
  readonly chainPrefix: string;
  /** Mark bits Weir may use; must not overlap kube-proxy's 0x4000 and 0x8000. */
  readonly markMask: number;
  readonly families: readonly Family[];
  readonly backend: Backend;
  readonly logLevel: string;
  /** Quiet time after an event before writing, so a burst becomes one write. */
  readonly debounceMs: number;
  /** Backoff after a failed apply: doubles from min to max. */
  readonly retryMinMs: number;
  readonly retryMaxMs: number;
  /** Full read-back of the kernel to repair drift made by other programs. */
  readonly resyncIntervalMs: number;
  /** A cheap read of Weir's hooks between resyncs, so that a hook another program removed or
   *  moved is back within seconds; 0 turns it off. */
  readonly hookCheckIntervalMs: number;
  /** Quiet time before the tidy write removes what layered writes left (nf_tables). */
  readonly tidyDelayMs: number;
  /** A watch silent this long (not even a bookmark) is restarted. */
  readonly watchIdleTimeoutMs: number;
  /** Full relist of every watched kind, to repair missed events (randomised up to 2x). */
  readonly relistIntervalMs: number;
  /** Once the first full state is written, V8 grows its heap less and gives pages back sooner
   *  (node-flags.ts AFTER_START_V8_FLAGS): less memory at rest on a very large cluster, for
   *  more major GCs during changes and more CPU at rest. */
  readonly favourMemory: boolean;
  /** Objects per compute of the first full state, with a full collection between computes
   *  when V8's is exposed (--expose-gc): a lower peak RSS at start-up on a large cluster. */
  readonly firstComputeSlice: number;
  /** Retries of one iptables/ipset command when the xtables lock is held. */
  readonly lockRetries: number;
  readonly lockRetryDelayMs: number;
  /** How long one iptables-restore waits for the xtables lock before it fails and is retried
   *  (legacy backend; whole seconds). */
  readonly lockWaitSeconds: number;
  /** The bridge local pods hang off (Flannel's cni0): traffic entering or leaving through it
   *  that belongs to no known local pod is dropped. */
  readonly podBridge: string;
  /** What the top chain does with a connection policy allows: ACCEPT ends FORWARD there;
   *  RETURN lets the administrator's own FORWARD rules after Weir's hook still apply. */
  readonly allowAction: 'ACCEPT' | 'RETURN';
  /** Bind each local pod's address to its bridge port, read from the pod's pinned network
   *  namespace: a pod cannot send with another's address, nor before its port is known. */
  readonly sourceBinding: boolean;
  /** kube-proxy's IPVS mode: also hook OUTPUT, where IPVS-forwarded Service traffic leaves
   *  (auto: while kube-ipvs0 exists). */
  readonly ipvs: IpvsChoice;
  readonly audit: AuditSettings;
  /** Cut, after each write, the tracked connections of every local pod that its new rules deny
   *  (without it, only pods opted in by weir.dev/cut-existing). */
  readonly cutExisting: boolean;
}

/** The audit log: NFLOG rules where annotations ask for them, read back into JSON lines by
 *  the pipeline, whose settings (group, rate, file, rotation, stdout) these are. */
export interface AuditSettings extends Pick<AuditLogConfig, 'nflogGroup' | 'rate' | 'file' | 'maxSize' | 'maxFiles' | 'stdout'> {
  /** Off: no NFLOG rule is written and no reader runs (audit-only policies still never enforce). */
  readonly enabled: boolean;
  /** The level of policies whose own and namespace annotations say nothing. */
  readonly defaultLevel: AuditLevel;
  /** What the agent logs at start about how the flags set the audit log (a log file or
   *  --audit-stdout given without --audit turns it on; beside --audit off nothing is written). */
  readonly notice?: string;
  /** The kernel's cap on audit events a second from one source address (--audit-rate-per-source),
   *  bursts of twice that: under the node's, so one noisy source cannot spend it for the others. */
  readonly ratePerSource: number;
}

/** The kernel's node-wide ceiling on audit events, as a multiple of --audit-rate: above the
 *  pipeline's cap, so that the pipeline, which can name whose lines it refuses, normally does. */
const AUDIT_KERNEL_CEILING_FACTOR = 10;
/** The most that ceiling may be a second: the per-source table it sizes must fit the kernel's
 *  (calc/config.ts, auditLimit). */
const AUDIT_KERNEL_CEILING_MAX = 200_000;

/** kube-proxy's masquerade and drop bits. */
export const KUBE_PROXY_MARKS = 0x4000 | 0x8000;

export function defaultConfig(): AgentConfig {
  return {
    nodeName: '',
    manifestsDir: '',
    kubeconfig: '',
    daemonSet: '',
    metricsAddr: '',
    chainPrefix: 'cali',
    markMask: 0xffff0000,
    families: [4, 6],
    backend: 'auto',
    logLevel: 'info',
    debounceMs: 20,
    retryMinMs: 100,
    retryMaxMs: 10_000,
    resyncIntervalMs: 30_000,
    hookCheckIntervalMs: 5_000,
    tidyDelayMs: 1_000,
    watchIdleTimeoutMs: 180_000,
    relistIntervalMs: 300_000,
    favourMemory: false,
    // About three slices for the 130k objects of bench:agent's cluster.
    firstComputeSlice: 50_000,
    lockRetries: 5,
    lockRetryDelayMs: 200,
    lockWaitSeconds: 5,
    podBridge: 'cni0',
    allowAction: 'ACCEPT',
    sourceBinding: true,
    ipvs: 'auto',
    cutExisting: false,
    audit: { enabled: false, defaultLevel: 'off', nflogGroup: 77, rate: 1000, ratePerSource: 100, file: '/var/log/weir/audit.log', maxSize: 10 << 20, maxFiles: 5, stdout: false },
  };
}

/** The accept bit is the lowest bit of the mask, pass the next one. */
/** The Calculator's configuration as the agent builds it from its flags (weir explain uses the
 *  same, so it judges by the chains the agent would write). */
export function calcConfig(cfg: AgentConfig, names: Names = makeNames(cfg.chainPrefix)): CalcConfig {
  return {
    nodeName: cfg.nodeName,
    names,
    families: cfg.families,
    marks: markBits(cfg.markMask),
    podBridge: cfg.podBridge,
    allowAction: cfg.allowAction,
    sourceBinding: cfg.sourceBinding,
    audit: cfg.audit.enabled ? auditCalcConfig(cfg.audit) : undefined,
  };
}

/** The audit rules' limit: a bucket per source under the kernel's node-wide ceiling. */
function auditCalcConfig(a: AuditSettings): AuditConfig {
  const ceiling = Math.min(AUDIT_KERNEL_CEILING_FACTOR * a.rate, AUDIT_KERNEL_CEILING_MAX);
  return { group: a.nflogGroup, defaultLevel: a.defaultLevel, perSecond: ceiling, burst: 2 * ceiling, perSource: { perSecond: a.ratePerSource, burst: 2 * a.ratePerSource } };
}

export function markBits(mask: number): { accept: number; pass: number } {
  const bits: number[] = [];
  for (let b = 0; b < 32 && bits.length < 2; b++) if ((mask >>> b) & 1) bits.push((1 << b) >>> 0);
  return { accept: bits[0] ?? 0, pass: bits[1] ?? 0 };
}

export function validateConfig(c: AgentConfig, need: { nodeName: boolean; manifestsDir: boolean }): AgentConfig {
  const problems: string[] = [];
  if (need.nodeName && !c.nodeName) problems.push('--node-name (WEIR_NODE_NAME) is required');
  if (need.manifestsDir && !c.manifestsDir) problems.push('--manifests (WEIR_MANIFESTS) is required');
  if (c.manifestsDir && c.kubeconfig) problems.push('--manifests and --kubeconfig exclude each other: choose one source');
  if (c.daemonSet && parseDaemonSetRef(c.daemonSet) === null) problems.push(`--daemonset (WEIR_DAEMONSET) must be NAMESPACE/NAME, got "${c.daemonSet}"`);
  if (c.daemonSet && c.manifestsDir) problems.push('--daemonset needs the cluster as the source, not --manifests');
  const prefixProblem = validatePrefix(c.chainPrefix);
  if (prefixProblem) problems.push(prefixProblem);
  const mask = c.markMask >>> 0;
  if (!Number.isInteger(c.markMask) || c.markMask < 0 || c.markMask > 0xffffffff) {
    problems.push(`mark mask ${c.markMask} must be a 32-bit value such as 0xffff0000`);
  } else {
    if (mask & KUBE_PROXY_MARKS) problems.push(`mark mask 0x${mask.toString(16)} overlaps kube-proxy's bits 0x4000/0x8000`);
    if (popcount(mask) < 2) problems.push(`mark mask 0x${mask.toString(16)} needs at least 2 bits (accept and pass)`);
  }
  if (!/^[A-Za-z0-9_.:-]{1,15}$/.test(c.podBridge)) problems.push(`pod bridge "${c.podBridge}" must be an interface name (1 to 15 letters, digits, _ . : -)`);
  if (c.allowAction !== 'ACCEPT' && c.allowAction !== 'RETURN') problems.push(`allow action "${c.allowAction}" must be ACCEPT or RETURN`);
  if (!['auto', 'on', 'off'].includes(c.ipvs)) problems.push(`ipvs "${c.ipvs}" must be auto, on or off`);
  if (c.families.length === 0) problems.push('at least one IP family (4, 6) must be enabled');
  if (!['auto', 'nft', 'legacy'].includes(c.backend)) problems.push(`backend "${c.backend}" must be auto, nft or legacy`);
  if (!['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].includes(c.logLevel)) {
    problems.push(`log level "${c.logLevel}" must be one of fatal, error, warn, info, debug, trace, silent`);
  }
  for (const [k, v] of [
    ['debounce', c.debounceMs],
    ['retry minimum', c.retryMinMs],
    ['retry maximum', c.retryMaxMs],
    ['resync interval', c.resyncIntervalMs],
    ['hook check interval', c.hookCheckIntervalMs],
    ['tidy delay', c.tidyDelayMs],
    ['watch idle timeout', c.watchIdleTimeoutMs],
    ['relist interval', c.relistIntervalMs],
    ['lock retry delay', c.lockRetryDelayMs],
    ['lock retries', c.lockRetries],
    ['lock wait', c.lockWaitSeconds],
  ] as const) {
    if (!Number.isFinite(v) || v < 0) problems.push(`${k} must be a non-negative number, got ${v}`);
  }
  const a = c.audit;
  if (!AUDIT_LEVELS.includes(a.defaultLevel)) problems.push(`audit default "${a.defaultLevel}" must be one of ${AUDIT_LEVELS.join(', ')}`);
  if (!Number.isInteger(a.nflogGroup) || a.nflogGroup < 4 || a.nflogGroup > 65535) problems.push(`audit NFLOG group ${a.nflogGroup} must be a whole number from 4 to 65535 (1 to 3 are Calico's)`);
  if (!Number.isInteger(a.rate) || a.rate < 1 || a.rate > 100_000) problems.push(`audit rate ${a.rate} must be a whole number of lines per second from 1 to 100000`);
  if (!Number.isInteger(a.ratePerSource) || a.ratePerSource < 1 || a.ratePerSource > 100_000)
    problems.push(`audit rate per source ${a.ratePerSource} must be a whole number of events per second from 1 to 100000`);
  if (a.enabled && !a.file.startsWith('/')) problems.push(`audit log file "${a.file}" must be an absolute path`);
  if (!Number.isInteger(a.maxSize) || a.maxSize < 4096) problems.push(`audit log max size ${a.maxSize} must be a whole number of bytes, at least 4096`);
  if (!Number.isInteger(a.maxFiles) || a.maxFiles < 1) problems.push(`audit log max files ${a.maxFiles} must be a whole number, at least 1`);
  if (!Number.isInteger(c.firstComputeSlice) || c.firstComputeSlice < 1) problems.push(`first compute slice ${c.firstComputeSlice} must be a whole number of objects, at least 1`);
  if (c.retryMaxMs < c.retryMinMs) problems.push(`retry maximum (${c.retryMaxMs} ms) is below the minimum (${c.retryMinMs} ms)`);
  if (problems.length > 0) throw new ConfigError(problems);
  return { ...c, markMask: mask };
}

function popcount(n: number): number {
  let c = 0;
  for (let x = n >>> 0; x; x &= x - 1) c++;
  return c;
}
