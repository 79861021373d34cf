// The desired chains of both families; a write that changes nothing is not recorded.

import type { Family } from '../model/types.ts';
import type { Changes } from './changes.ts';
import type { Rule } from './desired.ts';

export class ChainStore {
  readonly byFamily = { 4: new Map<string, readonly Rule[]>(), 6: new Map<string, readonly Rule[]>() };
  readonly #changes: Changes;

  constructor(changes: Changes) {
    this.#changes = changes;
  }

  has(f: Family, name: string): boolean {
    return this.byFamily[f].has(name);
  }

  set(f: Family, name: string, rules: readonly Rule[]): void {
    const cur = this.byFamily[f].get(name);
    if (cur && sameRules(cur, rules)) return;
    this.byFamily[f].set(name, rules);
    this.#changes.chain(f, name);
  }

  delete(f: Family, name: string): void {
    if (this.byFamily[f].delete(name)) this.#changes.chain(f, name);
  }
}

function sameRules(a: readonly Rule[], b: readonly Rule[]): boolean {
  return a === b || (a.length === b.length && JSON.stringify(a) === JSON.stringify(b));
}
