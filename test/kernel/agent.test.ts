// The agent end to end on a real kernel (in a namespace of its own): manifests in, chains
// and sets out, and the health server telling the truth about it; then the failures that must
// be seen: a family that cannot be written, a command that hangs, the xtables lock held.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { cp, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startAgent, type RunningAgent } from '../../src/agent/agent.ts';
import { defaultConfig, type AgentConfig } from '../../src/agent/config.ts';
import { processRunner, netnsRunner, type CommandRunner } from '../../src/dataplane/index.ts';
import { PreconditionError } from '../../src/errors.ts';
import { silentLogger } from '../../src/log.ts';
import { createNs, deleteNs, inNs, uniquePrefix } from '../../src/sim/netns.ts';
import { manifestRevision } from '../../src/sources/index.ts';

const EXAMPLES = fileURLToPath(new URL('../../examples/', import.meta.url));

describe('agent on a real kernel', () => {
  const ns = `${uniquePrefix('wagent')}node`;
  let dir = '';
  let agent: RunningAgent | undefined;
  const url = (path: string) => `http://127.0.0.1:${agent!.port}${path}`;

  before(async () => {
    await createNs(ns);
    dir = await mkdtemp(join(tmpdir(), 'weir-agent-'));
    await cp(EXAMPLES, dir, { recursive: true });
  });
  after(async () => {
    await agent?.stop();
    await deleteNs(ns);
    await rm(dir, { recursive: true, force: true });
  });

  async function revisionOf(): Promise<string> {
    // Every file of the copied examples: the revision covers the whole directory.
    const names = (await readdir(dir)).filter((n) => /\.(ya?ml|json)$/.test(n) && !n.startsWith('.')).sort();
    return manifestRevision(await Promise.all(names.map(async (name) => ({ name, content: await readFile(join(dir, name), 'utf8') }))));
  }

  async function waitReady(revision: string, timeoutMs = 5000): Promise<number> {
    const t0 = performance.now();
    for (;;) {
      const r = await fetch(url('/readyz'));
      const body = (await r.json()) as { ready: boolean; revision: string };
      if (r.status === 200 && body.ready && body.revision === revision) return performance.now() - t0;
      if (performance.now() - t0 > timeoutMs) assert.fail(`not ready at ${revision.slice(0, 12)}: ${JSON.stringify(body)}`);
      await new Promise((res) => setTimeout(res, 5));
    }
  }

  test('enforces the manifests, serves /healthz, /readyz and /metrics, and applies a change within 200 ms', async () => {
    const cfg = { ...defaultConfig(), nodeName: 'node-a', manifestsDir: dir, metricsAddr: '127.0.0.1:0', resyncIntervalMs: 0, retryMaxMs: 200 };
    let firstWrites = 0;
    agent = await startAgent(cfg, { log: silentLogger(), runner: netnsRunner(ns, processRunner()), onFirstWrite: () => firstWrites++ });
    await waitReady(await revisionOf());
    assert.equal(firstWrites, 1, 'the end of the cold start is told once it is written');
    assert.equal((await fetch(url('/healthz'))).status, 200);

    const saved = await inNs(ns, 'iptables-save', ['-t', 'mangle']);
    assert.match(saved, /^-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD$/m);
    assert.match(saved, /no policy allows ingress to db\/db-1/);
    assert.match(await inNs(ns, 'ip6tables-save', ['-t', 'mangle']), /:cali-FORWARD/);
    assert.match(await inNs(ns, 'ipset', ['list', '-name']), /^cali40s:/m);

    const metrics = await (await fetch(url('/metrics'))).text();
    assert.match(metrics, /^weir_dataplane_applies_total\{result="ok"\} [1-9]/m);
    assert.match(metrics, /^weir_local_pods 3$/m);
    assert.match(metrics, /^weir_dataplane_chains [1-9]/m);

    // A policy change on disk: enforced and reported ready within 200 ms.
    await moveDbPort(dir);
    const ms = await waitReady(await revisionOf(), 2000);
    console.log(`change enforced and ready after ${ms.toFixed(0)} ms`);
    assert.ok(ms < 200, `took ${ms} ms`);
    assert.match(await inNs(ns, 'iptables-save', ['-t', 'mangle']), /--dport 8080 /);
    assert.equal(firstWrites, 1, 'and only once');
  });

  test('a FORWARD hook deleted by another program is back within 10 s, counted as a drift repair', async () => {
    const hook = /^-A FORWARD (-m comment --comment "\w+:hook" -j cali-FORWARD)$/m.exec(await inNs(ns, 'iptables-save', ['-t', 'mangle']))![1];
    await inNs(ns, 'iptables', ['-t', 'mangle', '-D', 'FORWARD', ...hook.split(' ').map((w) => w.replaceAll('"', ''))]);
    assert.doesNotMatch(await inNs(ns, 'iptables-save', ['-t', 'mangle']), /^-A FORWARD .*:hook/m);
    const t0 = performance.now();
    await poll('the hook back', 10_000, async () => (/^-A FORWARD -m comment --comment "\w+:hook" -j cali-FORWARD$/m.test(await inNs(ns, 'iptables-save', ['-t', 'mangle'])) ? true : undefined));
    console.log(`hook repaired ${(performance.now() - t0).toFixed(0)} ms after it was deleted (check every 5 s)`);
    assert.ok((await metric(agent!.port!, /^weir_drift_repairs_total\{what="hook"\} (\d+)/)) >= 1);
  });

  test('/readyz reports a failed write with a reason code, never the payload or stderr, and recovers once the kernel allows it', async () => {
    // A foreign rule jumping to one of our policy chains makes deleting that chain impossible.
    const saved = await inNs(ns, 'iptables-save', ['-t', 'mangle']);
    // (a named-port rule: it cannot merge, so its policy keeps a chain of its own)
    const chain = /^-A (cali-pi-\S+) .*backend\/allow-frontend-to-backend ingress rule 0/m.exec(saved)![1];
    await inNs(ns, 'iptables', ['-t', 'mangle', '-A', 'INPUT', '-j', chain]);
    const policies = join(dir, '30-policies.yaml');
    const text = await readFile(policies, 'utf8');
    const docs = text.split(/^---$/m).filter((d) => !d.includes('name: allow-frontend-to-backend'));
    await writeFile(policies, docs.join('---'));
    const want = await revisionOf();
    const deadline = Date.now() + 5000;
    let answer = '';
    let body: { ready: boolean; reason: string; revision: string; error?: string } = { ready: true, reason: '', revision: '' };
    while (Date.now() < deadline) {
      answer = await (await fetch(url('/readyz'))).text();
      body = JSON.parse(answer) as typeof body;
      if (!body.ready && body.reason === 'ApplyFailed') break;
      await new Promise((res) => setTimeout(res, 20));
    }
    assert.deepEqual(Object.keys(body).sort(), ['error', 'ready', 'reason', 'revision']);
    assert.equal(body.reason, 'ApplyFailed');
    assert.equal(body.error, 'WEIR_RESTORE_FAILED');
    // The rejected payload names chains, policies and pod addresses: none of it goes out.
    for (const secret of [chain, 'allow-frontend-to-backend', 'backend/', '10.244.', 'iptables', 'line']) assert.ok(!answer.includes(secret), `${secret} in ${answer}`);
    assert.match(await inNs(ns, 'iptables-save', ['-t', 'mangle']), new RegExp(`:${chain} `), 'the rejected write changed nothing');
    await inNs(ns, 'iptables', ['-t', 'mangle', '-D', 'INPUT', '-j', chain]);
    await waitReady(want, 5000);
    assert.doesNotMatch(await inNs(ns, 'iptables-save', ['-t', 'mangle']), new RegExp(`:${chain} `));
  });
});

