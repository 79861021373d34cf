// What layered writes (nf_tables, additions only: planLayeredChains) leave behind for a later
// full write, the tidy: chains layered or no longer desired, each with the rules it shadows,
// and sets no longer desired that a shadowed rule may still name.

import type { Dirty } from '../calc/desired.ts';
import type { Family } from '../model/types.ts';

/** Rules per family that layered writes may leave shadowed before a write is made in full: it
 *  bounds what the kernel holds beyond the desired state while changes leave no quiet second
 *  for a tidy (what a busy node shadows: docs/design/dataplane.md, "Layered writes"). */
export const DEFAULT_MAX_SHADOWED_RULES = 10_000;

export interface Ledger {
  /** Chains a layered write left in family `f`, each with how many of its rules it shadows. */
  oweChains(f: Family, chains: ReadonlyMap<string, number>): void;
  /** Sets a layered write did not destroy. */
  oweSets(names: readonly string[]): void;
  /** The owed chains of family `f`, each with the rules it shadows. */
  shadowed(f: Family): ReadonlyMap<string, number>;
  /** How many more rules layered writes may shadow in family `f`. */
  budget(f: Family): number;
  /** Everything owed, as work for a full write; the ledger is empty after. */
  settle(): Dirty;
  /** Forgets what is owed: a kernel read or a cleanup makes it moot. */
  clear(): void;
  /** Chains and sets owed. */
  pending(): number;
}

interface Owed {
  readonly shadowed: Record<Family, Map<string, number>>;
  readonly sets: Map<string, 'all'>;
}
const nothingOwed = (): Owed => ({ shadowed: { 4: new Map(), 6: new Map() }, sets: new Map() });

export function createLedger(maxShadowedRules: number = DEFAULT_MAX_SHADOWED_RULES): Ledger {
  let owed = nothingOwed();
  return {
    oweChains(f, chains) {
      for (const [name, rules] of chains) owed.shadowed[f].set(name, rules);
    },
    oweSets(names) {
      for (const name of names) owed.sets.set(name, 'all');
    },
    shadowed: (f) => owed.shadowed[f],
    budget: (f) => maxShadowedRules - [...owed.shadowed[f].values()].reduce((a, b) => a + b, 0),
    settle() {
      const work: Dirty = { sets: owed.sets, chains: { 4: new Set(owed.shadowed[4].keys()), 6: new Set(owed.shadowed[6].keys()) } };
      owed = nothingOwed();
      return work;
    },
    clear() {
      owed = nothingOwed();
    },
    pending: () => owed.shadowed[4].size + owed.shadowed[6].size + owed.sets.size,
  };
}
