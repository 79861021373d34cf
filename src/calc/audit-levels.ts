// What a policy's rules log: its own annotation, else its namespace's, else the default.
// A ClusterNetworkPolicy's: its own annotation, else the default.

import type { AuditLevel, CompiledClusterNetworkPolicy, CompiledPolicy } from '../model/types.ts';

export class AuditLevels {
  readonly #default: AuditLevel;
  /** Namespace -> its weir.dev/audit level, for namespaces that set one. */
  readonly #byNamespace = new Map<string, AuditLevel>();

  constructor(defaultLevel: AuditLevel) {
    this.#default = defaultLevel;
  }

  /** Records a namespace's level (null: it sets none); false when that is no change. */
  setNamespace(ns: string, level: AuditLevel | null): boolean {
    if ((this.#byNamespace.get(ns) ?? null) === level) return false;
    if (level === null) this.#byNamespace.delete(ns);
    else this.#byNamespace.set(ns, level);
    return true;
  }

  of(p: CompiledPolicy): AuditLevel {
    return p.audit ?? this.#byNamespace.get(p.namespace) ?? this.#default;
  }

  /** A ClusterNetworkPolicy belongs to no namespace: its own annotation, else the default. */
  ofCluster(p: CompiledClusterNetworkPolicy): AuditLevel {
    return p.audit ?? this.#default;
  }
}
