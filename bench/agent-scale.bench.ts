// npm run bench:agent: Weir's own targets measured on the built agent process (issue 10), not
// in-process. A real kube-apiserver holds a cluster of bench/synthetic.ts's shapes (default
// 100k pods, 10k namespaces, 20k policies, ~110 pods on node-0; bench/populate-cluster.ts
// writes it), and the bundled agent
// (scripts/build.ts into .cache/agent-scale/weir-dist, never dist/) runs as node-0 in a network
// namespace of this bench's own, reaching the API server through a bridge (test/integration/
// bridge.ts), with the image's Node flags (src/cli/node-flags.ts). Prints measured figures
// (p50/p99) next to the targets; asserts nothing.
//   1. populating the API server (bounded concurrency), and how long it took
//   2. cold start: process spawn -> the first full write ("resynced dataplane"), split into list,
//      compute and write, with the CPU the agent, kube-apiserver and etcd spent meanwhile and the
//      same lists made by the bench alone; RSS after it, peak (VmHWM) and at rest 30 s later
//   3. incremental changes through the API, one at a time: API write answered -> the agent's
//      "applied changes" line as received; the agent's own write ms; calc ms ("model updated")
//   4. CPU at rest (from /proc) and RSS at the end
//
//   npm run bench:agent -- --scale=0.1 --changes=30
// Flags (or env): --scale (WEIR_BENCH_SCALE, default 1), --changes (WEIR_BENCH_CHANGES, 30),
// --concurrency (API writes in flight while populating, 32), --rest-s (30), --settle-s (wait up
// to this long for the load average to fall under 1 after populating, 60), --max-populate-s
// (stop creating pods after this long and measure the cluster made so far; 0: no limit),
// --starts (cold starts on the populated cluster, 1: their spread in one run). The agent writes
// its own NodePolicyStatus only: every NetworkPolicyStatus is the controller's (bench:controller).
// WEIR_BENCH_AGENT_NODE_FLAGS: extra Node flags for the agent (a CPU profile, say);
// WEIR_BENCH_AGENT_ARGS: extra arguments of `weir agent` (--favour-memory, say);
// WEIR_BENCH_AGENT_LOG_DIR: keep each agent's output there, every line with its ms since spawn.

import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { NODE_FLAGS } from '../src/cli/node-flags.ts';
import { registerExitCleanup } from '../src/sim/cleanup.ts';
import { createNs, deleteNs, uniquePrefix } from '../src/sim/netns.ts';
import { bridgeApiServer, type Bridge } from '../test/integration/bridge.ts';
import type { ControlPlane } from '../test/integration/controlplane.ts';
import type { Api } from './peers/api.ts';
import { NetnsProcess } from './peers/enforcers.ts';
import { type Usage, usageOf } from './peers/usage.ts';
import { Clients, collection, type Population, startApiServer, podObject, podStatus, policyObject, populate, progress, secs, settle, benchNumber } from './populate-cluster.ts';
import { ProcessLog } from './process-log.ts';
import { heap, log, machine, mb, section, sourceState, words } from './report.ts';
import { percentile } from './stats.ts';
import { makePod, makePolicy, NODE, type SyntheticSize } from './synthetic.ts';

const REPO = fileURLToPath(new URL('../', import.meta.url));
const OUT = join(REPO, '.cache/agent-scale/weir-dist');
const METRICS_PORT = 9464;

const { values: flags } = parseArgs({
  options: {
    scale: { type: 'string' },
    changes: { type: 'string' },
    concurrency: { type: 'string' },
    'rest-s': { type: 'string' },
    'settle-s': { type: 'string' },
    'max-populate-s': { type: 'string' },
    starts: { type: 'string' },
  },
  strict: true,
});
const num = benchNumber;
const scale = num(flags.scale, process.env.WEIR_BENCH_SCALE, 1);
const CHANGES = Math.max(1, Math.round(num(flags.changes, process.env.WEIR_BENCH_CHANGES, 30)));
/** Computes this slow are listed one by one (section 3): what made them slow is in the change. */
const SLOW_COMPUTE_MS = 2;
/** Extra Node flags for the agent only, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof" to see where
 *  its time goes (the profile is written when the bench stops it). */
const AGENT_NODE_FLAGS = words(process.env.WEIR_BENCH_AGENT_NODE_FLAGS);
const AGENT_ARGS = words(process.env.WEIR_BENCH_AGENT_ARGS);
/** A directory to keep every agent's output in (agent-1.log, ...), e.g. with --trace-gc above. */
const AGENT_LOG_DIR = process.env.WEIR_BENCH_AGENT_LOG_DIR;
// Made now: a missing directory would otherwise end the run at the first start, after populating.
if (AGENT_LOG_DIR) mkdirSync(AGENT_LOG_DIR, { recursive: true });
let agentsStarted = 0;
const CONCURRENCY = Math.max(1, Math.round(num(flags.concurrency, undefined, 32)));
const REST_S = num(flags['rest-s'], undefined, 30);
const SETTLE_S = num(flags['settle-s'], undefined, 60);
const MAX_POPULATE_S = num(flags['max-populate-s'], undefined, 0);
/** Cold starts measured on one populated cluster: each but the last in a namespace of its own,
 *  torn down after; the last goes on to sections 3 and 4. */
const STARTS = Math.max(1, Math.round(num(flags.starts, undefined, 1)));

/** The shapes of bench/synthetic.ts, at the size of engine.bench.ts. */
const size: SyntheticSize = {
  pods: Math.round(100_000 * scale),
  namespaces: Math.max(1, Math.round(10_000 * scale)),
  policies: Math.round(20_000 * scale),
  localPods: 110,
};
const NODES = Math.max(1, Math.round(size.pods / size.localPods));

// ---------------------------------------------------------------------------------------------
// Figures

const f1 = (x: number): string => (Number.isNaN(x) ? '-' : x < 10 ? x.toFixed(2) : x < 100 ? x.toFixed(1) : x.toFixed(0));

