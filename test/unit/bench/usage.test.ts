import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { type TestContext, test } from 'node:test';
import { usageOf } from '../../../bench/peers/usage.ts';

const TICK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** State and utime + stime of a process, from its stat. */
function stat(pid: number): { state: string; ticks: number } {
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return { state: f[0]!, ticks: Number(f[11]) + Number(f[12]) };
}

/** Runs `sh -c script`, whose script starts one child in the background; both are killed when
 *  the test ends. */
async function withChild(t: TestContext, script: string): Promise<{ pid: number; child: number }> {
  const parent = spawn('sh', ['-c', script], { stdio: 'ignore' });
  const pid = parent.pid!;
  let child: number | undefined;
  t.after(() => {
    // The child first: while its parent lives, its pid cannot have gone to another process.
    for (const p of [child, pid]) {
      try {
        if (p !== undefined) process.kill(p, 'SIGKILL');
      } catch {
        // gone already
      }
    }
  });
  for (let i = 0; i < 500 && child === undefined; i++) {
    await sleep(10);
    const kids = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim();
    if (kids) child = Number(kids.split(' ')[0]);
  }
  assert.ok(child !== undefined, 'the child never appeared');
  return { pid, child };
}

test('a process is charged the CPU of a child it has not waited for', async (t) => {
  // The shell starts a busy child and becomes `sleep`, which never waits for it: as Weir's
  // command shell, whose commands' CPU the agent's own stat never sees.
  const { pid, child } = await withChild(t, '(i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done) & exec sleep 60');
  while (stat(child).state !== 'Z') await sleep(20);
  const childTicks = stat(child).ticks;
  assert.ok(childTicks > 0, 'the child used no measurable CPU: the test would prove nothing');
  const u = usageOf(pid);
  assert.ok(u !== null);
  assert.ok(u.cpuS >= childTicks / TICK, `charged ${u.cpuS} s, the child alone used ${childTicks / TICK} s`);
});

test('a process is charged the memory of the children it keeps', async (t) => {
  const { pid, child } = await withChild(t, 'sleep 60 & exec sleep 61');
  const rss = (p: number) => Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${p}/status`, 'utf8'))![1]) / 1024;
  const u = usageOf(pid)!;
  // Both are sleeps of the same size; RSS moves little between reads.
  assert.ok(u.rssMB > rss(pid) + rss(child) / 2, `charged ${u.rssMB} MB, the process holds ${rss(pid)} and its child ${rss(child)}`);
});

test('a process that is gone has no usage', async () => {
  const p = spawn('true');
  await new Promise((r) => p.once('exit', r));
  assert.equal(usageOf(p.pid!), null);
});
