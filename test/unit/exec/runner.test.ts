import { spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CommandError } from '../../../src/errors.ts';
import { untilPasses } from '../../support/eventually.ts';
import { processRunner, FORK_SERVER_INPUT_LIMIT, netnsRunner, recordingRunner, runOk } from '../../../src/exec/runner.ts';

test('processRunner reports a missing binary as WEIR_COMMAND_MISSING', async () => {
  await assert.rejects(processRunner().run('weir-no-such-binary', ['x']), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_MISSING' && e.command === 'weir-no-such-binary');
});

test('processRunner resolves with a non-zero exit code and the streams, its arguments verbatim', async () => {
  const r = await processRunner().run('sh', ['-c', 'echo out; echo err >&2; exit 3']);
  assert.deepEqual(r, { stdout: 'out\n', stderr: 'err\n', exitCode: 3 });
  // Arguments are passed verbatim: no shell expands them.
  assert.equal((await processRunner().run('echo', ['$HOME', '*'])).stdout, '$HOME *\n');
});

test('processRunner feeds input on stdin', async () => {
  assert.equal((await processRunner().run('cat', [], { input: 'a\nb\n' })).stdout, 'a\nb\n');
});

test('processRunner writes an iterable input piece by piece as the command reads it, and stops when it exits', async () => {
  const piece = `${'x'.repeat(65_535)}\n`;
  let made = 0;
  const pieces = function* () {
    for (; made < 10_000; made++) yield piece;
  };
  const whole = await processRunner().run('wc', ['-c'], { input: { [Symbol.iterator]: () => pieces() } });
  assert.equal(whole.stdout.trim(), String(10_000 * 65_536));
  // A command that reads a little and exits: the rest (625 MB) is never made, and the broken
  // pipe is no error of the run.
  made = 0;
  const early = await processRunner().run('head', ['-c', '100000'], { input: { [Symbol.iterator]: () => pieces() } });
  assert.equal(early.exitCode, 0);
  assert.equal(early.stdout.length, 100_000);
  assert.ok(made < 100, `${made} pieces made for a command that read two`);
});

test('processRunner kills a hung command at the timeout and reports WEIR_COMMAND_TIMEOUT', async () => {
  // A real process that never exits on its own: it stays blocked on a lock another process holds.
  const dir = await mkdtemp(join(tmpdir(), 'weir-runner-'));
  const lock = join(dir, 'lock');
  // Its own process group, so that flock and the sleep holding the lock end together.
  const holder = spawn('flock', [lock, 'sleep', '30'], { stdio: 'ignore', detached: true });
  try {
    await new Promise((r) => setTimeout(r, 100));
    const t0 = Date.now();
    const err = await processRunner({ timeoutMs: 200 })
      .run('flock', [lock, 'true'])
      .then(
        () => assert.fail('expected a rejection'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof CommandError);
    assert.equal(err.code, 'WEIR_COMMAND_TIMEOUT');
    assert.match(err.message, /flock .* did not finish in time and was killed/);
    assert.match(err.stderr, /timed out after 200 ms/);
    assert.ok(Date.now() - t0 < 3000, `returned after ${Date.now() - t0} ms`);
    // The hung process is gone: the lock is still held by the holder alone.
    const ps = await processRunner().run('pgrep', ['-f', `^flock ${lock} true$`]);
    assert.equal(ps.stdout, '');
  } finally {
    process.kill(-holder.pid!, 'SIGKILL');
    await rm(dir, { recursive: true, force: true });
  }
});

/** The pid of ppid in /proc/<pid>/stat text (the field after the parenthesised name). */
const parentOf = (stat: string) => Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);

/** The process that started a command's starter: the fork server (its job shell started the
 *  command), or, for a command started here, this process's parent. */
async function serverOf(runner: ReturnType<typeof processRunner>): Promise<number> {
  return Number((await runner.run('sh', ['-c', 'cut -d" " -f4 /proc/$PPID/stat'])).stdout);
}

test('through the fork server or started here, a command gives the same streams, exit code and stdin; a missing binary and a hang are the same errors', async () => {
  for (const forkServer of [undefined, false] as const) {
    const runner = processRunner({ timeoutMs: 300, forkServer });
    assert.deepEqual(await runner.run('sh', ['-c', 'echo out; echo err >&2; exit 3']), { stdout: 'out\n', stderr: 'err\n', exitCode: 3 });
    assert.equal((await runner.run('cat', [], { input: 'a\nb\n' })).stdout, 'a\nb\n');
    assert.equal((await runner.run('cat', [], { input: ['a\n', 'b\n'] })).stdout, 'a\nb\n');
    assert.equal((await runner.run('sh', ['-c', 'echo $LC_ALL'])).stdout, 'C\n', 'English messages');
    // Arguments reach the command verbatim, whatever the shell would make of them.
    const words = ["it's", 'a b', '$HOME', '`id`', '"q"', '*', '\\', ''];
    assert.deepEqual((await runner.run('printf', ['%s|', ...words])).stdout, `${words.join('|')}|`);
    await assert.rejects(runner.run('weir-no-such-binary', ['x']), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_MISSING');
    await assert.rejects(runner.run('sleep', ['5']), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_TIMEOUT' && /timed out after 300 ms/.test(e.stderr));
    await assert.rejects(runner.run('sh', ['-c', 'kill -TERM $$']), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_FAILED' && /killed by (signal 15|SIGTERM)/.test(e.stderr));
    // Side by side, each answer to its own command.
    const many = await Promise.all(Array.from({ length: 8 }, (_, i) => runner.run('sh', ['-c', `sleep 0.0${i}; echo ${i}`])));
    assert.deepEqual(
      many.map((r) => r.stdout),
      Array.from({ length: 8 }, (_, i) => `${i}\n`),
    );
  }
});

test('commands are started by the fork server, not by this process, and leave no file behind; large streamed input goes to a command started here', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'weir-runner-'));
  try {
    const runner = processRunner({ forkServer: { dir } });
    const server = await serverOf(runner);
    assert.notEqual(server, process.pid);
    assert.equal((await readFile(`/proc/${server}/comm`, 'utf8')).trim(), 'sh');
    assert.equal(parentOf(await readFile(`/proc/${server}/stat`, 'utf8')), process.pid);
    const [own] = await readdir(dir);
    assert.match(own, /^weir-commands-/);
    assert.deepEqual(await readdir(join(dir, own)), [], "every command's files are removed");
    // Streamed input above the limit is not written to a file first.
    const big = Array.from({ length: 40 }, () => `${'x'.repeat(65_535)}\n`);
    assert.ok(big.length * 65_536 > FORK_SERVER_INPUT_LIMIT);
    const r = await runner.run('sh', ['-c', 'wc -c; echo $PPID'], { input: big });
    assert.deepEqual(r.stdout.split('\n').slice(0, 2).map(Number), [40 * 65_536, process.pid]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('a fork server that cannot start leaves commands to this process, said once', async () => {
  for (const forkServer of [{ shell: 'weir-no-such-shell' }, { dir: '/proc/weir-no-such-dir' }]) {
    const fallbacks: Error[] = [];
    const runner = processRunner({ forkServer, onFallback: (e) => fallbacks.push(e) });
    assert.equal(Number((await runner.run('sh', ['-c', 'echo $PPID'])).stdout), process.pid, 'started here');
    assert.equal((await runner.run('echo', ['again'])).stdout, 'again\n');
    assert.equal(fallbacks.length, 1);
    assert.match(fallbacks[0].message, /cannot start the command server/);
  }
});

test('a fork server whose directory went leaves the command, and the next ones, to this process', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'weir-runner-'));
  try {
    const fallbacks: Error[] = [];
    const runner = processRunner({ forkServer: { dir }, onFallback: (e) => fallbacks.push(e) });
    assert.notEqual(await serverOf(runner), process.pid);
    await rm(join(dir, (await readdir(dir))[0]), { recursive: true });
    assert.equal(Number((await runner.run('sh', ['-c', 'echo $PPID'])).stdout), process.pid, 'run here, once');
    assert.equal(fallbacks.length, 1);
    assert.match(fallbacks[0].message, /cannot write the command's input/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('a fork server that dies fails the commands it ran, and the next command starts a new one', async () => {
  const runner = processRunner();
  const server = await serverOf(runner);
  const running = runner.run('sleep', ['1']);
  await new Promise((r) => setTimeout(r, 50));
  process.kill(server, 'SIGKILL');
  await assert.rejects(running, (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_FAILED' && /command server exited \(SIGKILL\)/.test(e.stderr));
  const next = await serverOf(runner);
  assert.notEqual(next, server);
  assert.notEqual(next, process.pid);
});

test('netnsRunner prefixes ip netns exec and passes input through', async () => {
  const base = recordingRunner();
  await netnsRunner('wt01-a', base).run('ipset', ['restore'], { input: 'x\n' });
  assert.deepEqual(base.calls, [{ cmd: 'ip', args: ['netns', 'exec', 'wt01-a', 'ipset', 'restore'], input: 'x\n' }]);
});

test('netnsRunner maps a binary missing inside the namespace to WEIR_COMMAND_MISSING', async () => {
  const base = recordingRunner(() => ({ stdout: '', stderr: 'exec of "nope" failed: No such file or directory\n', exitCode: 1 }));
  await assert.rejects(netnsRunner('ns', base).run('nope', []), (e: unknown) => e instanceof CommandError && e.code === 'WEIR_COMMAND_MISSING');
});

test('runOk throws a CommandError with the stderr tail on a non-zero exit', async () => {
  const runner = recordingRunner(() => ({ stdout: '', stderr: Array.from({ length: 9 }, (_, i) => `line ${i}`).join('\n'), exitCode: 2 }));
  const err = await runOk(runner, 'ipset', ['list']).then(
    () => assert.fail('expected a rejection'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof CommandError);
  assert.equal(err.code, 'WEIR_COMMAND_FAILED');
  assert.equal(err.exitCode, 2);
  assert.match(err.message, /line 8/);
  assert.doesNotMatch(err.message, /line 3/);
});

test('recordingRunner forwards to a wrapped runner and records every call', async () => {
  const inner = recordingRunner(() => ({ stdout: 'hi', stderr: '', exitCode: 0 }));
  const outer = recordingRunner(inner);
  assert.equal((await outer.run('a', ['1'])).stdout, 'hi');
  assert.deepEqual(outer.calls, inner.calls);
});

test('spawn: output is read as it arrives, and ended says how the command ended', async () => {
  const child = processRunner().spawn('sh', ['-c', 'echo hi; exit 3']);
  assert.ok(child.pid !== undefined);
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  assert.equal(await child.ended, 'exited with 3');
  assert.equal(out, 'hi\n');
  const long = processRunner().spawn('sleep', ['10']);
  long.kill();
  assert.equal(await long.ended, 'killed by SIGTERM');
});

test('spawn: netnsRunner starts the command through ip netns exec; a responder-only recording runner starts nothing', async () => {
  const base = recordingRunner();
  netnsRunner('wexample', base).spawn('ip', ['-o', 'monitor', 'link']);
  assert.deepEqual(base.calls, [{ cmd: 'ip', args: ['netns', 'exec', 'wexample', 'ip', '-o', 'monitor', 'link'], input: undefined }]);
  const nothing = recordingRunner().spawn('ip', ['monitor']);
  assert.equal(nothing.pid, undefined);
  assert.match(await nothing.ended, /did not run/);
});

test('spawn: a monitor dies with the process that started it when that process is killed with SIGKILL', async (t) => {
  const runner = new URL('../../../src/exec/runner.ts', import.meta.url).href;
  const starter = `
    const { processRunner } = await import(${JSON.stringify(runner)});
    console.log(processRunner().spawn('sleep', ['60']).pid);
    setInterval(() => {}, 1000);
  `;
  const parent = spawn(process.execPath, ['--input-type=module', '-e', starter], { stdio: ['ignore', 'pipe', 'inherit'] });
  let pid = 0;
  const running = () => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  t.after(() => {
    parent.kill('SIGKILL');
    if (pid > 0 && running()) process.kill(pid, 'SIGKILL');
  });
  pid = Number(await new Promise<string>((resolve) => parent.stdout.once('data', (b: Buffer) => resolve(b.toString().trim()))));
  assert.ok(pid > 0 && running(), 'the monitor did not start');
  parent.kill('SIGKILL');
  await untilPasses(() => assert.ok(!running(), `the monitor ${pid} outlived the killed process that started it`), 3000, 20);
});