// ---------------------------------------------------------------------------------------------
// Where the cold start's time goes: CPU of each process involved, and the same lists made by
// the bench itself

/** CPU seconds so far of each process taking part, by name. */
type CpuSnapshot = Record<string, number>;

/** PIDs of the control plane's daemons (DIR/pids: "name pid starttime" lines). */
function controlPlanePids(cp: ControlPlane): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of readFileSync(join(cp.dir, 'pids'), 'utf8').split('\n')) {
    const [name, pid] = line.trim().split(/\s+/);
    if (name && Number(pid) > 0) out[name] = Number(pid);
  }
  return out;
}

/** The bridge's process in the agent's namespace: our child whose command line names the
 *  bridge's socket (bridge.ts does not expose it). */
function bridgePid(): number | undefined {
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === process.pid && readFileSync(`/proc/${d}/cmdline`, 'utf8').includes('weir-bridge-')) return Number(d);
    } catch {
      // Gone meanwhile.
    }
  }
  return undefined;
}

function cpuSnapshot(pids: Record<string, number | undefined>): CpuSnapshot {
  const out: CpuSnapshot = {};
  for (const [name, pid] of Object.entries(pids)) {
    const u = pid === undefined ? null : usageOf(pid);
    if (u) out[name] = u.cpuS;
  }
  const me = process.cpuUsage();
  out['bench (this process)'] = (me.user + me.system) / 1e6;
  return out;
}

const cpuBetween = (a: CpuSnapshot, b: CpuSnapshot): string =>
  Object.keys(b)
    .filter((k) => a[k] !== undefined || k === 'agent')
    .map((k) => `${k} ${(b[k] - (a[k] ?? 0)).toFixed(1)} s`)
    .join(', ');

/** Lists a collection page by page, reading each body without parsing it: what the API server
 *  alone takes to serve a list. (Pages are followed in JSON only; a protobuf list is one page.) */
async function timedList(cp: ControlPlane, agent: HttpsAgent, path: string, query: string, accept: string): Promise<{ pages: number; bytes: number }> {
  let cont = '';
  let pages = 0;
  let bytes = 0;
  do {
    const url = new URL(`${path}?${query}${cont ? `&continue=${encodeURIComponent(cont)}` : ''}`, cp.server);
    const head = await new Promise<string>((resolve, reject) => {
      const req = httpsRequest(url, { agent, headers: { authorization: `Bearer ${cp.token}`, accept } }, (res) => {
        let first = '';
        res.on('data', (c: Buffer) => {
          bytes += c.length;
          if (first.length < 4096) first += c.toString();
        });
        res.on('end', () => (res.statusCode === 200 ? resolve(first) : reject(new Error(`GET ${path}: HTTP ${res.statusCode}: ${first.slice(0, 300)}`))));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end();
    });
    pages++;
    cont = /"continue":"([^"]*)"/.exec(head)?.[1] ?? '';
  } while (cont !== '');
  return { pages, bytes };
}

/** The agent's lists (every namespace, pod and policy, all at once), made by the bench: how long
 *  the API server takes to serve them, and the CPU it and etcd spend. `protobuf`: namespaces and
 *  pods in protobuf, as the agent's first list asks. */
async function listLikeTheAgent(cp: ControlPlane, query: string, protobuf = false): Promise<string> {
  const ca = /certificate-authority-data:\s*(\S+)/.exec(readFileSync(cp.kubeconfig, 'utf8'))?.[1] ?? '';
  const agent = new HttpsAgent({ keepAlive: true, ca: Buffer.from(ca, 'base64') });
  try {
    const c0 = cpuSnapshot(controlPlanePids(cp));
    const t0 = performance.now();
    const r = await Promise.all(
      ['/api/v1/namespaces', '/api/v1/pods', '/apis/networking.k8s.io/v1/networkpolicies'].map((p) =>
        timedList(cp, agent, p, query, protobuf && !p.includes('networking') ? 'application/vnd.kubernetes.protobuf' : 'application/json'),
      ),
    );
    const ms = performance.now() - t0;
    const c1 = cpuSnapshot(controlPlanePids(cp));
    return `${secs(ms)} (${r.reduce((n, x) => n + x.pages, 0)} pages, ${(r.reduce((n, x) => n + x.bytes, 0) / 1e6).toFixed(0)} MB${protobuf ? '' : ' of JSON'}; CPU ${cpuBetween(c0, c1)})`;
  } finally {
    agent.destroy();
  }
}

// ---------------------------------------------------------------------------------------------
// The agent process

interface LogRecord {
  readonly level?: number;
  readonly msg?: string;
  readonly ms?: number;
  readonly revision?: string;
  readonly resync?: boolean;
  readonly stats?: {
    membersAdded?: number;
    membersRemoved?: number;
    setsCreated?: number;
    setsDeleted?: number;
    chainsWritten?: number;
    chainsDeleted?: number;
    rulesWritten?: number;
    durations?: Record<string, number>;
  };
  readonly [k: string]: unknown;
}

/** A write of the agent ("applied changes" or "resynced dataplane"), with when its line was
 *  received and the calc time of the passes since the previous write. */
interface Write {
  readonly at: number;
  readonly rec: LogRecord;
  readonly revision: number;
  readonly computeMs: number | undefined;
  /** The loop thread's CPU time in those passes, as getrusage counts it: in scheduler ticks on
   *  a kernel with tick accounting, so it cannot split a compute shorter than a tick. */
  readonly computeCpuMs: number | undefined;
  /** Usage of the process as the line arrived. */
  readonly usage: Usage | null;
}

const isWrite = (r: LogRecord): boolean => r.msg === 'applied changes' || r.msg === 'resynced dataplane';

