// The contract every source fulfils. The manifest source and the kube source emit the same
// events, so nothing downstream can tell them apart.

import type { CalcEvent, ModelEvent } from '../model/types.ts';

/** A source of the cluster delivers ModelEvents; one wrapped with the node's pod interfaces
 *  (sources/pod-interfaces.ts) also delivers PodInterface events. */
export interface SourceBatch<E extends CalcEvent = ModelEvent> {
  /** Handed over with the batch: its consumer may empty the array as it applies it. */
  readonly events: E[];
  /** True from the batch that completes the source's first full view of the world on.
   *  The agent writes nothing to the kernel before it has seen a synced batch. */
  readonly synced: boolean;
  /** An opaque digest of the input this batch brings the source to (used by /readyz). */
  readonly revision: string;
}

export interface Source<E extends CalcEvent = ModelEvent> {
  /** Starts delivering batches; resolves once watching has begun. The kube source resolves
   *  after its first batch; the manifest source after its first attempt to read, which
   *  delivers nothing when the directory cannot be read (it retries until a full read). */
  start(onBatch: (batch: SourceBatch<E>) => void): Promise<void>;
  stop(): Promise<void>;
}
