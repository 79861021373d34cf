// npm run bench:cluster: Weir's latency on a real cluster (scripts/cluster.sh: kubelet,
// containerd, Flannel, kube-proxy on two nodes), installed by its chart, seen with real packets.
// Brings up its own cluster (named wbench), measures, prints p50/p99/max, and always takes the
// cluster down. Asserts nothing.
//   1. kubectl apply of a policy denying the client ingress to the server, and kubectl delete of
//      it: from spawning kubectl to the first connection attempt that shows the new verdict.
//   2. a pod created with kubectl on node-2 (no policy selects it): from spawning kubectl to the
//      first connection to it that succeeds, split where its IP reached a watch (before: the API
//      server, kubelet and runtime; after: the IP reaching Weir and its rules, and the server
//      starting to listen), and to the first probe Weir did not drop (a reset counts: the
//      server was not listening yet).
// Connections are tried by a prober process in the client pod's network namespace on node-1,
// not with kubectl exec (far too coarse for these figures); it shares this machine's clock.
//
//   npm run bench:cluster -- --samples=100        (or WEIR_BENCH_SAMPLES; default 100)

import { type ChildProcess, type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import type { RealCluster } from '../test/cluster/harness.ts';
import { percentile } from './stats.ts';

// Before the harness is loaded, which reads the name once: this bench must only ever bring up,
// use and take down a cluster of its own, whatever name the caller's environment holds.
process.env.WEIR_CLUSTER_NAME = 'wbench';
const h = await import('../test/cluster/harness.ts');

const { values: flags } = parseArgs({ options: { samples: { type: 'string' } } });
const SAMPLES = Number(flags.samples ?? process.env.WEIR_BENCH_SAMPLES ?? 100);
if (!Number.isInteger(SAMPLES) || SAMPLES < 1) throw new Error(`--samples must be a positive integer, got ${flags.samples ?? process.env.WEIR_BENCH_SAMPLES}`);

const NS = 'bench';
const POLICY = 'deny-server-ingress';
const CLUSTER_SH = join(h.REPO, 'scripts/cluster.sh');
const NODE_BIN = join(h.REPO, 'node_modules/node/bin/node');
/** A probe leaves this often; each waits this long for an answer (well under a SYN's retransmit). */
const PROBE_INTERVAL_MS = 5;
const PROBE_TIMEOUT_MS = 20;
/** A verdict counts once no probe contradicted it for this long (a lone slow probe is no flip). */
const HOLD_MS = 100;
/** How late a probe's line may arrive: its timeout plus a busy machine's scheduling. */
const LATE_MS = 200;
/** Before a write, the old verdict must have held this long. */
const STEADY_MS = 100;

// The prober, run by the node's own Node.js inside the client pod's network namespace. Reads
// targets (`IP:PORT`, or an empty line for none) on stdin, exits when stdin closes, and prints
// `<Date.now() when the probe was sent> ok|refused|fail <target>` each time the outcome changes,
// in the order the probes were sent (they overlap, and a dropped one is only known at its
// timeout). `refused` (a reset) tells a pod not yet listening from one whose packets are dropped.
const PROBER = `
const net = require('node:net');
const interval = Number(process.argv[1]);
const timeout = Number(process.argv[2]);
let target = '';
let last = '';
const inFlight = [];
function report() {
  while (inFlight.length > 0 && inFlight[0].outcome !== '') {
    const p = inFlight.shift();
    if (p.target !== target || p.outcome === last) continue;
    last = p.outcome;
    process.stdout.write(p.sent + ' ' + p.outcome + ' ' + p.target + '\\n');
  }
}
function probe() {
  if (target === '') return;
  const i = target.lastIndexOf(':');
  const p = { target, sent: Date.now(), outcome: '' };
  inFlight.push(p);
  const s = net.connect({ host: target.slice(0, i), port: Number(target.slice(i + 1)) });
  let timer;
  const done = (outcome) => {
    if (p.outcome !== '') return;
    p.outcome = outcome;
    clearTimeout(timer);
    // A reset leaves no TIME_WAIT behind: thousands of probes must not use up the ports.
    if (outcome === 'ok') s.resetAndDestroy(); else s.destroy();
    report();
  };
  s.once('connect', () => done('ok'));
  s.once('error', (e) => done(e.code === 'ECONNREFUSED' ? 'refused' : 'fail'));
  // Timers run before the loop reads sockets: on a busy machine an answer that came in time may
  // still be unread when the timer fires, so look once more after the poll phase.
  timer = setTimeout(() => setImmediate(() => done('fail')), timeout);
}
setInterval(probe, interval);
require('node:readline').createInterface({ input: process.stdin })
  .on('line', (l) => { const t = l.trim(); if (t !== target) { target = t; last = ''; } })
  .on('close', () => process.exit(0));
process.stdout.write('ready\\n');
`;

type Outcome = 'ok' | 'refused' | 'fail';

interface Observation {
  /** When the probe that first showed this outcome was sent (ms since the epoch). */
  readonly sent: number;
  readonly outcome: Outcome;
  readonly target: string;
  /** When its line reached this process. */
  readonly arrived: number;
}

/** Polls `check` every few ms until it returns a value; throws after `timeoutMs`. */
async function until<T>(what: string, check: () => T | undefined, timeoutMs: number, dead?: () => string | undefined): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = check();
    if (v !== undefined) return v;
    const why = dead?.();
    if (why !== undefined) throw new Error(`${what}: ${why}`);
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await sleep(2);
  }
}

