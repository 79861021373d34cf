// The reader's supervision with real child processes: a shell script stands in for tcpdump
// (it is given tcpdump's exact arguments), writing a pcap stream recorded from the kernel,
// failing, or hanging. test/kernel/audit-reader.test.ts runs the real tcpdump.

import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { type NflogEvent, NflogPcapParser } from '../../../src/audit/pcap.ts';
import { createTcpdumpReader, netlinkDrops, type ReaderState, readerArgv, tcpdumpArgs } from '../../../src/audit/reader.ts';
import type { WeirError } from '../../../src/errors.ts';
import { silentLogger } from '../../../src/log.ts';
import { systemClock, type Clock } from '../../../src/clock.ts';
import { procStat, running } from '../../support/leftovers.ts';

const FIXTURE = fileURLToPath(new URL('./fixtures/nflog-le.pcap', import.meta.url));
const fixtureEvents = async () => new NflogPcapParser().push(await readFile(FIXTURE));

const dir = await mkdtemp(join(tmpdir(), 'weir-audit-reader-'));
after(() => rm(dir, { recursive: true, force: true }));

/** Retries `check` every 10 ms until it passes (5 s at most, then its last failure). */
async function eventually(check: () => void, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return check();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}

let fakes = 0;
/** A stand-in for tcpdump: an executable file whose `script` runs with tcpdump's arguments as
 *  "$@", started as tcpdump is (through setpriv). */
async function fake(script: string): Promise<string[]> {
  const path = join(dir, `tcpdump-${++fakes}`);
  await writeFile(path, `#!/bin/sh\n${script}\n`, { mode: 0o755 });
  return [path];
}

/** The clock of the restart timers, recording each delay asked for. */
function recordingClock(): Clock & { delays: number[] } {
  const delays: number[] = [];
  const setTimeout = (fn: () => void, ms: number) => {
    delays.push(ms);
    return systemClock.setTimeout(fn, 1);
  };
  return { ...systemClock, delays, setTimeout };
}

function harness(command: readonly string[], opts: { clock?: Clock; stableMs?: number } = {}) {
  const events: NflogEvent[] = [];
  const states: ReaderState[] = [];
  const errors: WeirError[] = [];
  const reader = createTcpdumpReader(
    // The stand-in runs as the test does (it writes files in the test's private directory).
    { group: 77, command, user: null, restart: { initialMs: 10, maxMs: 40 }, stableMs: opts.stableMs, log: silentLogger(), clock: opts.clock },
    {
      events: (batch) => events.push(...batch),
      state: (s, err) => {
        states.push(s);
        if (err) errors.push(err);
      },
    },
  );
  return { reader, events, states, errors };
}

test('tcpdump is run with -U, a 16 MiB buffer, the stream on stdout and no snapshot length', () => {
  assert.deepEqual(tcpdumpArgs(77, 16384), ['-i', 'nflog:77', '-U', '-B', '16384', '-w', '-']);
  assert.ok(!tcpdumpArgs(77, 16384).includes('-s'));
});

test("the child's pcap stream becomes events; the reader is up once tcpdump says it listens", async () => {
  const argsFile = join(dir, 'args');
  const h = harness(await fake(`echo "$@" > ${argsFile}; echo "tcpdump: listening on nflog:77, link-type NFLOG" >&2; cat ${FIXTURE}; exec sleep 30`));
  h.reader.start();
  await eventually(() => assert.equal(h.events.length, 8));
  assert.deepEqual(h.events, await fixtureEvents());
  assert.deepEqual(h.states, ['starting', 'running']);
  assert.equal((await readFile(argsFile, 'utf8')).trim(), '-i nflog:77 -U -B 16384 -w -');
  await h.reader.stop();
  assert.deepEqual(h.states, ['starting', 'running', 'stopped']);
  assert.equal(h.reader.stats().restarts, 0);
});

