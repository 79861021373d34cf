// The agents' DaemonSet as the uninstall signal names it. Pure.

import { isRecord } from '../records.ts';

/** On the agents' DaemonSet: the uninstall under way, by its token. */
export const UNINSTALL_ANNOTATION = 'weir.dev/uninstall';

export interface DaemonSetRef {
  readonly namespace: string;
  readonly name: string;
}

/** `NAMESPACE/NAME`, as the --daemonset flag takes it. */
export function parseDaemonSetRef(text: string): DaemonSetRef | null {
  const m = /^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\/([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$/.exec(text);
  return m ? { namespace: m[1]!, name: m[3]! } : null;
}

export function daemonSetPath(ref: DaemonSetRef): string {
  return `/apis/apps/v1/namespaces/${encodeURIComponent(ref.namespace)}/daemonsets/${encodeURIComponent(ref.name)}`;
}

/** The token of the uninstall a DaemonSet object asks for, or null. */
export function uninstallTokenOf(raw: unknown): string | null {
  const annotations = isRecord(raw) && isRecord(raw.metadata) ? raw.metadata.annotations : undefined;
  const token = isRecord(annotations) ? annotations[UNINSTALL_ANNOTATION] : undefined;
  return typeof token === 'string' && token !== '' ? token : null;
}
