import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const SIGNALS = fileURLToPath(new URL('../../../src/cli/signals.ts', import.meta.url));

// A process waiting for its stop signal while a command runs through execa (as the agent's
// iptables and ip commands do all the time): the signal must reach our handler, not kill it.
const SCRIPT = `
import { execa } from 'execa';
import { waitForSignal } from ${JSON.stringify(SIGNALS)};
// The agent waits for its signal from the start; commands come and go after that.
const stop = waitForSignal();
const sleeper = execa('sleep', ['30'], { reject: false });
const signal = await stop;
console.log('stopping on ' + signal);
sleeper.kill();
await sleeper;
process.exit(0);
`;

test('SIGTERM while a command is running stops the process through its handler, exit 0', async () => {
  const child = spawn(process.execPath, ['--input-type=module', '-e', SCRIPT], { cwd: fileURLToPath(new URL('../../../', import.meta.url)), stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c));
  // Let the command start (signal-exit is loaded while it runs).
  await new Promise((r) => setTimeout(r, 500));
  child.kill('SIGTERM');
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => child.on('close', (c, s) => resolve([c, s])));
  assert.deepEqual([code, signal], [0, null], `exit ${code} / ${signal}; stdout: ${out}`);
  assert.match(out, /stopping on SIGTERM/);
});
