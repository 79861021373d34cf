// `weir render`: the exact payloads the agent would write on a node that holds none of
// Weir's state yet. It runs the real dataplane against a recorder that answers every read
// with an empty kernel, so render and agent can never disagree on syntax or order.

import { Calculator, makeNames } from '../calc/index.ts';
import { createDataplane, recordingRunner } from '../dataplane/index.ts';
import type { AgentConfig } from '../agent/config.ts';
import { markBits } from '../agent/config.ts';
import type { Logger } from '../log.ts';
import { compareStrings } from '../model/order.ts';
import { INVALID_CLUSTER_POLICY_EFFECT, INVALID_POLICY_EFFECT, policyErrorLines } from '../model/policy-errors.ts';
import type { CompiledClusterNetworkPolicy } from '../model/types.ts';
import { createManifestSource } from '../sources/index.ts';
import type { SourceBatch } from '../sources/types.ts';

export interface Rendered {
  readonly ipset: string;
  readonly iptables: { readonly 4?: string; readonly 6?: string };
  readonly policies: ReturnType<Calculator['policyReports']>;
  /** The ClusterNetworkPolicies that are invalid, sorted by name. */
  readonly invalidClusterPolicies: readonly CompiledClusterNetworkPolicy[];
}

export async function loadOnce(dir: string, log: Logger): Promise<SourceBatch> {
  const source = createManifestSource({ dir, log });
  let first: SourceBatch | undefined;
  await source.start((b) => (first ??= b));
  await source.stop();
  if (!first) throw new Error(`manifest source for ${dir} delivered nothing`);
  return first;
}

export async function render(cfg: AgentConfig, log: Logger): Promise<Rendered> {
  const batch = await loadOnce(cfg.manifestsDir, log);
  const names = makeNames(cfg.chainPrefix);
  // Offline there is no kernel to learn bridge ports from: render shows unbound dispatch.
  const calc = new Calculator({ nodeName: cfg.nodeName, names, families: cfg.families, marks: markBits(cfg.markMask), podBridge: cfg.podBridge, allowAction: cfg.allowAction });
  const recorder = recordingRunner();
  const dataplane = createDataplane({ runner: recorder, names, families: cfg.families, backend: 'nft', log });
  dataplane.markDirty(calc.applyEvents(batch.events));
  await dataplane.resync(calc.desired);
  const out: { ipset: string; iptables: { 4?: string; 6?: string } } = { ipset: '', iptables: {} };
  for (const call of recorder.calls) {
    if (call.input === undefined) continue;
    if (call.cmd === 'ipset') out.ipset += call.input;
    else if (/^ip6?tables/.test(call.cmd)) out.iptables[call.cmd.startsWith('ip6') ? 6 : 4] = call.input;
  }
  const invalidClusterPolicies = calc
    .takeClusterPolicyChanges()
    .flatMap(({ policy }) => (policy && policy.errors.length > 0 ? [policy] : []))
    .sort((a, b) => compareStrings(a.name, b.name));
  return { ...out, policies: calc.policyReports(), invalidClusterPolicies };
}

export function formatRendered(r: Rendered): string {
  const parts = [`# ipset restore\n${r.ipset}`];
  if (r.iptables[4] !== undefined) parts.push(`# iptables-restore --noflush (IPv4)\n${r.iptables[4]}`);
  if (r.iptables[6] !== undefined) parts.push(`# ip6tables-restore --noflush (IPv6)\n${r.iptables[6]}`);
  const invalid = r.policies.filter((p) => p.errors.length > 0);
  for (const p of invalid) {
    parts.push(
      `# policy ${p.key} is invalid and ${INVALID_POLICY_EFFECT}:\n${policyErrorLines(p.errors)
        .map((l) => `#   ${l}`)
        .join('\n')}\n`,
    );
  }
  for (const p of r.invalidClusterPolicies) {
    const lines = policyErrorLines(p.errors).map((l) => `#   ${l}`);
    parts.push(`# ClusterNetworkPolicy ${p.name} is invalid and ${INVALID_CLUSTER_POLICY_EFFECT}:\n${lines.join('\n')}\n`);
  }
  return parts.join('\n');
}
