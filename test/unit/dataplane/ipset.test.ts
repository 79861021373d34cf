import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CommandError, RestoreError } from '../../../src/errors.ts';
import { createIpset, memberKey, parseIpsetSave } from '../../../src/dataplane/ipset.ts';
import { recordingRunner } from '../../../src/exec/runner.ts';

const SAVE = `create cali40s:a hash:net family inet hashsize 1024 maxelem 1000 comment bucketsize 12 initval 0x66fe157b
add cali40s:a 10.0.0.0/8
add cali40s:a 10.1.2.3
create cali60s:b hash:ip,port family inet6 hashsize 1024 maxelem 65536 bucketsize 12 initval 0xa2c395bd
add cali60s:b fd00::2,udp:53
create KUBE-X bitmap:port range 0-65535
add KUBE-X 80
`;

test('parseIpsetSave reads headers and members of every set', () => {
  const sets = parseIpsetSave(SAVE);
  assert.deepEqual([...sets.keys()], ['cali40s:a', 'cali60s:b', 'KUBE-X']);
  assert.deepEqual(sets.get('cali40s:a'), { name: 'cali40s:a', type: 'hash:net', family: 4, maxElem: 1000, commented: true, members: ['10.0.0.0/8', '10.1.2.3'] });
  assert.deepEqual(sets.get('cali60s:b'), { name: 'cali60s:b', type: 'hash:ip,port', family: 6, maxElem: 65536, commented: false, members: ['fd00::2,udp:53'] });
  assert.equal(sets.get('KUBE-X')?.family, undefined);
});

const keyCases: { name: string; type: string; input: string; expected: string }[] = [
  { name: 'v4 host prefix prints bare', type: 'hash:net', input: '10.1.2.3/32', expected: '10.1.2.3' },
  { name: 'v6 host prefix prints bare', type: 'hash:net', input: 'fd00::1/128', expected: 'fd00::1' },
  { name: 'v6 in lower case', type: 'hash:net', input: 'FD00::/64', expected: 'fd00::/64' },
  { name: 'real prefix kept', type: 'hash:net', input: '10.0.0.0/8', expected: '10.0.0.0/8' },
  { name: 'ip,port kept', type: 'hash:ip,port', input: '10.0.0.1,tcp:80', expected: '10.0.0.1,tcp:80' },
];
for (const c of keyCases) {
  test(`memberKey: ${c.name}`, () => assert.equal(memberKey(c.type, c.input), c.expected));
}

test('restore sends all lines in one ipset restore and skips an empty batch', async () => {
  const runner = recordingRunner();
  const ipset = createIpset(runner);
  await ipset.restore([]);
  assert.equal(runner.calls.length, 0);
  await ipset.restore(['create a hash:net family inet maxelem 10 -exist', 'add a 10.0.0.1 -exist']);
  assert.deepEqual(runner.calls, [{ cmd: 'ipset', args: ['restore'], input: 'create a hash:net family inet maxelem 10 -exist\nadd a 10.0.0.1 -exist\n' }]);
});

test('a rejected ipset batch raises RestoreError naming the line', async () => {
  const runner = recordingRunner(() => ({ stdout: '', stderr: 'ipset v7.17: Error in line 2: The set with the given name does not exist\n', exitCode: 1 }));
  const err = await createIpset(runner)
    .restore(['add a 1.1.1.1 -exist', 'add nosuch 1.1.1.1 -exist'])
    .then(
      () => assert.fail('expected a rejection'),
      (e: unknown) => e,
    );
  assert.ok(err instanceof RestoreError);
  assert.equal(err.line, 2);
  assert.equal(err.lineText, 'add nosuch 1.1.1.1 -exist');
});

test('list and save read back, failing with WEIR_KERNEL_READ_FAILED', async () => {
  const runner = recordingRunner(({ args }) => ({ stdout: args[0] === 'list' ? 'a\nb\n' : SAVE, stderr: '', exitCode: 0 }));
  const ipset = createIpset(runner);
  assert.deepEqual(await ipset.listNames(), ['a', 'b']);
  assert.equal(await ipset.save('cali40s:a'), SAVE);
  assert.deepEqual(
    runner.calls.map((c) => c.args),
    [
      ['list', '-name'],
      ['save', 'cali40s:a'],
    ],
  );
  const bad = createIpset(recordingRunner(() => ({ stdout: '', stderr: 'no', exitCode: 1 })));
  await assert.rejects(bad.save(), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_KERNEL_READ_FAILED');
});
