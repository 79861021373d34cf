// What the source tests share: a source whose batches the test pushes by hand, a running pod
// of a node, and a logger that keeps its warnings.

import { silentLogger } from '../../src/log.ts';
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

/** A silent logger that keeps its warnings. */
export function warningsOf() {
  const warnings: string[] = [];
  const log = silentLogger();
  log.warn = ((_o: unknown, msg: string) => {
    warnings.push(msg);
  }) as typeof log.warn;
  return { log, warnings };
}