class Agent extends NetnsProcess {
  readonly spawnedAt: number;
  /** The first line of each message, when it was received, and the CPU snapshot then. */
  readonly firstAt = new Map<string, { at: number; rec: LogRecord; cpu: CpuSnapshot }>();
  /** Taken at the first line of each message (cheap: a few reads of /proc). */
  snapshot: () => CpuSnapshot = () => ({});
  readonly writes: Write[] = [];
  readonly output: ProcessLog<LogRecord>;
  revision = 0;
  #compute: number[] = [];
  #computeCpu: number[] = [];
  readonly #waiters = new Set<{ test: (w: Write) => boolean; resolve: (w: Write) => void; reject: (e: Error) => void }>();

  constructor(netns: string, argv: readonly string[]) {
    super(netns, [process.execPath, ...argv]);
    this.spawnedAt = performance.now();
    agentsStarted++;
    this.output = new ProcessLog(this.spawnedAt, AGENT_LOG_DIR ? { path: join(AGENT_LOG_DIR, `agent-${agentsStarted}.log`) } : undefined);
    this.child.once('close', () => this.output.end());
    this.child.once('exit', (code, signal) => {
      const e = new Error(`the agent exited (${code ?? signal}); last lines:\n${this.output.last(10)}`);
      for (const w of [...this.#waiters]) w.reject(e);
      this.#waiters.clear();
    });
  }

  /** The first write from now on that passes `test`. */
  nextWrite(test: (w: Write) => boolean, timeoutMs: number, what: string): Promise<Write> {
    return new Promise((resolve, reject) => {
      const w = {
        test,
        resolve: (x: Write) => {
          clearTimeout(timer);
          resolve(x);
        },
        reject: (e: Error) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(w);
        reject(new Error(`agent: no write for "${what}" within ${timeoutMs} ms${this.exited ? ` (exited ${this.child.exitCode ?? this.child.signalCode})` : ''}; last lines:\n${this.output.last(6)}`));
      }, timeoutMs);
      if (this.exited) w.reject(new Error(`the agent has exited (${this.child.exitCode ?? this.child.signalCode}); last lines:\n${this.output.last(10)}`));
      else this.#waiters.add(w);
    });
  }

  /** Work that is not a change's own (resyncs, tidies, hook checks), when its line was
   *  received: a change that arrives meanwhile waits for it. */
  readonly chores: { at: number; what: string }[] = [];

  /** The write that holds the batch a change made from now on (a later revision). */
  writeAfter(timeoutMs: number, what: string): Promise<Write> {
    const after = this.revision;
    return this.nextWrite((w) => w.revision > after, timeoutMs, what);
  }

  protected onLine(line: string): void {
    const at = performance.now();
    const rec = this.output.read(line, at);
    if (rec === undefined) return;
    if (typeof rec.msg === 'string' && !this.firstAt.has(rec.msg)) this.firstAt.set(rec.msg, { at, rec, cpu: this.snapshot() });
    if (rec.msg === 'model updated' && typeof rec.ms === 'number') {
      this.#compute.push(rec.ms);
      this.#computeCpu.push(typeof rec.cpuMs === 'number' ? rec.cpuMs : Number.NaN);
    }
    const chore = { 'resynced dataplane': 'resync', 'tidied dataplane': 'tidy', 'hook checked': 'hook check' }[String(rec.msg)];
    if (chore !== undefined) this.chores.push({ at, what: `${chore} ${f1(rec.ms ?? Number.NaN)} ms` });
    if (!isWrite(rec)) return;
    const revision = Number(rec.revision ?? 0);
    const w: Write = {
      at,
      rec,
      revision,
      computeMs: this.#compute.length > 0 ? this.#compute.reduce((a, b) => a + b, 0) : undefined,
      computeCpuMs: this.#computeCpu.length > 0 ? this.#computeCpu.reduce((a, b) => a + b, 0) : undefined,
      usage: this.usage(),
    };
    this.#compute = [];
    this.#computeCpu = [];
    this.revision = Math.max(this.revision, revision);
    this.writes.push(w);
    for (const x of [...this.#waiters]) {
      if (x.test(w)) {
        this.#waiters.delete(x);
        x.resolve(w);
      }
    }
  }
}

const gcHistogram = (text: string, kind: string) => histogram(text, 'weir_nodejs_gc_duration_seconds', (l) => l.includes(`kind="${kind}"`));

/** GC pauses of each kind between two scrapes of /metrics ('' for the process start). */
function gcPauses(from: string, to: string): string {
  return ['minor', 'major', 'incremental']
    .map((k) => {
      const h = minus(gcHistogram(to, k), gcHistogram(from, k));
      return `${k} ${h.count} (${f1(h.sum * 1000)} ms total)`;
    })
    .join(', ');
}

/** A cold start in a namespace of its own, stopped and torn down once the full state is written. */
async function coldStartOnce(cp: ControlPlane, argv: readonly string[], netns: string, teardowns: Set<() => void>): Promise<{ ms: number; hwmMB: number | undefined; line: string }> {
  let bridge: Bridge | undefined;
  let agent: Agent | undefined;
  const teardown = () => {
    if (agent && !agent.exited) agent.child.kill('SIGKILL');
    void bridge?.close().catch(() => {});
    spawnSync('ip', ['netns', 'delete', netns]);
  };
  teardowns.add(teardown);
  try {
    await createNs(netns);
    bridge = await bridgeApiServer(netns, Number(new URL(cp.server).port));
    const a = new Agent(netns, argv);
    agent = a;
    const first = await a.nextWrite((w) => w.rec.msg === 'resynced dataplane', 600_000, 'the first full write');
    const listed = a.firstAt.get('kube: every kind listed; sending the full state');
    const metrics = await scrapeMetrics(netns);
    const ms = first.at - a.spawnedAt;
    const line = `${secs(ms)} (list ${listed ? secs(listed.at - a.spawnedAt) : '-'}, compute ${f1(first.computeMs ?? Number.NaN)} ms, write ${f1(first.rec.ms ?? Number.NaN)} ms); RSS ${mb(first.usage?.rssMB)}, VmHWM ${mb(first.usage?.hwmMB)}; ${heap(metrics, 'weir_')}; GC ${gcPauses('', metrics)}`;
    return { ms, hwmMB: first.usage?.hwmMB, line };
  } finally {
    await agent?.stop();
    await bridge?.close().catch(() => {});
    await deleteNs(netns).catch(() => {});
    teardowns.delete(teardown);
  }
}

/** The agent's /metrics, fetched from inside its namespace. */
function scrapeMetrics(netns: string): Promise<string> {
  const script = `fetch('http://127.0.0.1:${METRICS_PORT}/metrics').then((r) => r.text()).then((t) => process.stdout.write(t), (e) => { console.error(String(e)); process.exit(1); })`;
  return new Promise((resolve) => {
    const child = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    child.stdout!.on('data', (c) => (out += c));
    child.on('close', () => resolve(out));
  });
}

interface Histogram {
  readonly buckets: Map<number, number>;
  readonly sum: number;
  readonly count: number;
}

/** One histogram of a Prometheus text exposition, summed over the series that pass `filter`. */
function histogram(text: string, name: string, filter: (labels: string) => boolean = () => true): Histogram {
  const buckets = new Map<number, number>();
  let sum = 0;
  let count = 0;
  for (const line of text.split('\n')) {
    const m = /^(\w+?)(_bucket|_sum|_count)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name || !filter(m[3] ?? '')) continue;
    const v = Number(m[4]);
    if (m[2] === '_sum') sum += v;
    else if (m[2] === '_count') count += v;
    else {
      const le = /le="([^"]+)"/.exec(m[3] ?? '')?.[1];
      const bound = le === '+Inf' ? Number.POSITIVE_INFINITY : Number(le);
      buckets.set(bound, (buckets.get(bound) ?? 0) + v);
    }
  }
  return { buckets, sum, count };
}

