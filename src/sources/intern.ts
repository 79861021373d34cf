// One shared instance per equal value, for what the pods of a cluster repeat: their namespace,
// node and phase, and most of all their labels and ports, which every replica of a workload has
// alike. A pod is held for as long as it exists, so every byte per pod counts at scale.
// Each pool is bounded (model/pool.ts).

import type { ContainerPort, Labels } from '../model/types.ts';
import { DEFAULT_POOL_LIMIT, Pool } from '../model/pool.ts';

export interface Interner {
  string(s: string): string;
  labels(labels: Labels): Labels;
  ports(ports: readonly ContainerPort[]): readonly ContainerPort[];
}

/** Shares nothing: for a few objects (a manifest, a test). */
export const NO_INTERNING: Interner = { string: (s) => s, labels: (l) => l, ports: (p) => p };

export class ValueInterner implements Interner {
  readonly #strings: Pool<string>;
  readonly #labels: Pool<Labels>;
  readonly #ports: Pool<readonly ContainerPort[]>;

  constructor(limit = DEFAULT_POOL_LIMIT) {
    this.#strings = new Pool(limit);
    this.#labels = new Pool(limit);
    this.#ports = new Pool(limit);
  }

  string(s: string): string {
    return this.#strings.get(s, s);
  }

  /** Equal labels (same keys and values, in the same order) share one object. Keyed by their
   *  JSON, which no two different maps share, whatever characters they hold. */
  labels(labels: Labels): Labels {
    return this.#labels.get(JSON.stringify(labels), labels);
  }

  ports(ports: readonly ContainerPort[]): readonly ContainerPort[] {
    return this.#ports.get(JSON.stringify(ports), ports);
  }
}