/** Rewrites each command before it runs (a wrapper process in front of the real tool). */
function wrapped(base: CommandRunner, wrap: (cmd: string, args: readonly string[]) => [string, string[]] | undefined): CommandRunner {
  return {
    run(cmd, args, opts) {
      const w = wrap(cmd, args);
      return w ? base.run(w[0], w[1], opts) : base.run(cmd, args, opts);
    },
    spawn: (cmd, args, opts) => base.spawn(cmd, args, opts),
  };
}

/** A process holding an flock on `file` until it is ended (or `seconds` pass): its own process
 *  group, so flock and its sleep end together. */
function holdLock(file: string, seconds: number): { release(): void } {
  const holder = spawn('flock', [file, 'sleep', String(seconds)], { stdio: 'ignore', detached: true });
  return {
    release() {
      try {
        process.kill(-holder.pid!, 'SIGKILL');
      } catch {
        // already gone
      }
    },
  };
}

async function poll<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

async function metric(port: number, line: RegExp): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  return [...text.matchAll(new RegExp(line.source, 'gm'))].reduce((n, m) => n + Number(m[1]), 0);
}

/** A policy change the kernel must show: db's allowed port moves from 80 to 8080. (Renaming a
 *  policy may change nothing: rules of equal meaning are merged whatever their policy.) */
