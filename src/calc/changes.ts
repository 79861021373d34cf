// What the current batch changed: the set registry and the chain store record into one log,
// which the calculator hands out as the batch's Dirty.

import type { Family } from '../model/types.ts';
import type { Dirty } from './desired.ts';
import { emptyDirty } from './desired.ts';

export class Changes {
  #dirty: Dirty = emptyDirty();

  /** A set entered or left the kernel, or must be rewritten whole. */
  wholeSet(name: string): void {
    this.#dirty.sets.set(name, 'all');
  }

  /** One member of a set the kernel holds may have come or gone. */
  member(name: string, member: string): void {
    const cur = this.#dirty.sets.get(name);
    if (cur === 'all') return;
    if (cur) cur.add(member);
    else this.#dirty.sets.set(name, new Set([member]));
  }

  chain(family: Family, name: string): void {
    this.#dirty.chains[family].add(name);
  }

  /** Everything recorded since the last take. */
  take(): Dirty {
    const d = this.#dirty;
    this.#dirty = emptyDirty();
    return d;
  }
}
