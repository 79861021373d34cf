// How `helm uninstall` reaches the agents and the controller: its pre-delete hook (`weir
// uninstall`, ./uninstall.ts) annotates the agents' DaemonSet, which both watch by name. An
// agent that sees the annotation removes every rule and set of Weir's from its node and says so
// in its NodePolicyStatus; the controller stops writing and lets go of its Lease. A DaemonSet
// that is deleted says nothing: deletion follows the hook, and a rolling update must keep rules.

import type { KubeClient } from '../kube/client.ts';
import { isStatus } from '../kube/client.ts';
import { rawRefOf } from '../kube/collection.ts';
import { watchCollection } from '../kube/side-watch.ts';
import type { Codec } from '../kube/collection.ts';
import type { Logger } from '../log.ts';
import { type DaemonSetRef, daemonSetPath, uninstallTokenOf } from './daemonset-ref.ts';

/** What the DaemonSet says at start-up: an uninstall token, null for none, or 'gone' when
 *  the DaemonSet no longer exists (the release is being deleted). Any other answer (403, the
 *  API server down) is thrown: the caller enforces as usual, which is the safe default. */
export async function readUninstallToken(client: KubeClient, ref: DaemonSetRef): Promise<string | null | 'gone'> {
  try {
    return uninstallTokenOf(await client.send({ method: 'GET', path: daemonSetPath(ref) }));
  } catch (err) {
    if (isStatus(err, 404)) return 'gone';
    throw err;
  }
}

export interface UninstallSignalOptions {
  readonly client: KubeClient;
  readonly log: Logger;
  readonly daemonSet: DaemonSetRef;
  /** The token when annotated, null when the DaemonSet is there without it. Not called when
   *  the DaemonSet is deleted. */
  readonly onChange: (token: string | null) => void;
}

const codec: Codec<string | null> = {
  decode(raw) {
    const ref = rawRefOf(raw, true);
    return { key: ref.name, name: ref.name, value: uninstallTokenOf(raw), warnings: [] };
  },
  same: (a, b) => a === b,
  ref: (raw) => rawRefOf(raw, true),
};

/** Lists and watches the one DaemonSet until `signal` aborts; never rejects. */
export function watchUninstallSignal(o: UninstallSignalOptions, signal: AbortSignal): Promise<void> {
  return watchCollection(
    { kind: 'DaemonSet', path: `/apis/apps/v1/namespaces/${encodeURIComponent(o.daemonSet.namespace)}/daemonsets`, fieldSelector: `metadata.name=${o.daemonSet.name}` },
    codec,
    { client: o.client, log: o.log },
    {
      change: (_name, token) => {
        if (token !== undefined) o.onChange(token);
      },
      listed: () => {},
    },
    signal,
  );
}