function minus(a: Histogram, b: Histogram): Histogram {
  return { buckets: new Map([...a.buckets].map(([le, v]) => [le, v - (b.buckets.get(le) ?? 0)])), sum: a.sum - b.sum, count: a.count - b.count };
}

/** The bucket bound under which a quantile lies (Prometheus histograms give no more). */
function bucketQuantile(h: Histogram, q: number): string {
  if (h.count <= 0) return '-';
  for (const [le, c] of [...h.buckets].sort((x, y) => x[0] - y[0])) if (c >= q * h.count) return le === Number.POSITIVE_INFINITY ? '> largest bucket' : `<= ${f1(le * 1000)} ms`;
  return '?';
}

const describeHistogram = (h: Histogram): string => `n=${h.count}, mean ${f1(h.count > 0 ? (h.sum / h.count) * 1000 : Number.NaN)} ms, p50 ${bucketQuantile(h, 0.5)}, p99 ${bucketQuantile(h, 0.99)}`;

// ---------------------------------------------------------------------------------------------
// Changes

interface Change {
  /** Untimed writes first (e.g. the pod's create before its status), each waited for. */
  readonly prep: ((api: Api) => Promise<unknown>)[];
  /** The timed write. */
  readonly write: (api: Api) => Promise<unknown>;
}

interface KindResult {
  readonly kind: string;
  readonly local: boolean | null;
  readonly latency: number[];
  readonly api: number[];
  readonly agentMs: number[];
  readonly computeMs: number[];
  readonly computeCpuMs: number[];
  /** Computes of SLOW_COMPUTE_MS and more: which change, and what its write added. */
  readonly slowComputes: string[];
  /** write->applied less the agent's write and compute: watch delivery, batching, debounce. */
  readonly other: number[];
  readonly steps: Record<string, number[]>;
  /** The slowest sample, whole: where its time went. */
  slowest?: { latency: number; agentMs: number; computeMs: number; computeCpuMs: number; other: number; steps: Record<string, number>; rules: number; waitedOn: string[] };
  changedKernel: number;
  resyncs: number;
  missed: number;
}

/** The shape (0-4) of synthetic policy j (bench/synthetic.ts's makePolicy). */
const shapeOf = (j: number): number => (j + Math.floor(j / size.namespaces)) % 5;

/** Whether synthetic shape `shape`'s podSelector selects a pod with these labels. */
function shapeSelects(shape: number, labels: Record<string, string>): boolean {
  return [true, labels.tier === 'db', labels.tier === 'api', labels.tier === 'web', labels.app === 'app1' || labels.app === 'app2'][shape];
}

/**
 * Remote pods whose tier web <-> api moves them in or out of a peer set of node-0. A local pod
 * of tier api in namespace n is selected by n's shape-2 policy, which allows tier=web from every
 * namespace of team t(n % 50) (its own team): the remote pods of those namespaces are peers.
 */
function peerPods(count: number, existing: number, localPods: readonly number[]): number[] {
  const teams = new Set<number>();
  for (const i of localPods) {
    const p = makePod(i, size);
    const n = Number(p.namespace.slice(3));
    for (let j = n; j < size.policies; j += size.namespaces) if (shapeOf(j) === 2 && p.labels.tier === 'api') teams.add(n % 50);
  }
  const out: number[] = [];
  // Spread over the cluster: a stride prime to any size here.
  for (let k = 0, i = 7; k < existing && out.length < count; k++, i = (i + 7919) % existing) {
    if (i % NODES !== 0 && teams.has((i % size.namespaces) % 50) && !out.includes(i)) out.push(i);
  }
  return out;
}