async function moveDbPort(dir: string): Promise<void> {
  const policies = join(dir, '30-policies.yaml');
  const docs = (await readFile(policies, 'utf8')).split('\n---\n');
  await writeFile(policies, docs.map((d) => (d.includes('name: allow-backend-to-db') ? d.replace(/port: 80$/m, 'port: 8080') : d)).join('\n---\n'));
}

/**
 * A kernel without IPv6 (booted with ipv6.disable=1) answers every AF_INET6 socket with
 * EAFNOSUPPORT, which is how the legacy ip6tables tools fail there. A seccomp filter gives the
 * ip6tables processes exactly that answer inside the test's namespace; the rest of the machine
 * keeps its IPv6.
 */
const NO_IPV6 = `
import ctypes, os, sys
lib = ctypes.CDLL('libseccomp.so.2')
lib.seccomp_init.restype = ctypes.c_void_p
ctx = ctypes.c_void_p(lib.seccomp_init(ctypes.c_uint32(0x7fff0000)))  # SCMP_ACT_ALLOW
class Arg(ctypes.Structure):
    _fields_ = [('arg', ctypes.c_uint), ('op', ctypes.c_int), ('a', ctypes.c_uint64), ('b', ctypes.c_uint64)]
# socket(AF_INET6=10, ...) fails with EAFNOSUPPORT (97); SCMP_CMP_EQ is 4.
assert lib.seccomp_rule_add(ctx, ctypes.c_uint32(0x00050000 | 97), lib.seccomp_syscall_resolve_name(b'socket'), 1, Arg(0, 4, 10, 0)) == 0
assert lib.seccomp_load(ctx) == 0
os.execvp(sys.argv[1], sys.argv[1:])
`;
const seccompMissing = spawnSync('python3', ['-c', "import ctypes; ctypes.CDLL('libseccomp.so.2')"]).status === 0 ? false : 'needs python3 and libseccomp to take IPv6 away from ip6tables';

