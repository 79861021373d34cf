// The agent's part of `helm uninstall`: when its DaemonSet carries the uninstall annotation it
// stops enforcing, removes every rule and set of Weir's from the node, and says so in its
// NodePolicyStatus, so that pods keep talking once the DaemonSet is gone. A SIGTERM alone (a
// rolling update, a node drain) never does this: the rules stay, and policy holds.

import type { KubeConfig } from '@kubernetes/client-node';
import { createKubeClient } from '../kube/client.ts';
import { describe as describeError } from '../kube/client.ts';
import { type DaemonSetRef, parseDaemonSetRef } from '../lifecycle/daemonset-ref.ts';
import { readUninstallToken, watchUninstallSignal } from '../lifecycle/uninstall-signal.ts';
import type { Logger } from '../log.ts';

export interface RemovalDeps {
  readonly kubeConfig: KubeConfig;
  /** `NAMESPACE/NAME`, validated by the config. */
  readonly daemonSet: string;
  readonly log: Logger;
  /** Stop enforcing and remove everything; resolves once the node holds nothing of Weir's. */
  readonly remove: (token: string) => Promise<void>;
  /** The annotation went away after a removal: the agent must start again to enforce. */
  readonly calledOff: (token: string) => void;
}

export interface Removal {
  /** Whether the DaemonSet asks for removal already, read once before the first write. */
  readonly pendingAtStart: string | null;
  isRemoved(): boolean;
  stop(): Promise<void>;
}

const CLEANUP_RETRY_MS = 5_000;

export async function startRemovalWatch(d: RemovalDeps): Promise<Removal> {
  const ref = parseDaemonSetRef(d.daemonSet) as DaemonSetRef;
  const log = d.log.child({ component: 'uninstall', daemonSet: d.daemonSet });
  const client = createKubeClient(d.kubeConfig);
  const abort = new AbortController();
  let pendingAtStart: string | null = null;
  try {
    const token = await readUninstallToken(client, ref);
    // Gone: the release is being deleted, and an agent that starts now must not cut pods off.
    pendingAtStart = token === 'gone' ? 'daemonset-deleted' : token;
  } catch (err) {
    log.warn({ err: describeError(err) }, 'cannot read the DaemonSet at start-up: enforcing as usual');
  }
  let removedFor: string | null = null;
  let removing: Promise<void> | null = null;
  const removeOnce = (token: string): void => {
    if (removing !== null) return;
    removedFor = token;
    removing = (async () => {
      for (;;) {
        try {
          await d.remove(token);
          return;
        } catch (err) {
          log.error({ err, token }, `uninstall ${token}: removing Weir's rules failed; retrying in ${CLEANUP_RETRY_MS / 1000} s`);
          await new Promise((r) => setTimeout(r, CLEANUP_RETRY_MS));
          if (abort.signal.aborted) return;
        }
      }
    })();
  };
  if (pendingAtStart !== null) removeOnce(pendingAtStart);
  const watching = watchUninstallSignal(
    {
      client,
      log,
      daemonSet: ref,
      onChange: (token) => {
        if (token !== null) removeOnce(token);
        else if (removedFor !== null && removedFor !== 'daemonset-deleted') d.calledOff(removedFor);
      },
    },
    abort.signal,
  );
  return {
    pendingAtStart,
    isRemoved: () => removedFor !== null,
    async stop() {
      abort.abort();
      await watching;
      await removing;
      await client.close();
    },
  };
}
