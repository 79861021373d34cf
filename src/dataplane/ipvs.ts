// Whether this node's kube-proxy runs in IPVS mode: it then holds every Service address on
// the dummy interface kube-ipvs0, and Service traffic crosses INPUT and OUTPUT instead of
// FORWARD (see ipvsHookSpec).

import { CommandError } from '../errors.ts';
import type { CommandRunner } from '../exec/runner.ts';

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