describe('start-up with an IP family that cannot be written', () => {
  const ns = `${uniquePrefix('wfam')}node`;
  let dir = '';
  let runner: CommandRunner;
  before(async () => {
    await createNs(ns);
    dir = await mkdtemp(join(tmpdir(), 'weir-family-'));
    await cp(EXAMPLES, dir, { recursive: true });
    await writeFile(join(dir, 'no-ipv6.py'), NO_IPV6);
    runner = wrapped(netnsRunner(ns, processRunner()), (cmd, args) => (cmd.startsWith('ip6tables') ? ['python3', [join(dir, 'no-ipv6.py'), cmd, ...args]] : undefined));
  });
  after(async () => {
    await deleteNs(ns);
    await rm(dir, { recursive: true, force: true });
  });

  test("the agent refuses to start, naming the family, the kernel's answer and the flag, and writes nothing", { skip: seccompMissing }, async () => {
    // What really happens on such a node, outside Weir: ip6tables cannot work at all.
    await assert.rejects(inNs(ns, 'python3', [join(dir, 'no-ipv6.py'), 'ip6tables-legacy-save', '-t', 'filter']), /Address family not supported by protocol/);
    const cfg: AgentConfig = { ...defaultConfig(), nodeName: 'node-a', manifestsDir: dir, backend: 'legacy', families: [4, 6] };
    const err = await startAgent(cfg, { log: silentLogger(), runner }).then(
      async (a) => {
        await a.stop();
        assert.fail('the agent started');
      },
      (e: unknown) => e,
    );
    assert.ok(err instanceof PreconditionError, String(err));
    console.log(`refused with:\n${err.message}`);
    assert.match(err.message, /IPv6: .*Address family not supported by protocol/);
    assert.doesNotMatch(err.message, /IPv4:/);
    assert.match(err.message, /refuses to start rather than leave a family unpoliced/);
    assert.match(err.message, /--families 4 \(WEIR_FAMILIES=4\)/);
    assert.doesNotMatch(await inNs(ns, 'iptables-legacy-save', ['-t', 'mangle']), /cali/, 'nothing was written');

    // With the family the node has, it starts and enforces.
    const agent = await startAgent({ ...cfg, families: [4], metricsAddr: '127.0.0.1:0' }, { log: silentLogger(), runner });
    try {
      await poll('ready', 10_000, async () => ((await fetch(`http://127.0.0.1:${agent.port}/readyz`)).status === 200 ? true : undefined));
      assert.match(await inNs(ns, 'iptables-legacy-save', ['-t', 'mangle']), /^-A FORWARD -m comment --comment "\w+:hook" -j cali-FORWARD$/m);
    } finally {
      await agent.stop();
    }
  });
});

describe('a command that hangs on a real kernel', () => {
  const ns = `${uniquePrefix('whang')}node`;
  let dir = '';
  let agent: RunningAgent | undefined;
  before(async () => {
    await createNs(ns);
    dir = await mkdtemp(join(tmpdir(), 'weir-hang-'));
    await cp(EXAMPLES, dir, { recursive: true });
  });
  after(async () => {
    await agent?.stop();
    await deleteNs(ns);
    await rm(dir, { recursive: true, force: true });
  });

  test('/healthz fails while every write hangs until killed, and passes again once writes succeed', async () => {
    // Each iptables-restore first takes a lock the test may hold: then it really hangs, until
    // the runner's time limit kills it.
    const lock = join(dir, 'hang.lock');
    const runner = wrapped(netnsRunner(ns, processRunner({ timeoutMs: 300 })), (cmd, args) => (/^ip6?tables-.*-restore$/.test(cmd) ? ['flock', [lock, cmd, ...args]] : undefined));
    const cfg: AgentConfig = { ...defaultConfig(), nodeName: 'node-a', manifestsDir: dir, metricsAddr: '127.0.0.1:0', resyncIntervalMs: 200, retryMinMs: 50, retryMaxMs: 200 };
    agent = await startAgent(cfg, { log: silentLogger(), runner });
    const port = agent.port!;
    const get = async (path: string) => {
      const r = await fetch(`http://127.0.0.1:${port}${path}`);
      return { status: r.status, text: await r.text() };
    };
    await poll('ready', 10_000, async () => ((await get('/readyz')).status === 200 ? true : undefined));
    assert.equal((await get('/healthz')).status, 200);

    const held = holdLock(lock, 30);
    try {
      await new Promise((res) => setTimeout(res, 100));
      await moveDbPort(dir);
      const t0 = Date.now();
      const health = await poll('/healthz to fail', 10_000, async () => {
        const r = await get('/healthz');
        return r.status === 503 ? r : undefined;
      });
      console.log(`/healthz failed ${Date.now() - t0} ms after the change (bound: 3 resync intervals = 600 ms): ${health.text.trim()}`);
      const body = JSON.parse(health.text) as { healthy: boolean; reason: string; error?: string };
      assert.equal(body.healthy, false);
      assert.match(body.reason, /^(NoWriteSucceeded|WriteHung)$/);
      assert.equal(body.error, 'WEIR_COMMAND_TIMEOUT');
      // Each hung tool was killed at the time limit, not left behind: after several timeouts,
      // only the current attempt (one restore per family) is alive.
      const timeouts = await poll('three writes timed out', 10_000, async () => {
        const n = await metric(port, /^weir_errors_total\{reason="WEIR_COMMAND_TIMEOUT"\} (\d+)/);
        return n >= 3 ? n : undefined;
      });
      const alive = spawnSync('pgrep', ['-f', `flock ${lock} ip`])
        .stdout.toString()
        .trim()
        .split('\n')
        .filter(Boolean).length;
      console.log(`writes timed out: ${timeouts}; hung tools alive: ${alive}`);
      assert.ok(alive <= 2, `${alive} hung tools alive`);
    } finally {
      held.release();
    }
    await poll('/healthz to pass again', 10_000, async () => ((await get('/healthz')).status === 200 ? true : undefined));
    await poll('ready', 10_000, async () => ((await get('/readyz')).status === 200 ? true : undefined));
  });
});

