// The cheap drift check: whether the kernel holds Weir's hooks where the record has them. These
// are what other programs move in normal running (a rule inserted at the top of FORWARD); own
// chains' content is compared by the periodic resync.

import type { Names } from '../calc/names.ts';
import type { Family } from '../model/types.ts';
import type { IpvsMode } from './ipvs.ts';
import { HOOK_CHAINS, TABLE } from './render.ts';
import { acceptHookIn, hookIsRight, ownHookIn, sameHook, type AppliedState } from './state.ts';
import type { Tools } from './tools.ts';

/**
 * The mangle hooks first, alone, and the filter accept hook as recorded (or none); and, under
 * --ipvs auto, kube-ipvs0 where it was at the last kernel read. It lists just those builtin
 * chains, since `iptables-save` translates every rule of a table.
 */
export async function hooksAsRecorded(tools: Tools, names: Names, families: readonly Family[], recorded: AppliedState, ipvs: IpvsMode): Promise<boolean> {
  const familyMatches = async (f: Family) => {
    const want = recorded.families[f];
    const hooked = HOOK_CHAINS.filter((builtin) => want.hooks[builtin].specs.length > 0);
    const [filterForward, ...builtins] = await Promise.all([tools.iptables.listChain(f, 'filter', 'FORWARD'), ...hooked.map((builtin) => tools.iptables.listChain(f, TABLE, builtin))]);
    if (builtins.some((rules) => !hookIsRight(ownHookIn(rules, names), names.forward))) return false;
    const accept = acceptHookIn(filterForward);
    return want.acceptHook.specs.length > 0 ? sameHook(accept, want.acceptHook) : accept.specs.length === 0;
  };
  const [nowIpvs, ...matches] = await Promise.all([ipvs.detect(), ...families.map(familyMatches)]);
  return nowIpvs === ipvs.wanted && matches.every(Boolean);
}
