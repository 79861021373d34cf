// Whether this node's kube-proxy runs in IPVS mode: it then holds every Service address on
// the dummy interface kube-ipvs0, and Service traffic crosses INPUT and OUTPUT instead of
// FORWARD (see ipvsHookSpec).

import { CommandError } from '../errors.ts';
import type { CommandRunner } from '../exec/runner.ts';
import type { Logger } from '../log.ts';

/** on/off: as configured; auto: IPVS mode while kube-ipvs0 exists (checked at every kernel
 *  read and hook check, so a kube-proxy switching modes is followed). */
export type IpvsChoice = 'auto' | 'on' | 'off';

export const IPVS_INTERFACE = 'kube-ipvs0';

/** True when kube-ipvs0 exists in this network namespace. */
export async function ipvsInterfacePresent(runner: CommandRunner): Promise<boolean> {
  const args = ['-o', 'link', 'show', 'dev', IPVS_INTERFACE];
  const r = await runner.run('ip', args);
  if (r.exitCode === 0) return true;
  if (/does not exist/i.test(r.stderr)) return false;
  throw new CommandError('WEIR_KERNEL_READ_FAILED', 'ip', args, r.exitCode, r.stderr);
}

/** Whether Weir's OUTPUT hook is wanted: fixed by on and off; under auto, learned again at
 *  every kernel read (relearn) and compared at every hook check (detect). */
export interface IpvsMode {
  /** As of the last kernel read. */
  readonly wanted: boolean;
  /** Whether it is wanted now, leaving `wanted` as it is. */
  detect(): Promise<boolean>;
  /** Takes what detect() says as `wanted`, and logs a change. */
  relearn(log: Logger): Promise<void>;
}

export function ipvsMode(choice: IpvsChoice, runner: CommandRunner): IpvsMode {
  let wanted = choice === 'on';
  const detect = async (): Promise<boolean> => (choice === 'auto' ? ipvsInterfacePresent(runner) : choice === 'on');
  return {
    get wanted() {
      return wanted;
    },
    detect,
    async relearn(log) {
      const was = wanted;
      wanted = await detect();
      if (wanted !== was) log.info({ ipvs: wanted }, wanted ? 'kube-proxy runs in IPVS mode: hooking OUTPUT too' : 'kube-proxy no longer runs in IPVS mode: unhooking OUTPUT');
    },
  };
}
