// The kernel keeps tracking a connection after the pod at one end is gone, and answers by
// the addresses alone: a pod that gets the address next would inherit the flow as
// ESTABLISHED, which every enforcer accepts before policy. So when a local pod gives up an
// address, its entries go, once the write that stops dispatching the address has committed.

import { CommandError } from '../errors.ts';
import { familyOf } from '../model/types.ts';
import type { CommandRunner } from '../exec/runner.ts';

/** What conntrack -D says on success; it exits 1 when the count is 0. */
const DELETED = /\b(\d+) flow entries have been deleted/;

/**
 * Deletes every entry with `address` as its original source (the pod's own flows) or its reply
 * source (flows to it, also through a Service's DNAT, whose original destination is the
 * Service's address). Resolves with how many entries went; throws a CommandError with
 * conntrack's stderr when it fails.
 */
export async function forgetFlows(runner: CommandRunner, address: string): Promise<number> {
  let deleted = 0;
  for (const match of ['--orig-src', '--reply-src']) {
    const args = ['-D', '-f', familyOf(address) === 6 ? 'ipv6' : 'ipv4', match, address];
    const r = await runner.run('conntrack', args);
    const count = DELETED.exec(r.stderr)?.[1];
    if (count === undefined || r.exitCode !== (count === '0' ? 1 : 0)) throw new CommandError('WEIR_COMMAND_FAILED', 'conntrack', args, r.exitCode, r.stderr);
    deleted += Number(count);
  }
  return deleted;
}
