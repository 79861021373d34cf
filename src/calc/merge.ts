// Merged peers: alternatives that are one peer set plus protocol and ports, grouped by those
// ports, so that one rule with one set (a union of the peers) stands for all of them. Valid
// wherever the alternatives grouped share one outcome, so their order among them is moot.

import type { Family } from '../model/types.ts';
import { compareStrings } from '../model/order.ts';
import type { Action, Match, Rule } from './desired.ts';
import type { AllowAlternative, SetSpec } from './rules.ts';
import { mergeable, setKey } from './rules.ts';

interface Group {
  readonly rest: readonly Match[];
  readonly dir: 'src' | 'dst';
  /** Some alternative of the group has no peer: any address. */
  any: boolean;
  readonly parts: Map<string, SetSpec>;
}

/** One rule per port signature of the mergeable alternatives, sorted by signature; the others
 *  are left to the caller. `useSet` names (and acquires) the set of a group. */
export function mergedRules(alts: Iterable<AllowAlternative>, family: Family, action: Action, comment: string, useSet: (spec: SetSpec) => string): Rule[] {
  const groups = new Map<string, Group>();
  for (const alt of alts) {
    const m = mergeable(alt);
    if (!m) continue;
    const sig = JSON.stringify([m.peer?.dir ?? '', m.rest]);
    let g = groups.get(sig);
    if (!g) groups.set(sig, (g = { rest: m.rest, dir: m.peer?.dir ?? 'dst', any: false, parts: new Map() }));
    if (m.peer === null) g.any = true;
    else g.parts.set(setKey(m.peer.spec), m.peer.spec);
  }
  const out: Rule[] = [];
  for (const [, g] of [...groups].sort(([a], [b]) => compareStrings(a, b))) {
    if (g.any) {
      out.push({ matches: g.rest, action, comment });
      continue;
    }
    const parts = [...g.parts].sort(([a], [b]) => compareStrings(a, b)).map(([, spec]) => spec);
    const spec: SetSpec = parts.length === 1 ? parts[0] : { family, peer: { kind: 'union', key: `union|${parts.map(setKey).join('\n')}`, parts } };
    out.push({ matches: [{ kind: 'set', set: useSet(spec), dir: g.dir }, ...g.rest], action, comment });
  }
  return out;
}
