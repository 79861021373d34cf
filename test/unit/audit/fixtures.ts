// Model pods and their events, for the audit tests (the address book reads only Pod events).

import type { ModelEvent, Pod } from '../../../src/model/types.ts';

export const pod = (namespace: string, name: string, ips: string[], extra: Partial<Pod> = {}): Pod => ({
  uid: `${namespace}/${name}`,
  namespace,
  name,
  labels: {},
  nodeName: 'node-a',
  hostNetwork: false,
  phase: 'Running',
  terminating: false,
  ips,
  ports: [],
  ...extra,
});
export const up = (p: Pod): ModelEvent => ({ kind: 'Pod', op: 'upsert', object: p });
export const del = (p: Pod): ModelEvent => ({ kind: 'Pod', op: 'delete', uid: p.uid });
