import assert from 'node:assert/strict';
import { test } from 'node:test';
import { connectionKey, deleteConnections, forgetFlows, parseFlows } from '../../../src/dataplane/conntrack.ts';
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

test('parseFlows reads the original and reply tuples of TCP, UDP and SCTP entries, a Service DNAT included, and skips the rest', () => {
  const out = [
    'tcp      6 431999 ESTABLISHED src=10.244.1.21 dst=10.96.0.10 sport=40000 dport=80 src=10.244.2.12 dst=10.244.1.21 sport=8080 dport=40000 [ASSURED] mark=0 use=1',
    'udp      17 29 src=10.244.1.11 dst=10.244.2.12 sport=5353 dport=53 [UNREPLIED] src=10.244.2.12 dst=10.244.1.11 sport=53 dport=5353 mark=0 use=1',
    'sctp     132 3 ESTABLISHED src=10.244.1.11 dst=10.244.2.12 sport=1 dport=2 src=10.244.2.12 dst=10.244.1.11 sport=2 dport=1 mark=0 use=1',
    'icmp     1 29 src=10.244.1.11 dst=10.244.2.12 type=8 code=0 id=1 src=10.244.2.12 dst=10.244.1.11 type=0 code=0 id=1 mark=0 use=1',
    'conntrack v1.4.7 (conntrack-tools): 4 flow entries have been shown.',
  ].join('\n');
  const flows = parseFlows(out, 4);
  assert.deepEqual(
    flows.map((f) => [f.protocol, f.orig.src, f.orig.dst, f.orig.dport, f.reply.src, f.reply.sport]),
    [
      ['TCP', '10.244.1.21', '10.96.0.10', 80, '10.244.2.12', 8080],
      ['UDP', '10.244.1.11', '10.244.2.12', 53, '10.244.2.12', 53],
      ['SCTP', '10.244.1.11', '10.244.2.12', 2, '10.244.2.12', 2],
    ],
  );
  assert.deepEqual(parseFlows('tcp 6 10 ESTABLISHED src=fd00::1 dst=fd00::2 sport=1 dport=2 src=fd00::2 dst=fd00::1 sport=2 dport=1', 6)[0].orig, {
    src: 'fd00::1',
    dst: 'fd00::2',
    sport: 1,
    dport: 2,
  });
});

test('deleteConnections takes a filter: the source as the original source, the destination and port as the reply source (the real endpoint behind any DNAT); none left is no error', async () => {
  const r = runner([
    { stdout: '', stderr: 'conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.\n', exitCode: 0 },
    { stdout: '', stderr: 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n', exitCode: 1 },
  ]);
  const key = connectionKey(parseFlows('tcp 6 10 ESTABLISHED src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=80 src=10.0.0.2 dst=10.0.0.1 sport=8080 dport=40000', 4)[0]);
  assert.deepEqual(key, { family: 4, protocol: 'TCP', src: '10.0.0.1', dst: '10.0.0.2', dport: 8080 });
  assert.equal(await deleteConnections(r, key), 3);
  assert.equal(await deleteConnections(r, { family: 6, protocol: 'UDP', dst: 'fd00::2' }), 0);
  assert.deepEqual(r.calls, ['conntrack -D -f ipv4 -p tcp --orig-src 10.0.0.1 --reply-src 10.0.0.2 --reply-port-src 8080', 'conntrack -D -f ipv6 -p udp --reply-src fd00::2']);
});
