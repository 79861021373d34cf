import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LoggedProcess } from '../../support/logged-process.ts';

/** A Node process that runs `script`, as a LoggedProcess. */
const node = (script: string, extra: { plainLinesAreErrors?: boolean } = {}) =>
  new LoggedProcess('node-a', { label: 'script on node-a', command: process.execPath, args: ['-e', script], graceMs: 1000, ...extra });

test('a wait fails as soon as the process exits, with its last lines', async () => {
  const p = node(`console.log(JSON.stringify({ level: 30, msg: 'starting' })); process.exit(3)`);
  const started = Date.now();
  await assert.rejects(
    p.waitFor((r) => r.msg === 'never said', 30_000, 'a line never written'),
    /script on node-a: exited \(3\) before "a line never written"; last lines:\n.*starting/s,
  );
  assert.ok(Date.now() - started < 10_000, 'long before the wait timed out');
});

test('a line written just before the exit still ends the wait', async () => {
  const p = node(`console.log(JSON.stringify({ level: 30, msg: 'removed everything' })); process.exit(0)`);
  const rec = await p.waitFor((r) => r.msg === 'removed everything', 30_000, 'the last line');
  assert.equal(rec.msg, 'removed everything');
});

test('a wait that starts after the process has gone fails at once', async () => {
  const p = node('process.exit(1)');
  assert.equal(await p.exitCode(10_000), 1);
  await assert.rejects(
    p.waitFor(() => true, 30_000, 'anything'),
    /exited \(1\)/,
  );
});

test('errors are records at error level, and plain lines only when asked', async () => {
  const script = `console.log('plain'); console.log(JSON.stringify({ level: 50, msg: 'bad' })); console.log(JSON.stringify({ level: 30, msg: 'done' }))`;
  const quiet = node(script);
  await quiet.waitFor((r) => r.msg === 'done', 10_000, 'done');
  assert.deepEqual(quiet.errors, ['{"level":50,"msg":"bad"}']);
  const strict = node(script, { plainLinesAreErrors: true });
  await strict.waitFor((r) => r.msg === 'done', 10_000, 'done');
  assert.deepEqual(strict.errors, ['plain', '{"level":50,"msg":"bad"}']);
});

test('the revision and what is left for the tidy follow the write lines; messages are counted', async () => {
  const lines = [
    { msg: 'applied changes', revision: '7', tidyPending: 2 },
    { msg: 'tidied dataplane', tidyPending: 0 },
    { msg: 'applied changes', revision: '8', tidyPending: 0 },
  ];
  const p = node(`${lines.map((l) => `console.log(${JSON.stringify(JSON.stringify(l))})`).join(';')}`);
  await p.waitFor((r) => r.revision === '8', 10_000, 'the last write');
  assert.equal(p.revision, '8');
  assert.equal(p.tidyPending, 0);
  assert.equal(p.count('applied changes'), 2);
  await p.settled(1000);
});

test('stop ends a running process', async () => {
  const p = node('setInterval(() => {}, 1000)');
  assert.equal(p.exited, false);
  await p.stop();
  assert.equal(p.exited, true);
});
