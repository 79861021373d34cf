// `weir uninstall`, the chart's pre-delete hook: tells every agent to remove Weir's rules from
// its node (./uninstall-signal.ts), waits until each node's NodePolicyStatus says it has, then
// removes what no agent may write: the NetworkPolicyStatus objects (once the controller has let
// go of its Lease, so none is written again) and that Lease. A node that does not confirm in
// time is named, with the one command that cleans it; the uninstall goes on regardless, since
// the other nodes are already open and a stuck hook would hold the whole release.

import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { KubeConfig } from '@kubernetes/client-node';
import { createKubeClient, describe as describeError, isStatus, type KubeClient, MERGE_PATCH } from '../kube/client.ts';
import { isRecord } from '../records.ts';
import type { Logger } from '../log.ts';
import { nodeStatusListPath, policyStatusListPath, policyStatusPath } from '../status/bodies.ts';
import { type DaemonSetRef, daemonSetPath, UNINSTALL_ANNOTATION } from './daemonset-ref.ts';

export interface UninstallConfig {
  readonly daemonSet: DaemonSetRef;
  /** The controller's Lease: NetworkPolicyStatus is deleted once nobody holds it. */
  readonly lease: { readonly namespace: string; readonly name: string };
  readonly timeoutMs: number;
  /** For the command that cleans a node by hand. */
  readonly image: string;
  /** The agents' flags that `weir cleanup` must be given too, when not the defaults. */
  readonly cleanupFlags: readonly string[];
}

export interface UninstallReport {
  readonly token: string;
  readonly removed: readonly string[];
  /** Nodes whose agent did not confirm, each with the command that cleans it. */
  readonly unconfirmed: readonly { readonly node: string; readonly command: string }[];
  readonly statusesDeleted: number;
}

const POLL_MS = 1_000;

export async function runUninstall(kubeConfig: KubeConfig, cfg: UninstallConfig, log: Logger): Promise<UninstallReport> {
  const client = createKubeClient(kubeConfig);
  try {
    const token = `${new Date().toISOString().slice(0, 19).replace(/[-:T]/g, '')}-${randomBytes(3).toString('hex')}`;
    const deadline = Date.now() + cfg.timeoutMs;
    const ds = `${cfg.daemonSet.namespace}/${cfg.daemonSet.name}`;
    try {
      await client.send({ method: 'PATCH', path: daemonSetPath(cfg.daemonSet), contentType: MERGE_PATCH, body: { metadata: { annotations: { [UNINSTALL_ANNOTATION]: token } } } });
      log.info({ token, daemonSet: ds }, `told the agents of DaemonSet ${ds} to remove Weir's rules (uninstall ${token})`);
    } catch (err) {
      if (!isStatus(err, 404)) throw err;
      log.warn({ daemonSet: ds }, `DaemonSet ${ds} does not exist: no agent to tell; nodes that still hold rules are named below`);
    }

    let pending = await unconfirmedNodes(client, token);
    while (pending.length > 0 && Date.now() < deadline) {
      await sleep(POLL_MS);
      pending = await unconfirmedNodes(client, token);
    }
    const all = await listNames(client, nodeStatusListPath());
    const removed = all.filter((n) => !pending.includes(n));
    log.info({ nodes: removed.length }, `${removed.length} of ${all.length} nodes removed Weir's rules`);
    const unconfirmed = pending.map((node) => ({
      node,
      command: `kubectl debug node/${node} -n ${cfg.daemonSet.namespace} --profile=netadmin --image=${cfg.image} --arguments-only -- cleanup${cfg.cleanupFlags.map((f) => ` ${f}`).join('')}`,
    }));
    for (const u of unconfirmed) {
      log.error(u, `node ${u.node}: its agent did not confirm within ${cfg.timeoutMs / 1000} s that it removed Weir's rules, so they may still drop traffic there; clean it with: ${u.command}`);
    }

    const free = await waitForFreeLease(client, cfg.lease, deadline);
    if (!free)
      log.warn({ lease: `${cfg.lease.namespace}/${cfg.lease.name}` }, 'the controller still holds its Lease: NetworkPolicyStatus objects are deleted anyway, and may be written again until it stops');
    let statusesDeleted = 0;
    for (const ref of await listRefs(client, policyStatusListPath())) {
      if (await deleteIgnoringMissing(client, policyStatusPath(ref.namespace, ref.name))) statusesDeleted++;
    }
    await deleteIgnoringMissing(client, leasePath(cfg.lease));
    log.info({ statusesDeleted }, `deleted ${statusesDeleted} NetworkPolicyStatus objects and the controller's Lease`);
    return { token, removed, unconfirmed, statusesDeleted };
  } finally {
    await client.close();
  }
}

/** Nodes with a NodePolicyStatus (an agent ran there) that have not confirmed this uninstall. */
async function unconfirmedNodes(client: KubeClient, token: string): Promise<string[]> {
  const out: string[] = [];
  await client.list({ method: 'GET', path: nodeStatusListPath() }, (item) => {
    const status = isRecord(item) ? item.status : undefined;
    if (!isRecord(status) || status.removedFor !== token) out.push(refOf(item).name);
  });
  return out.sort();
}

async function waitForFreeLease(client: KubeClient, lease: UninstallConfig['lease'], deadline: number): Promise<boolean> {
  for (;;) {
    let held = false;
    try {
      const spec = (await client.send({ method: 'GET', path: leasePath(lease) })) as { spec?: { holderIdentity?: string; renewTime?: string; leaseDurationSeconds?: number } };
      const s = spec.spec ?? {};
      const expires = Date.parse(s.renewTime ?? '') + (s.leaseDurationSeconds ?? 0) * 1000;
      held = Boolean(s.holderIdentity) && !(expires < Date.now());
    } catch (err) {
      if (!isStatus(err, 404)) throw err;
    }
    if (!held) return true;
    if (Date.now() >= deadline) return false;
    await sleep(POLL_MS);
  }
}

function leasePath(lease: UninstallConfig['lease']): string {
  return `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(lease.namespace)}/leases/${encodeURIComponent(lease.name)}`;
}

async function deleteIgnoringMissing(client: KubeClient, path: string): Promise<boolean> {
  try {
    await client.send({ method: 'DELETE', path });
    return true;
  } catch (err) {
    if (isStatus(err, 404)) return false;
    throw new Error(`DELETE ${path}: ${describeError(err)}`);
  }
}

async function listNames(client: KubeClient, path: string): Promise<string[]> {
  return (await listRefs(client, path)).map((r) => r.name);
}

async function listRefs(client: KubeClient, path: string): Promise<{ namespace: string; name: string }[]> {
  const out: { namespace: string; name: string }[] = [];
  await client.list({ method: 'GET', path }, (item) => out.push(refOf(item)));
  return out;
}

function refOf(item: unknown): { namespace: string; name: string } {
  const md = isRecord(item) && isRecord(item.metadata) ? item.metadata : {};
  return { namespace: typeof md.namespace === 'string' ? md.namespace : '', name: typeof md.name === 'string' ? md.name : '' };
}