function changeKinds(existing: number): [string, boolean | null, (i: number) => Change][] {
  // The indices of engine.bench.ts: fresh pods on node-0 (local) and on node-1 (remote).
  const fresh = size.pods + 1000;
  const localIndex = (i: number) => fresh + i * NODES - ((fresh + i * NODES) % NODES);
  const remoteIndex = (i: number) => localIndex(i) + 1;
  const labels = new Map<number, Record<string, string>>();
  const labelsOf = (i: number) => labels.get(i) ?? { ...makePod(i, size).labels };
  /** A new tier for pod i: a merge patch of its labels. */
  const retier = (i: number, flip: (tier: string) => string) => {
    const l = { ...labelsOf(i), tier: flip(labelsOf(i).tier) };
    labels.set(i, l);
    const p = makePod(i, size);
    return (api: Api) => api.patch('Pod', p.namespace, p.name, { metadata: { labels: l } });
  };
  const add = (index: number): Change => {
    const p = makePod(index, size);
    return { prep: [(api) => api.request('POST', collection('Pod', p.namespace), podObject(p))], write: (api) => api.patch('Pod', p.namespace, p.name, podStatus(p), 'status') };
  };
  const del = (index: number): Change => {
    const p = makePod(index, size);
    return { prep: [], write: (api) => api.delete('Pod', p.namespace, p.name) };
  };
  // The pods of node-0 that exist (all of them unless populating stopped early).
  const localPods = Array.from({ length: Math.ceil(existing / NODES) }, (_, m) => m * NODES).filter((i) => i < existing);
  const peers = peerPods(CHANGES, existing, localPods);
  // Policy i has the shape engine.bench.ts's "policy add" has, in the namespace of a local pod
  // it selects (so that it is enforced on node-0), a different pod each time where possible.
  const policies = Array.from({ length: CHANGES }, (_, i) => {
    const p = makePolicy(size.policies + i, size);
    const shape = shapeOf(size.policies + i);
    let pod = localPods[(i * 7) % localPods.length];
    for (let k = 0; k < localPods.length; k++) {
      const candidate = localPods[(i * 7 + k) % localPods.length];
      if (shapeSelects(shape, makePod(candidate, size).labels)) {
        pod = candidate;
        break;
      }
    }
    return { ...p, namespace: makePod(pod, size).namespace, name: `bench-${i}` };
  });
  return [
    ['pod add (local)', true, (i) => add(localIndex(i))],
    ['pod delete (local)', true, (i) => del(localIndex(i))],
    ['pod add (remote)', false, (i) => add(remoteIndex(i))],
    ['pod delete (remote)', false, (i) => del(remoteIndex(i))],
    ['pod label change (remote)', false, (i) => ({ prep: [], write: retier(peers[i % peers.length], (t) => (t === 'web' ? 'api' : 'web')) })],
    ['pod label change (local)', true, (i) => ({ prep: [], write: retier(localPods[i % localPods.length], (t) => (t === 'db' ? 'api' : 'db')) })],
    ['policy add', null, (i) => ({ prep: [], write: (api) => api.request('POST', collection('NetworkPolicy', policies[i].namespace), policyObject(policies[i])) })],
    ['policy delete', null, (i) => ({ prep: [], write: (api) => api.request('DELETE', `/apis/networking.k8s.io/v1/namespaces/${policies[i].namespace}/networkpolicies/${policies[i].name}`) })],
  ];
}

const changedKernel = (r: LogRecord): boolean => {
  const s = r.stats ?? {};
  return (s.membersAdded ?? 0) + (s.membersRemoved ?? 0) + (s.setsCreated ?? 0) + (s.setsDeleted ?? 0) + (s.chainsWritten ?? 0) + (s.chainsDeleted ?? 0) > 0;
};

async function measureKind(agent: Agent, api: Api, kind: string, local: boolean | null, make: (i: number) => Change): Promise<KindResult> {
  const r: KindResult = { kind, local, latency: [], api: [], agentMs: [], computeMs: [], computeCpuMs: [], slowComputes: [], other: [], steps: {}, changedKernel: 0, resyncs: 0, missed: 0 };
  for (let i = 0; i < CHANGES; i++) {
    const c = make(i);
    try {
      for (const prep of c.prep) {
        const seen = agent.writeAfter(30_000, `${kind} #${i} (before the timed write)`);
        await prep(api);
        await seen;
        // A kubelet writes a pod's status well after creating it (sandbox, image): the timed
        // write follows a quiet spell, as the next change does (below).
        await sleep(50);
      }
      const seen = agent.writeAfter(30_000, `${kind} #${i}`);
      const sent = performance.now();
      await c.write(api);
      const answered = performance.now();
      const w = await seen;
      r.latency.push(w.at - answered);
      r.api.push(answered - sent);
      if (typeof w.rec.ms === 'number') r.agentMs.push(w.rec.ms);
      if (w.computeMs !== undefined) r.computeMs.push(w.computeMs);
      if (w.computeCpuMs !== undefined) r.computeCpuMs.push(w.computeCpuMs);
      if ((w.computeMs ?? 0) >= SLOW_COMPUTE_MS) {
        const st = w.rec.stats ?? {};
        r.slowComputes.push(`#${i} ${f1(w.computeMs ?? 0)} (CPU ${f1(w.computeCpuMs ?? Number.NaN)}; its write: ${st.setsCreated ?? 0} sets created, ${st.membersAdded ?? 0} members added)`);
      }
      r.other.push(w.at - answered - (w.rec.ms ?? 0) - (w.computeMs ?? 0));
      for (const [step, s] of Object.entries(w.rec.stats?.durations ?? {})) if (s > 0) (r.steps[step] ??= []).push(s * 1000);
      if (r.slowest === undefined || w.at - answered > r.slowest.latency) {
        r.slowest = {
          latency: w.at - answered,
          agentMs: w.rec.ms ?? 0,
          computeMs: w.computeMs ?? 0,
          computeCpuMs: w.computeCpuMs ?? Number.NaN,
          other: w.at - answered - (w.rec.ms ?? 0) - (w.computeMs ?? 0),
          steps: Object.fromEntries(Object.entries(w.rec.stats?.durations ?? {}).map(([k, v]) => [k, v * 1000])),
          rules: w.rec.stats?.rulesWritten ?? 0,
          waitedOn: agent.chores.filter((c) => c.at > answered && c.at < w.at).map((c) => c.what),
        };
      }
      if (changedKernel(w.rec)) r.changedKernel++;
      if (w.rec.resync) r.resyncs++;
    } catch (e) {
      r.missed++;
      progress(`${kind} #${i}: ${(e as Error).message.split('\n')[0]}`);
    }
    await sleep(50); // the next change is a batch of its own
  }
  return r;
}