/** The process groups this bench started (the prober, the watch), each led by the child here. */
const groups = new Set<ChildProcess>();

/** Kills a process group this bench started, while its leader runs (so its id is still its own). */
function killGroup(child: ChildProcess): void {
  groups.delete(child);
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

class Prober {
  readonly seen: Observation[] = [];
  private readonly child: ChildProcessWithoutNullStreams;
  private stderr = '';
  private exit: string | undefined;
  private ready = false;

  constructor(netns: string) {
    // Its own process group: node-exec's nsenter forks, so the group reaches the prober itself.
    this.child = spawn(CLUSTER_SH, ['node-exec', 'node-1', 'nsenter', `--net=${netns}`, NODE_BIN, '-e', PROBER, String(PROBE_INTERVAL_MS), String(PROBE_TIMEOUT_MS)], {
      env: process.env,
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    groups.add(this.child);
    this.child.on('error', (e) => (this.exit = String(e)));
    this.child.on('exit', (code, signal) => (this.exit = `the prober exited (${code ?? signal}): ${this.stderr.slice(-2000)}`));
    this.child.stderr.on('data', (b: Buffer) => (this.stderr += b.toString()));
    createInterface({ input: this.child.stdout }).on('line', (line) => {
      const arrived = Date.now();
      if (line === 'ready') {
        this.ready = true;
        return;
      }
      const [sent, outcome, target] = line.split(' ');
      this.seen.push({ sent: Number(sent), outcome: outcome as Outcome, target: target ?? '', arrived });
    });
  }

  readonly dead = (): string | undefined => this.exit;

  async started(): Promise<void> {
    await until('the prober starts', () => (this.ready ? true : undefined), 30_000, this.dead);
  }

  aim(target: string): void {
    this.child.stdin.write(`${target}\n`);
  }

  /** The latest outcome seen for `target`. */
  last(target: string): Observation | undefined {
    return this.seen.findLast((o) => o.target === target);
  }

  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.stdin.end();
      await Promise.race([new Promise((r) => this.child.once('exit', r)), sleep(3000)]);
    }
    killGroup(this.child);
  }
}

/** `kubectl get pods -w` on the fresh pods: tells the prober each new pod's IP the moment it is seen. */
class IpWatch {
  private readonly child: ChildProcessWithoutNullStreams;
  private expect: { name: string; resolve: (v: { ip: string; at: number }) => void } | undefined;
  private stderr = '';
  private exit: string | undefined;

  constructor(kubectl: string, kubeconfig: string, prober: Prober) {
    this.child = spawn(kubectl, ['--kubeconfig', kubeconfig, '-n', NS, 'get', 'pods', '-l', 'role=fresh', '-w', '-o', 'jsonpath={.metadata.name} {.status.podIP}{"\\n"}'], {
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    groups.add(this.child);
    this.child.on('error', (e) => (this.exit = String(e)));
    this.child.on('exit', (code, signal) => (this.exit = `the watch exited (${code ?? signal}): ${this.stderr.slice(-2000)}`));
    this.child.stderr.on('data', (b: Buffer) => (this.stderr += b.toString()));
    createInterface({ input: this.child.stdout }).on('line', (line) => {
      const at = Date.now();
      const [name, ip] = line.trim().split(' ');
      if (this.expect === undefined || name !== this.expect.name || !ip) return;
      prober.aim(`${ip}:80`);
      this.expect.resolve({ ip, at });
      this.expect = undefined;
    });
  }

  readonly dead = (): string | undefined => this.exit;

  /** Resolves with the pod's IP and when the watch showed it; the prober is aimed at it by then. */
  ipOf(name: string): Promise<{ ip: string; at: number }> {
    return new Promise((resolve) => (this.expect = { name, resolve }));
  }

  stop(): void {
    killGroup(this.child);
  }
}

const loadavg = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

interface Flip {
  /** Write spawned → first probe with the new verdict. */
  readonly ms: number;
  /** kubectl exited (the API server answered) → that probe. */
  readonly afterAnswerMs: number;
  /** Probes that showed the new verdict after the write but were contradicted within HOLD_MS. */
  readonly flaps: number;
}

/**
 * One write that turns client → server from allowed (`ok`) to denied (`fail`: dropped) or back.
 * Returns undefined when the verdict was already `want` at the write (a lone probe that failed by
 * chance just before it): the sample cannot be timed and is made again.
 */
async function flip(prober: Prober, target: string, want: 'ok' | 'fail', write: () => Promise<void>): Promise<Flip | undefined> {
  const old = want === 'ok' ? 'fail' : 'ok';
  await until(
    `${target} steadily ${old} before the write`,
    () => {
      const last = prober.last(target);
      return last !== undefined && last.outcome === old && Date.now() - last.arrived >= STEADY_MS ? true : undefined;
    },
    30_000,
    prober.dead,
  );
  const t0 = Date.now();
  await write();
  const answered = Date.now();
  const seen = await until(
    `${target} ${want} after the write`,
    (): { sent: number; flaps: number } | null | undefined => {
      const mine = prober.seen.filter((o) => o.target === target);
      if (mine.findLast((o) => o.sent < t0)?.outcome === want) return null;
      const after = mine.filter((o) => o.sent >= t0);
      let flaps = 0;
      for (let i = 0; i < after.length; i++) {
        if (after[i].outcome !== want) continue;
        const next = after[i + 1];
        if (next === undefined) return Date.now() >= after[i].sent + HOLD_MS + LATE_MS ? { sent: after[i].sent, flaps } : undefined;
        if (next.sent - after[i].sent >= HOLD_MS) return { sent: after[i].sent, flaps };
        flaps++;
      }
      return undefined;
    },
    60_000,
    prober.dead,
  );
  if (seen === null) return undefined;
  return { ms: seen.sent - t0, afterAnswerMs: seen.sent - answered, flaps: seen.flaps };
}

interface Figures {
  readonly denied: Flip[];
  readonly allowed: Flip[];
  /** Flips not timed because the verdict was already the new one at the write. */
  readonly redone: number;
  readonly newPod: { total: number; beforeIp: number; afterIp: number; passed: number }[];
  readonly client: string;
  readonly server: string;
}

async function measure(c: RealCluster): Promise<Figures> {
  const kubectlBin = join((await h.run(join(h.REPO, 'scripts/control-plane.sh'), ['build'])).stdout.trim().split('\n').pop() ?? '', 'kubectl');
  await c.k(['create', 'namespace', NS]);
  const ips = await h.runPods(c, NS, [h.agnhostPod('server', NS, 'node-2', { app: 'server' }), h.agnhostPod('client', NS, 'node-1', { app: 'client' })]);
  const server = `${ips.server}:80`;
  const found = h.ok(
    'finding the client pod network namespace',
    await c.onNode('node-1', ['sh', '-c', 'for n in /run/netns/*; do nsenter --net="$n" ip -4 -o addr | grep -qF " inet $1/" && echo "$n"; done', 'sh', ips.client!]),
  );
  const netns = found.trim().split('\n')[0];
  if (!netns) throw new Error(`no network namespace on node-1 holds the client's address ${ips.client}`);
  console.log(`client ${ips.client} (node-1, ${netns}), server ${ips.server} (node-2)`);

  const prober = new Prober(netns);
  let watch: IpWatch | undefined;
  try {
    await prober.started();
    prober.aim(server);

    // 1. A policy applied and deleted: the verdict flips each time.
    const policy = JSON.stringify({
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      metadata: { name: POLICY, namespace: NS },
      spec: { podSelector: { matchLabels: { app: 'server' } }, policyTypes: ['Ingress'], ingress: [] },
    });
    const apply = async () => void h.ok('kubectl apply', await c.kubectl(['apply', '-f', '-'], policy));
    const remove = async () => void h.ok('kubectl delete', await c.kubectl(['-n', NS, 'delete', 'networkpolicy', POLICY]));
    const denied: Flip[] = [];
    const allowed: Flip[] = [];
    let redone = 0;
    // One round unmeasured: kubectl's discovery cache and the first policy's sets and chains.
    await flip(prober, server, 'fail', apply);
    await flip(prober, server, 'ok', remove);
    console.log(`measuring ${SAMPLES} policy applies and ${SAMPLES} deletes...`);
    while (denied.length < SAMPLES || allowed.length < SAMPLES) {
      const d = await flip(prober, server, 'fail', apply);
      const a = await flip(prober, server, 'ok', remove);
      if (d && denied.length < SAMPLES) denied.push(d);
      if (a && allowed.length < SAMPLES) allowed.push(a);
      redone += Number(!d) + Number(!a);
      if (redone > SAMPLES) throw new Error(`${redone} writes found the new verdict already in place: the probes are not steady`);
    }

    // 2. New pods, one at a time; each is gone from node-2 before the next is made.
    prober.aim('');
    const netnsOnNode2 = async () => Number(h.ok('listing node-2 network namespaces', await c.onNode('node-2', ['sh', '-c', 'ls /run/netns | wc -l'])).trim());
    const baseline = await netnsOnNode2();
    watch = new IpWatch(kubectlBin, c.kubeconfig, prober);
    const w = watch;
    const newPod: Figures['newPod'] = [];
    console.log(`measuring ${SAMPLES} new pods...`);
    // Pod 0 is unmeasured, as round 0 above.
    for (let i = 0; i <= SAMPLES; i++) {
      const name = `fresh-${i}`;
      let known: { ip: string; at: number } | undefined;
      void w.ipOf(name).then((v) => (known = v));
      const t0 = Date.now();
      h.ok(`kubectl create ${name}`, await c.kubectl(['create', '-f', '-'], JSON.stringify(h.agnhostPod(name, NS, 'node-2', { role: 'fresh' }))));
      const { ip, at } = await until(
        `${name}'s IP`,
        () => known,
        120_000,
        () => w.dead() ?? prober.dead(),
      );
      const target = `${ip}:80`;
      const first = await until(`${name} (${ip}) answers`, () => prober.seen.find((o) => o.target === target && o.outcome === 'ok' && o.sent >= at), 120_000, prober.dead);
      // The first probe not dropped: Weir lets packets through; a reset says the server was not listening yet.
      const passed = prober.seen.find((o) => o.target === target && o.outcome !== 'fail' && o.sent >= at)!;
      if (i > 0) newPod.push({ total: first.sent - t0, beforeIp: at - t0, afterIp: first.sent - at, passed: passed.sent - t0 });
      prober.aim('');
      h.ok(`kubectl delete ${name}`, await c.kubectl(['-n', NS, 'delete', 'pod', name, '--grace-period=0', '--force']));
      await h.eventually(`${name} gone from node-2`, netnsOnNode2, (n) => n <= baseline, 60_000);
    }
    return { denied, allowed, redone, newPod, client: ips.client!, server: ips.server! };
  } finally {
    watch?.stop();
    await prober.stop();
  }
}

function report(f: Figures, load: readonly string[]): void {
  const num = (x: number) => x.toFixed(1).padStart(8);
  const rows: [string, number[]][] = [
    ['1 kubectl apply (deny) -> first dropped probe', f.denied.map((x) => x.ms)],
    ['1   the same, from kubectl exiting (the API server answered)', f.denied.map((x) => x.afterAnswerMs)],
    ['1 kubectl delete (allow) -> first connected probe', f.allowed.map((x) => x.ms)],
    ['1   the same, from kubectl exiting (the API server answered)', f.allowed.map((x) => x.afterAnswerMs)],
    ['1 both kinds', [...f.denied, ...f.allowed].map((x) => x.ms)],
    ['2 kubectl create pod -> first connection to it', f.newPod.map((x) => x.total)],
    ['2   of which: until its IP reached a watch', f.newPod.map((x) => x.beforeIp)],
    ['2   of which: IP in the watch -> first connection', f.newPod.map((x) => x.afterIp)],
    ['2 kubectl create pod -> first probe not dropped (reset or ok)', f.newPod.map((x) => x.passed)],
  ];
  console.log('');
  console.log(`Weir on the real cluster (scripts/cluster.sh), ${new Date().toISOString()}; client pod ${f.client} on node-1, server ${f.server} on node-2`);
  console.log(`probes every ${PROBE_INTERVAL_MS} ms, ${PROBE_TIMEOUT_MS} ms timeout, timed by when they were sent; a flip counts once no probe contradicts it for ${HOLD_MS} ms`);
  console.log(`${'(ms)'.padEnd(62)} ${'n'.padStart(4)} ${'p50'.padStart(8)} ${'p99'.padStart(8)} ${'max'.padStart(8)}`);
  for (const [label, xs] of rows) console.log(`${label.padEnd(62)} ${String(xs.length).padStart(4)} ${num(percentile(xs, 50))} ${num(percentile(xs, 99))} ${num(Math.max(...xs))}`);
  const flaps = [...f.denied, ...f.allowed].reduce((s, x) => s + x.flaps, 0);
  console.log(`flips made again (the new verdict already seen at the write): ${f.redone}; probes contradicted within ${HOLD_MS} ms after a write: ${flaps}`);
  console.log(`load average (1/5/15 min): at the bench's start ${load[0]}, when measuring began ${load[1]}, at the end ${load[2]}`);
}

// Ctrl-C or a kill still takes the cluster down. `down` keeps the daemons' logs for a run that
// failed; `purge` removes them.
let downing: Promise<unknown> | undefined;
let interrupted = false;
const down = (verb: 'down' | 'purge') => (downing ??= h.run(CLUSTER_SH, [verb], { passStderr: true }).then((r) => r.code === 0 || console.error(`cluster.sh ${verb} exited ${r.code}`)));
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => {
    interrupted = true;
    for (const child of groups) killGroup(child);
    void down('down').finally(() => process.exit(130));
  });
}

const load = [loadavg()];
let figures: Figures | undefined;
try {
  console.log('bringing up the cluster wbench and installing Weir...');
  const c = await h.clusterUp();
  await h.installWeir(c);
  load.push(loadavg());
  figures = await measure(c);
  load.push(loadavg());
} catch (err) {
  // An interrupted run fails where it stood (the prober killed): nothing to say.
  if (!interrupted) console.error(err);
  process.exitCode = 1;
} finally {
  await down(figures ? 'purge' : 'down');
}
if (figures) report(figures, load);
