// The fail-closed boot guard: before the first sync, a node with no Weir hook gets the hook and
// the chains that name no set (the top and dispatch chains, which then drop all traffic of the
// pod bridge), so no pod talks unpoliced while the first full state is computed.

import type { DesiredDataplane, Rule } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import { acceptMarkOf } from './plan.ts';
import { declareChain, deleteRule, hooksFor, insertAcceptHook, insertHook, renderChain, restorePayload } from './render.ts';
import { familyStateFromSave } from './state.ts';
import type { Tools } from './tools.ts';

/** The chains of a desired dataplane that name no set, per family, and its top chain. */
export interface Skeleton {
  readonly chains: Readonly<Record<Family, readonly (readonly [string, readonly Rule[]])[]>>;
  readonly topChain: string;
}

/** Taken when the guard is asked for: the skeleton references no set, so it is complete
 *  without any ipset write. */
export function skeletonOf(desired: DesiredDataplane): Skeleton {
  const chainsOf = (f: Family) => [...desired.chains[f]].filter(([, rules]) => !rules.some(namesASet));
  return { chains: { 4: chainsOf(4), 6: chainsOf(6) }, topChain: desired.topChain };
}

/** Writes the skeleton in each family whose FORWARD holds no Weir hook; a node that already
 *  holds Weir's rules keeps them. Returns whether it wrote anything. */
export async function guardUnpoliced(tools: Tools, names: Names, families: readonly Family[], skeleton: Skeleton, ipvs: boolean, log: Logger): Promise<boolean> {
  const written: Family[] = [];
  const hooks = hooksFor(skeleton.topChain, ipvs);
  for (const f of families) {
    const found = familyStateFromSave(await tools.iptables.save(f), names);
    // Weir's hook in mangle, or an older Weir's in filter: that node is policed.
    if (found.hooks.FORWARD.specs.length > 0 || found.leftovers.hooks.some((h) => h.chain === 'FORWARD')) continue;
    const chains = skeleton.chains[f];
    const lines: string[] = [];
    for (const [name] of chains) lines.push(declareChain(name));
    for (const [name, rules] of chains) lines.push(...renderChain(name, rules).lines);
    lines.push(...hooks.map(insertHook));
    const mark = acceptMarkOf(new Map(chains), names.accept);
    const filter = [...found.acceptHook.specs.map((spec) => deleteRule('FORWARD', spec)), ...(mark === undefined ? [] : [insertAcceptHook(mark)])];
    await tools.iptables.restore(f, restorePayload(lines, filter));
    written.push(f);
  }
  if (written.length > 0) log.warn({ families: written }, 'no Weir rules on this node yet: pod traffic is dropped until the first full state is enforced');
  return written.length > 0;
}

const namesASet = (r: Rule) => r.matches.some((m) => m.kind === 'set');