// ---------------------------------------------------------------------------------------------

interface Figures {
  coldStartMs?: number;
  /** Every cold start's spawn -> full state written and VmHWM right after, the measured one last. */
  readonly starts: { ms: number; hwmMB: number | undefined }[];
  rssAfterStart?: number;
  hwmAfterStart?: number;
  rssRest?: number;
  hwmEnd?: number;
  rssEnd?: number;
  cpuRestPct?: number;
  results: KindResult[];
}

async function main(): Promise<void> {
  log(`bench:agent: Weir's targets on the built agent process against a real kube-apiserver`);
  log(`machine: ${machine({ iptables: true })}`);
  log(`source: ${sourceState('built')}`);
  log(
    `cluster (bench/synthetic.ts shapes, scale ${scale}): ${size.pods} pods on ${NODES} nodes (~${size.localPods} on ${NODE}), ${size.namespaces} namespaces, ${size.policies} policies; ${CHANGES} changes of each kind`,
  );

  progress(`building the agent from src/ into ${OUT}`);
  const built = spawnSync(process.execPath, [join(REPO, 'scripts/build.ts'), OUT], { encoding: 'utf8' });
  if (built.status !== 0) throw new Error(`scripts/build.ts failed:\n${(built.stdout + built.stderr).slice(0, 2000)}`);
  const main = join(OUT, 'cli/main.js');

  const figures: Figures = { results: [], starts: [] };
  let cp: ControlPlane | undefined;
  let clients: Clients | undefined;
  let bridge: Bridge | undefined;
  let agent: Agent | undefined;
  const netns = `${uniquePrefix('wagsc')}node`;
  let nsMade = false;
  // Ctrl-C, SIGTERM or an exit without the finally below: kill what we started, by PID, and
  // delete our namespace (the control plane has its own handler).
  const teardowns = new Set<() => void>();
  const unregister = registerExitCleanup(() => {
    for (const t of teardowns) t();
    if (agent && !agent.exited) agent.child.kill('SIGKILL');
    void bridge?.close().catch(() => {}); // kills its process in the namespace before its first await
    if (nsMade) spawnSync('ip', ['netns', 'delete', netns]);
  });
  try {
    section('1. populating the API server');
    cp = await startApiServer(log);
    clients = new Clients(cp, CONCURRENCY);
    // This node alone: the agent watches its own Node object only.
    const pop = await populate(cp, clients, { size, concurrency: CONCURRENCY, maxPopulateS: MAX_POPULATE_S, nodes: 1, log });
    await settle(SETTLE_S);

    section(`2. cold start: ${pop.pods} pods, ${pop.policies} policies`);
    // Node's flags as the image's entrypoint passes them.
    const argv = [
      ...NODE_FLAGS,
      ...AGENT_NODE_FLAGS,
      main,
      'agent',
      '--node-name',
      NODE,
      '--kubeconfig',
      cp.kubeconfig,
      '--source-binding',
      'off',
      '--log-level',
      'debug',
      '--metrics-addr',
      `127.0.0.1:${METRICS_PORT}`,
      ...AGENT_ARGS,
    ];
    log(`agent: node ${argv.map((x) => (x === cp?.kubeconfig ? '(admin kubeconfig)' : x.replace(REPO, ''))).join(' ')}  (in network namespace ${netns})`);
    log('for comparison, the same lists made by the bench itself (all kinds at once; bodies read, not parsed; no bridge):');
    log(`  500 a page, as the agent lists:                 ${await listLikeTheAgent(cp, 'limit=500')}`);
    log(`  one page each, resourceVersion=0 (watch cache): ${await listLikeTheAgent(cp, 'resourceVersion=0')}`);
    log(`  the same, namespaces and pods in protobuf:      ${await listLikeTheAgent(cp, 'resourceVersion=0', true)}`);
    if (STARTS > 1) log(`${STARTS - 1} cold starts before the measured one, each in a namespace of its own, stopped once written:`);
    for (let k = 1; k < STARTS; k++) {
      const start = await coldStartOnce(cp, argv, `${uniquePrefix('wagsc')}start`, teardowns);
      figures.starts.push(start);
      log(`  ${k}: ${start.line}`);
    }
    await createNs(netns);
    nsMade = true;
    bridge = await bridgeApiServer(netns, Number(new URL(cp.server).port));
    const others = { ...controlPlanePids(cp), bridge: bridgePid() };
    const cpu0 = cpuSnapshot(others);
    const a = new Agent(netns, argv);
    agent = a;
    a.snapshot = () => cpuSnapshot({ agent: a.pid, ...others });
    const first = await a.nextWrite((w) => w.rec.msg === 'resynced dataplane', 600_000, 'the first full write');
    const since = (msg: string) => {
      const x = a.firstAt.get(msg);
      return x ? `${secs(x.at - a.spawnedAt)}` : '-';
    };
    figures.coldStartMs = first.at - a.spawnedAt;
    figures.rssAfterStart = first.usage?.rssMB;
    figures.hwmAfterStart = first.usage?.hwmMB;
    figures.starts.push({ ms: figures.coldStartMs, hwmMB: first.usage?.hwmMB });
    const d = first.rec.stats?.durations ?? {};
    const st = first.rec.stats ?? {};
    log(`spawn -> first log line                      ${secs((a.firstAt.values().next().value?.at ?? Number.NaN) - a.spawnedAt)}`);
    const listed = a.firstAt.get('kube: every kind listed; sending the full state');
    const written = a.firstAt.get('resynced dataplane');
    log(`spawn -> "every kind listed" (list done)     ${since('kube: every kind listed; sending the full state')}`);
    if (listed) log(`  CPU meanwhile: ${cpuBetween(cpu0, listed.cpu)}`);
    log(`full state compute ("model updated")         ${f1(first.computeMs ?? Number.NaN)} ms`);
    log(
      `full write ("resynced dataplane")            ${f1(first.rec.ms ?? Number.NaN)} ms  (read ${f1((d.read ?? 0) * 1000)}, sets ${f1((d.sets ?? 0) * 1000)}, chains ${f1((d.chains ?? 0) * 1000)}, destroy ${f1((d.destroy ?? 0) * 1000)} ms)`,
    );
    log(
      `  wrote ${st.setsCreated ?? 0} sets, ${st.membersAdded ?? 0} members, ${st.chainsWritten ?? 0} chains, ${st.rulesWritten ?? 0} rules; kernel holds ${String(first.rec.sets)} sets, ${String(first.rec.chains)} chains, ${String(first.rec.rules)} rules`,
    );
    if (listed && written) log(`  CPU from the lists done to the full write: ${cpuBetween(listed.cpu, written.cpu)}`);
    log(`COLD START: spawn -> full state written       ${secs(figures.coldStartMs)}`);
    const metrics0 = await scrapeMetrics(netns);
    log(`RSS right after: ${mb(figures.rssAfterStart)}, peak so far (VmHWM) ${mb(figures.hwmAfterStart)}; ${heap(metrics0, 'weir_')}`);
    const u0 = a.usage();
    const writes0 = a.writes.length;
    await sleep(REST_S * 1000);
    const u1 = a.usage();
    figures.rssRest = u1?.rssMB;
    const restWrites = a.writes.slice(writes0);
    log(
      `${REST_S} s later, at rest: RSS ${mb(u1?.rssMB)}, VmHWM ${mb(u1?.hwmMB)}, ${heap(await scrapeMetrics(netns), 'weir_')}, CPU ${u0 && u1 ? ((100 * (u1.cpuS - u0.cpuS)) / REST_S).toFixed(1) : '-'}% of a core; writes meanwhile: ${restWrites.map((w) => `${w.rec.msg} ${f1(w.rec.ms ?? Number.NaN)} ms`).join(', ') || 'none'}`,
    );

    section(`3. incremental changes through the API server, ${CHANGES} of each, one at a time`);
    const metrics1 = await scrapeMetrics(netns);
    const api = clients.one;
    log('write->applied: API write answered -> the agent\'s "applied changes" line received; agent write: the ms of that line;');
    log('compute: the ms of its "model updated" line (calc, GC included); other: write->applied less both (watch delivery, batching, debounce)');
    log(
      `${'kind'.padEnd(26)} ${'write->applied p50/p99'.padStart(23)} ${'agent write p50/p99'.padStart(20)} ${'compute p50/p99'.padStart(16)} ${'other p50'.padStart(10)} ${'API answer p50'.padStart(15)}  kernel changed  steps p50 (ms)`,
    );
    for (const [kind, local, make] of changeKinds(pop.pods)) {
      const r = await measureKind(a, api, kind, local, make);
      figures.results.push(r);
      log(kindRow(r));
    }
    const metrics2 = await scrapeMetrics(netns);
    log("the slowest sample of each kind: write->applied = agent write (its steps) + compute (the loop thread's CPU time in it, in ticks on some kernels) + other; rules the write wrote");
    for (const r of figures.results) {
      const x = r.slowest;
      if (x === undefined) continue;
      const steps = Object.entries(x.steps)
        .filter(([, v]) => v > 0)
        .map(([k, v]) => `${k} ${f1(v)}`)
        .join(', ');
      const waited = x.waitedOn.length > 0 ? `; finished meanwhile: ${x.waitedOn.join(', ')}` : '';
      log(
        `  ${r.kind.padEnd(26)} ${f1(x.latency).padStart(7)} = ${f1(x.agentMs)} (${steps || 'no steps'}) + ${f1(x.computeMs)} (CPU ${f1(x.computeCpuMs)}) + ${f1(x.other)}; ${x.rules} rules${waited}`,
      );
    }
    log(`(n=${CHANGES}: p99 is the ${CHANGES >= 100 ? '99th percentile' : 'largest sample'}; steps are the agent's own per-step durations of the write)`);
    log(`computes of ${SLOW_COMPUTE_MS} ms and more ("model updated" ms), by change, with what the write that followed added:`);
    for (const r of figures.results) if (r.slowComputes.length > 0) log(`  ${r.kind.padEnd(26)} ${r.slowComputes.join('; ')}`);
    log("the agent's own histograms over section 3 (/metrics; bucket bounds):");
    log(`  weir_calc_duration_seconds        ${describeHistogram(minus(histogram(metrics2, 'weir_calc_duration_seconds'), histogram(metrics1, 'weir_calc_duration_seconds')))}`);
    log(`  weir_event_to_enforced_seconds    ${describeHistogram(minus(histogram(metrics2, 'weir_event_to_enforced_seconds'), histogram(metrics1, 'weir_event_to_enforced_seconds')))}`);
    for (const [label, from, to] of [
      ['cold start', '', metrics0],
      ['section 3', metrics1, metrics2],
    ] as const) {
      log(`  GC pauses (weir_nodejs_gc_duration_seconds), ${label.padEnd(10)}: ${gcPauses(from, to)}`);
    }

    section(`4. at rest for ${REST_S} s`);
    const w0 = a.writes.length;
    const r0 = a.usage();
    await sleep(REST_S * 1000);
    const r1 = a.usage();
    figures.cpuRestPct = r0 && r1 ? (100 * (r1.cpuS - r0.cpuS)) / REST_S : undefined;
    figures.rssEnd = r1?.rssMB;
    figures.hwmEnd = r1?.hwmMB;
    const resyncs = a.writes.slice(w0).filter((w) => w.rec.resync);
    log(
      `CPU at rest: ${figures.cpuRestPct?.toFixed(1) ?? '-'}% of a core over ${REST_S} s (the process and its waited-for children); periodic resyncs meanwhile: ${resyncs.length}${resyncs.length > 0 ? ` (${resyncs.map((w) => `${f1(w.rec.ms ?? Number.NaN)} ms`).join(', ')})` : ''}`,
    );
    log(`RSS at the end: ${mb(figures.rssEnd)}, peak over the whole run (VmHWM) ${mb(figures.hwmEnd)}; ${heap(await scrapeMetrics(netns), 'weir_')}`);
    const allResyncs = a.writes.filter((w) => w.rec.resync).slice(1);
    if (allResyncs.length > 0)
      log(
        `every periodic resync of the run: p50 ${f1(
          percentile(
            allResyncs.map((w) => w.rec.ms ?? 0),
            50,
          ),
        )} ms, max ${f1(Math.max(...allResyncs.map((w) => w.rec.ms ?? 0)))} ms (n=${allResyncs.length})`,
      );
    if (a.output.warnings.length > 0) {
      log(`agent warnings and errors: ${a.output.warnings.length}; the first ones:`);
      for (const l of a.output.warnings.slice(0, 5)) log(`  ${l.slice(0, 300)}`);
    }

    summary(figures, pop);
  } finally {
    await agent?.stop().catch(() => {});
    await bridge?.close().catch(() => {});
    if (nsMade) await deleteNs(netns);
    unregister();
    clients?.close();
    await cp?.stop();
  }
}