test('a tcpdump that exits is restarted with backoff (10, 20, 40, 40 ms) and each exit is a WEIR_AUDIT_READER error with its stderr', async () => {
  const clock = recordingClock();
  const h = harness(await fake(`echo "tcpdump: Can't listen on group index: Operation not permitted" >&2; exit 1`), { clock });
  h.reader.start();
  await eventually(() => assert.ok(h.reader.stats().restarts >= 4));
  await h.reader.stop();
  assert.deepEqual(clock.delays.slice(0, 4), [10, 20, 40, 40]);
  assert.ok(h.errors.length >= 4);
  for (const e of h.errors) {
    assert.equal(e.code, 'WEIR_AUDIT_READER');
    assert.match(e.message, /exited with 1: tcpdump: Can't listen on group index: Operation not permitted/);
  }
  assert.equal(h.states.at(-1), 'stopped');
  assert.ok(h.states.includes('backoff'));
});

test('a tcpdump that cannot be found is a WEIR_AUDIT_READER error naming it, and is retried', async () => {
  const h = harness(['/nonexistent/tcpdump']);
  h.reader.start();
  await eventually(() => assert.ok(h.reader.stats().restarts >= 2));
  await h.reader.stop();
  assert.equal(h.errors[0].code, 'WEIR_AUDIT_READER');
  assert.match(h.errors[0].message, /setpriv --pdeathsig KILL \/nonexistent\/tcpdump -i nflog:77 .* exited with \d+: .*\/nonexistent\/tcpdump/);
});

test('a command that cannot start is a WEIR_AUDIT_READER error and is retried', async () => {
  const h = harness(['/nonexistent/ip', 'netns', 'exec', 'ns', 'tcpdump']);
  h.reader.start();
  await eventually(() => assert.ok(h.reader.stats().restarts >= 2));
  await h.reader.stop();
  assert.equal(h.errors[0].code, 'WEIR_AUDIT_READER');
  assert.match(h.errors[0].message, /could not be started/);
});

test('tcpdump is started by setpriv with a parent-death signal, right after the prefix; as its own user it starts with CAP_NET_ADMIN alone', () => {
  assert.deepEqual(readerArgv(['ip', 'netns', 'exec', 'ns1', 'tcpdump'], null, 77, 16384), ['ip', 'netns', 'exec', 'ns1', 'setpriv', '--pdeathsig', 'KILL', 'tcpdump', ...tcpdumpArgs(77, 16384)]);
  assert.deepEqual(readerArgv(['tcpdump'], 'tcpdump', 78, 1), [
    'setpriv',
    '--reuid',
    'tcpdump',
    '--regid',
    'tcpdump',
    '--init-groups',
    '--inh-caps',
    '-all,+net_admin',
    '--ambient-caps',
    '-all,+net_admin',
    '--pdeathsig',
    'KILL',
    'tcpdump',
    ...tcpdumpArgs(78, 1),
  ]);
});

const READER = new URL('../../../src/audit/reader.ts', import.meta.url).href;
const LOG = new URL('../../../src/log.ts', import.meta.url).href;

test('the child dies with the process that started the reader, even when that process is killed with SIGKILL', async (t) => {
  // Plays the agent: starts a reader on the stand-in and prints the child's PID once it listens.
  const agent = `
    const { createTcpdumpReader } = await import(${JSON.stringify(READER)});
    const { silentLogger } = await import(${JSON.stringify(LOG)});
    const r = createTcpdumpReader({ group: 77, command: [process.argv[1]], user: null, log: silentLogger() }, {
      events() {},
      state(s) { if (s === 'running') console.log(r.pid); },
    });
    r.start();
  `;
  const command = await fake(`echo "tcpdump: listening on nflog:77" >&2; exec sleep 30`);
  const parent = spawn(process.execPath, ['--input-type=module', '-e', agent, command[0]], { stdio: ['ignore', 'pipe', 'inherit'] });
  const pid = Number(await new Promise<string>((resolve) => parent.stdout.once('data', (b: Buffer) => resolve(b.toString().trim()))));
  t.after(() => {
    parent.kill('SIGKILL');
    if (running(pid)) process.kill(pid, 'SIGKILL');
  });
  assert.ok(running(pid), 'the stand-in is not running');
  assert.equal(procStat(pid)?.ppid, parent.pid, "the stand-in's parent is not the reader's process");
  parent.kill('SIGKILL');
  await eventually(() => assert.ok(!running(pid), `the stand-in ${pid} outlived the killed reader process`), 3000);
});

test('a stream that is not NFLOG pcap kills that tcpdump (by its PID) with WEIR_AUDIT_STREAM, and a new one starts', async () => {
  const pids = join(dir, 'pids');
  const h = harness(await fake(`echo $$ >> ${pids}; echo "tcpdump: listening on nflog:77" >&2; printf 'this is no pcap stream at all'; exec sleep 30`));
  h.reader.start();
  await eventually(() => assert.ok(h.reader.stats().restarts >= 1));
  await h.reader.stop();
  assert.equal(h.errors[0].code, 'WEIR_AUDIT_STREAM');
  const started = (await readFile(pids, 'utf8')).trim().split('\n').map(Number);
  for (const pid of started) assert.throws(() => process.kill(pid, 0), /ESRCH/, `child ${pid} still runs`);
});

test('the restart backoff starts over once a tcpdump has run for a while', async () => {
  const clock = recordingClock();
  const count = join(dir, 'count');
  // Fails twice at once, then runs 800 ms (longer than stableMs) before failing again.
  const h = harness(await fake(`n=$(cat ${count} 2>/dev/null || echo 0); echo $((n+1)) > ${count}; echo "tcpdump: listening on nflog:77" >&2; [ "$n" -ge 2 ] && sleep 0.8; exit 1`), {
    clock,
    stableMs: 300,
  });
  h.reader.start();
  await eventually(() => assert.ok(h.reader.stats().restarts >= 4));
  await h.reader.stop();
  assert.deepEqual(clock.delays.slice(0, 4), [10, 20, 10, 10]);
});

test('stop ends the child by its PID, waits for it, and no restart follows', async () => {
  const pidFile = join(dir, 'pid');
  const h = harness(await fake(`echo $$ > ${pidFile}; echo "tcpdump: listening on nflog:77" >&2; exec sleep 30`));
  h.reader.start();
  await eventually(() => assert.deepEqual(h.states, ['starting', 'running']));
  const pid = Number((await readFile(pidFile, 'utf8')).trim());
  await h.reader.stop();
  assert.throws(() => process.kill(pid, 0), /ESRCH/);
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(h.states, ['starting', 'running', 'stopped']);
  assert.equal(h.reader.stats().restarts, 0);
});

test("the kernel's drops for tcpdump's netlink socket are read from the NETLINK_NETFILTER row of its port id", () => {
  const table = `sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode
00000000c32153c3 0   0          00000000 0        0        0     2        0        4
00000000e1f51ec9 12  13182      00000000 212992   0        0     2        4711     2075114
0000000020cc2a81 12  0          00000000 0        0        0     2        9        2070810
00000000aa000000 0   13182      00000000 0        0        0     2        5        2075115
`;
  assert.equal(netlinkDrops(table, 13182), 4711);
  assert.equal(netlinkDrops(table, 999), undefined);
  assert.equal(netlinkDrops('', 13182), undefined);
});
