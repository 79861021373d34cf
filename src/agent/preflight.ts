// Start-up checks, before anything is written: the agent refuses to start, with a clear
// message, when the host lacks what Weir needs or cannot write an IP family it was asked to
// police; it warns about what weakens enforcement (br_netfilter off).

import { readFile } from 'node:fs/promises';
import type { Names } from '../calc/index.ts';
import type { CommandRunner, RetryInfo, RetryPolicy } from '../dataplane/index.ts';
import { createIptables, detectBackend, parseSave, type Backend, type BackendChoice } from '../dataplane/iptables.ts';
import { declareChain, deleteChain, restorePayload, TABLE } from '../dataplane/render.ts';
import { PreconditionError, XtablesLockError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import type { NodeProblem } from '../status/index.ts';

export interface PreflightOptions {
  readonly runner: CommandRunner;
  readonly names: Names;
  readonly families: readonly Family[];
  readonly backend: BackendChoice;
  readonly log: Logger;
  readonly lockRetry?: RetryPolicy;
  readonly onRetry?: (info: RetryInfo) => void;
}

export interface PreflightResult {
  /** The backend the rest of the node uses, detected once. */
  readonly backend: Backend;
  /** Node-level problems that weaken enforcement, for the node's status. */
  readonly problems: NodeProblem[];
}

export async function preflight(o: PreflightOptions): Promise<PreflightResult> {
  await requireTools(o.runner);
  const backend = await detectBackend(o.runner, o.backend, o.log);
  await requireWritableFamilies(o, backend);
  return { backend, problems: await bridgeProblems(o.families, o.log) };
}

async function requireTools(runner: CommandRunner): Promise<void> {
  const missing: string[] = [];
  for (const [cmd, args] of [
    ['ipset', ['version']],
    ['iptables-restore', ['--version']],
    // Deletes the tracked flows of addresses pods gave up (dataplane/conntrack.ts).
    ['conntrack', ['--version']],
  ] as const) {
    const r = await runner.run(cmd, args).catch((err: unknown) => ({ exitCode: -1, stdout: '', stderr: String(err) }));
    if (r.exitCode !== 0) missing.push(`${cmd}: ${r.stderr.trim().split('\n').pop() || `exit ${r.exitCode}`}`);
  }
  if (missing.length > 0) {
    throw new PreconditionError(`Weir needs iptables, ipset and conntrack, run as root (CAP_NET_ADMIN):\n  - ${missing.join('\n  - ')}`);
  }
}

/**
 * Every family asked for must be writable now, not at the first write after the source has
 * synced. Refusing is safer than dropping the family: a failing ip6tables does not prove that
 * no IPv6 traffic crosses the node, and a dropped family would let all of it through while the
 * agent reports ready. The operator who knows the node has no IPv6 says so with --families 4.
 *
 * The probe is one restore that declares and deletes a scratch chain of Weir's own in each
 * table Weir writes (mangle for its chains, filter for its accept hook): it leaves the kernel
 * as it found it (nothing Weir enforces is written before the source is
 * synced), and it fails exactly where a real write would.
 */
async function requireWritableFamilies(o: PreflightOptions, backend: Backend): Promise<void> {
  const iptables = createIptables({ runner: o.runner, backend, log: o.log, retry: o.lockRetry, onRetry: o.onRetry });
  const scratch = `${o.names.prefix}-weir-probe`;
  const failures: string[] = [];
  for (const family of o.families) {
    try {
      // Never declare (and so flush) a chain that exists: it is nobody's scratch chain.
      const saved = await iptables.save(family);
      if (parseSave(saved, TABLE).has(scratch) || parseSave(saved, 'filter').has(scratch)) continue;
      const probe = [declareChain(scratch), deleteChain(scratch)];
      await iptables.restore(family, restorePayload(probe, probe));
    } catch (err) {
      // Contention is not a property of the family: the first write retries it, counted.
      if (err instanceof XtablesLockError) {
        o.log.warn({ err, family }, 'xtables lock held during the start-up probe; the first write will retry');
        continue;
      }
      const detail = ((err as { stderr?: string }).stderr ?? (err as Error).message).trim().split('\n')[0];
      failures.push(`IPv${family}: ${detail}`);
      o.log.error({ err, family, backend }, `IPv${family} rules cannot be written on this node`);
    }
  }
  if (failures.length === 0) return;
  const can = o.families.filter((f) => !failures.some((x) => x.startsWith(`IPv${f}:`)));
  throw new PreconditionError(
    [
      `cannot write ${failures.length === 1 ? 'the rules of one IP family' : 'rules'} (${backend} backend):`,
      ...failures.map((f) => `  - ${f}`),
      `Weir refuses to start rather than leave a family unpoliced.`,
      can.length > 0
        ? `If this node has no ${failures.map((f) => f.split(':')[0]).join(' or ')}, start Weir with --families ${can.join(',')} (WEIR_FAMILIES=${can.join(',')}).`
        : 'Check that the agent runs as root with CAP_NET_ADMIN, and the backend (--backend).',
    ].join('\n'),
  );
}

/** Same-node pods talk across the pod bridge; only with this sysctl do those frames traverse
 *  FORWARD, where Weir's chains are. */
async function bridgeProblems(families: readonly Family[], log: Logger): Promise<NodeProblem[]> {
  const problems: NodeProblem[] = [];
  for (const f of families) {
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