function kindRow(r: KindResult): string {
  const pp = (xs: number[]) => `${f1(percentile(xs, 50))} / ${f1(percentile(xs, 99))}`;
  const steps = Object.entries(r.steps).map(([step, xs]) => `${step} ${f1(percentile(xs, 50))}`);
  const notes = [r.resyncs > 0 ? `${r.resyncs} landed in a periodic resync` : '', r.missed > 0 ? `${r.missed} MISSED: no write within 30 s` : ''].filter(Boolean);
  return [
    r.kind.padEnd(26),
    pp(r.latency).padStart(23),
    pp(r.agentMs).padStart(20),
    pp(r.computeMs).padStart(16),
    f1(percentile(r.other, 50)).padStart(10),
    f1(percentile(r.api, 50)).padStart(15),
    ` ${`${r.changedKernel}/${r.latency.length}`.padStart(14)}`,
    ` ${steps.join(', ')}${notes.length > 0 ? `  (${notes.join('; ')})` : ''}`,
  ].join(' ');
}

function summary(fig: Figures, pop: Population): void {
  log(`\n== targets (issue 10), ${pop.pods} pods / ${pop.policies} policies${pop.podsError ? ` (NOT the full size: ${pop.podsError})` : ''}`);
  const onePod = fig.results.filter((r) => r.kind.startsWith('pod '));
  const p99 = (rs: KindResult[], pick: (r: KindResult) => number[]) => percentile(rs.flatMap(pick), 99);
  const worst = (rs: KindResult[], pick: (r: KindResult) => number[]) =>
    rs
      .map((r) => [r.kind, percentile(pick(r), 99)] as const)
      .sort((x, y) => y[1] - x[1])
      .slice(0, 2)
      .map(([k, v]) => `${k} ${f1(v)}`)
      .join(', ');
  const applied = p99(onePod, (r) => r.latency);
  const agentWrite = p99(onePod, (r) => r.agentMs);
  const compute = p99(fig.results, (r) => r.computeMs);
  const computeCpu = p99(fig.results, (r) => r.computeCpuMs);
  const starts = fig.starts;
  const peaks = starts.flatMap((x) => (x.hwmMB === undefined ? [] : [x.hwmMB]));
  const range = (xs: number[], digits: number) => `${Math.min(...xs).toFixed(digits)}-${Math.max(...xs).toFixed(digits)}`;
  const rows: [string, string, boolean | undefined][] = [
    [
      'one-pod change, local or remote, applied p99 < 50 ms',
      `write->applied p99 over every pod change ${f1(applied)} ms (worst: ${worst(onePod, (r) => r.latency)}); the agent's write alone p99 ${f1(agentWrite)} ms`,
      onePod.length > 0 ? applied < 50 : undefined,
    ],
    [
      'incremental compute p99 < 5 ms, GC included',
      `"model updated" p99 over every change ${f1(compute)} ms (worst: ${worst(fig.results, (r) => r.computeMs)}); the loop thread's CPU time in it p99 ${f1(computeCpu)} ms`,
      fig.results.length > 0 ? compute < 5 : undefined,
    ],
    [
      'cold start, list -> enforced < 2 s',
      `spawn -> full state written ${fig.coldStartMs === undefined ? '-' : secs(fig.coldStartMs)}${
        starts.length > 1
          ? ` (${starts.length} starts: ${range(
              starts.map((x) => x.ms / 1000),
              1,
            )} s)`
          : ''
      }`,
      starts.length === 0 ? undefined : Math.max(...starts.map((x) => x.ms)) < 2000,
    ],
    [
      'RSS of the agent process < 300 MB',
      `after cold start ${mb(fig.rssAfterStart)}, at rest ${mb(fig.rssRest)}, at the end ${mb(fig.rssEnd)}, peak (VmHWM) ${mb(fig.hwmEnd)}${starts.length > 1 ? ` (${starts.length} starts, peak right after each: ${range(peaks, 0)} MB)` : ''}`,
      fig.hwmEnd === undefined ? undefined : Math.max(fig.hwmEnd, ...peaks) < 300,
    ],
  ];
  for (const [target, measured, met] of rows) log(`${target.padEnd(52)} ${measured}  -> ${met === undefined ? 'not measured' : met ? 'met' : 'NOT met'}`);
  log(`CPU at rest: ${fig.cpuRestPct?.toFixed(1) ?? '-'}% of a core`);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
