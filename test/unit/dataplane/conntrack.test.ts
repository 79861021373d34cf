import assert from 'node:assert/strict';
import { test } from 'node:test';
import { forgetFlows } from '../../../src/dataplane/conntrack.ts';
import type { CommandRunner, RunResult } from '../../../src/exec/runner.ts';
import { CommandError } from '../../../src/errors.ts';

/** A runner that answers conntrack calls in turn and records their arguments. */
function runner(results: RunResult[]): CommandRunner & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    async run(cmd, args) {
      calls.push([cmd, ...args].join(' '));
      return results.shift()!;
    },
    spawn() {
      throw new Error('not used');
    },
  };
}
const deleted = (n: number): RunResult => ({ stdout: '', stderr: `conntrack v1.4.7 (conntrack-tools): ${n} flow entries have been deleted.\n`, exitCode: n === 0 ? 1 : 0 });

test("an address's flows go both as original source and as reply source (through a Service's DNAT), in its family", async () => {
  const r = runner([deleted(2), deleted(0), deleted(0), deleted(1)]);
  assert.equal(await forgetFlows(r, '10.244.1.5'), 2);
  assert.equal(await forgetFlows(r, 'fd00::5'), 1);
  assert.deepEqual(r.calls, [
    'conntrack -D -f ipv4 --orig-src 10.244.1.5',
    'conntrack -D -f ipv4 --reply-src 10.244.1.5',
    'conntrack -D -f ipv6 --orig-src fd00::5',
    'conntrack -D -f ipv6 --reply-src fd00::5',
  ]);
});

test('a conntrack failure is an error with its stderr, not "nothing to delete"', async () => {
  const r = runner([{ stdout: '', stderr: 'conntrack v1.4.7 (conntrack-tools): Operation failed: Operation not permitted\n', exitCode: 1 }]);
  await assert.rejects(forgetFlows(r, '10.244.1.5'), (e: unknown) => e instanceof CommandError && e.command === 'conntrack' && /not permitted/.test(e.stderr));
});