describe('the xtables lock held by another process (legacy backend)', () => {
  const ns = `${uniquePrefix('wlock')}node`;
  let dir = '';
  let agent: RunningAgent | undefined;
  before(async () => {
    await createNs(ns);
    dir = await mkdtemp(join(tmpdir(), 'weir-lock-'));
    await cp(EXAMPLES, dir, { recursive: true });
  });
  after(async () => {
    await agent?.stop();
    await deleteNs(ns);
    await rm(dir, { recursive: true, force: true });
  });

  test('a bounded --wait turns contention into counted retries and a WEIR_XTABLES_LOCK failure, and the write lands once the lock is free', async () => {
    // iptables-legacy takes its lock file from XTABLES_LOCKFILE (default /run/xtables.lock): a
    // private one keeps the rest of the machine's iptables free while the test holds it.
    const lock = join(dir, 'xtables.lock');
    const runner = wrapped(netnsRunner(ns, processRunner()), (cmd, args) => ['env', [`XTABLES_LOCKFILE=${lock}`, cmd, ...args]]);
    const cfg: AgentConfig = {
      ...defaultConfig(),
      nodeName: 'node-a',
      manifestsDir: dir,
      metricsAddr: '127.0.0.1:0',
      backend: 'legacy',
      lockWaitSeconds: 1,
      lockRetries: 1,
      lockRetryDelayMs: 100,
      retryMinMs: 100,
      retryMaxMs: 200,
      resyncIntervalMs: 0,
    };
    agent = await startAgent(cfg, { log: silentLogger(), runner });
    const port = agent.port!;
    const ready = async () => {
      const r = await fetch(`http://127.0.0.1:${port}/readyz`);
      return r.status === 200 ? ((await r.json()) as { revision: string }) : undefined;
    };
    const before = (await poll('ready', 10_000, ready)).revision;

    // Held for 3.5 s: one write tries for 1 s, waits 0.1 s, tries 1 s more and gives up; the
    // loop's retry waits for the lock again and gets it when it is freed.
    const held = holdLock(lock, 3.5);
    const t0 = Date.now();
    try {
      await new Promise((res) => setTimeout(res, 100));
      await moveDbPort(dir);
      const after = await poll('the change written', 15_000, async () => {
        const r = await ready();
        return r && r.revision !== before ? r : undefined;
      });
      assert.ok(after);
      console.log(`change written ${Date.now() - t0} ms after the lock was taken (held 3.5 s)`);
      assert.ok(Date.now() - t0 >= 3000, 'nothing was written while the lock was held');
    } finally {
      held.release();
    }
    const retries = await metric(port, /^weir_command_retries_total\{command="ip6?tables-legacy-restore"\} (\d+)/);
    const lockFailures = await metric(port, /^weir_errors_total\{reason="WEIR_XTABLES_LOCK"\} (\d+)/);
    console.log(`lock retries counted: ${retries}, writes failed on the lock: ${lockFailures}`);
    assert.ok(retries >= 1, `retries ${retries}`);
    assert.ok(lockFailures >= 1, `WEIR_XTABLES_LOCK ${lockFailures}`);
    assert.match(await inNs(ns, 'iptables-legacy-save', ['-t', 'mangle']), /--dport 8080 /);
  });
});
