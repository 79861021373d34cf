// Removing every chain, hook rule and set Weir owns, and nothing else: `weir cleanup`, and an
// agent leaving a node.

import type { Names } from '../calc/names.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import { declareChain, deleteChain, deleteRule, HOOK_CHAINS, restorePayload, setDestroy } from './render.ts';
import { familyStateFromSave, setsStateFromSave } from './state.ts';
import type { Tools } from './tools.ts';

export interface CleanupStats {
  chainsDeleted: number;
  hooksDeleted: number;
  setsDeleted: number;
}

/** Reads each family's tables and the sets, then removes what carries Weir's mark. */
export async function removeOwn(tools: Tools, names: Names, families: readonly Family[], log: Logger): Promise<CleanupStats> {
  const stats: CleanupStats = { chainsDeleted: 0, hooksDeleted: 0, setsDeleted: 0 };
  for (const f of families) {
    const text = await tools.iptables.save(f);
    // Only what carries Weir's mark: a chain or set merely named like Weir's is not Weir's.
    // Mangle's chains and hooks; in filter the accept hook and an older Weir's objects.
    const mine = familyStateFromSave(text, names);
    const own = [...mine.chains.keys()];
    const hooks = HOOK_CHAINS.flatMap((builtin) => mine.hooks[builtin].specs.map((spec) => deleteRule(builtin, spec)));
    const old = mine.leftovers;
    const filterHooks = [...mine.acceptHook.specs.map((spec) => deleteRule('FORWARD', spec)), ...old.hooks.map((h) => deleteRule(h.chain, h.spec))];
    if (own.length + hooks.length + old.chains.length + filterHooks.length === 0) continue;
    const mangle = own.length + hooks.length > 0 ? [...own.map(declareChain), ...hooks, ...own.map(deleteChain)] : [];
    await tools.iptables.restore(f, restorePayload(mangle, [...old.chains.map(declareChain), ...filterHooks, ...old.chains.map(deleteChain)]));
    stats.chainsDeleted += own.length + old.chains.length;
    stats.hooksDeleted += hooks.length + filterHooks.length;
  }
  const sets = [...setsStateFromSave(await tools.ipset.save(), names).keys()];
  await tools.ipset.restore(sets.map(setDestroy));
  stats.setsDeleted = sets.length;
  log.info({ stats }, 'dataplane cleaned up');
  return stats;
}
