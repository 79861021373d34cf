// What the source tests share: a source whose batches the test pushes by hand, and a running
// pod of a node.

import type { Pod } from '../../src/model/types.ts';
import type { Source, SourceBatch } from '../../src/sources/types.ts';

export function manualSource(): Source & { push(b: SourceBatch): void } {
  let sink: (b: SourceBatch) => void = () => {};
  return {
    async start(onBatch) {
      sink = onBatch;
    },
    async stop() {},
    push: (b) => sink(b),
  };
}

export const localPod = (uid: string, ips: string[], nodeName = 'node-a'): Pod => ({
  uid,
  namespace: 'ns',
  name: uid,
  labels: {},
  nodeName,
  hostNetwork: false,
  phase: 'Running',
  terminating: false,
  ips,
  ports: [],
});
