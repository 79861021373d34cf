// The suite's last file (the runner takes files in path order, and "zz" sorts after every
// directory of test/): no process a test file started, nor any process those started, may
// outlive that file. Files that import test/support/leftovers.ts (through logged-process.ts,
// agent-process.ts, run.ts, conntrack.ts, or themselves) mark what they start; a marked process
// of this run whose file has exited is a leftover, named here and then ended by its PID.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { currentRun, type Leftover, leftovers, running } from './support/leftovers.ts';

/** A process killed just before its file ended may take a moment to go. */
const GRACE_MS = 10_000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function settledLeftovers(run: string): Promise<Leftover[]> {
  const deadline = Date.now() + GRACE_MS;
  let left = leftovers(run);
  while (left.length > 0 && Date.now() < deadline) {
    await sleep(100);
    left = leftovers(run);
  }
  return left;
}

function end(left: readonly Leftover[]): void {
  for (const l of left) {
    try {
      process.kill(l.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

const LEFTOVERS = fileURLToPath(new URL('./support/leftovers.ts', import.meta.url));

test('the check names a process whose test file has exited, with that file, and not one whose file still runs', async (t) => {
  const run = `self-check-${process.pid}-${Date.now()}`;
  // Plays a test file: marks its children with a run of its own, starts a sleep in a process
  // group of its own (so nothing ends it with its parent), prints the sleep's PID and waits.
  const script = `
    import { spawn } from 'node:child_process';
    const { markChildren } = await import(${JSON.stringify(LEFTOVERS)});
    markChildren(${JSON.stringify(run)});
    const s = spawn('sleep', ['60'], { stdio: 'ignore', detached: true });
    s.unref();
    console.log(s.pid);
    process.stdin.resume();
    process.stdin.on('end', () => process.exit(0));
  `;
  const file = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['pipe', 'pipe', 'inherit'] });
  const pid = Number(await new Promise<string>((resolve) => file.stdout.once('data', (b: Buffer) => resolve(b.toString().trim()))));
  t.after(() => {
    file.kill('SIGKILL');
    if (running(pid)) process.kill(pid, 'SIGKILL');
  });
  assert.ok(running(pid));
  assert.deepEqual(leftovers(run), [], 'named while its file still runs');
  const exited = new Promise((resolve) => file.once('exit', resolve));
  file.stdin.end();
  await exited;
  assert.deepEqual(leftovers(run), [{ pid, command: 'sleep 60', file: '[eval]' }]);
  process.kill(pid, 'SIGKILL');
});

test('no process started by a test file of this run outlives its file', async () => {
  const left = await settledLeftovers(currentRun());
  end(left);
  assert.deepEqual(left, [], `processes outlived the test file that started them (now ended by their PID):\n${left.map((l) => `  ${l.pid} ${l.command}  (started by ${l.file})`).join('\n')}`);
});
