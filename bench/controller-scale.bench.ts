// npm run bench:controller: the memory of `weir controller` at cluster scale, on the built
// process against a real kube-apiserver. The API server holds a cluster of bench/synthetic.ts's
// shapes (default 100k pods over 1,000 nodes, 10k namespaces, 20k policies; written by
// bench/populate-cluster.ts) and one NodePolicyStatus per node, written as each node's agent
// would write it once it enforces every policy that selects one of its pods (the digests of
// src/status/realization.ts, over the uids and generations the API server gave the policies).
// Then a controller runs (with --starts, several, one after the other), with the image's Node flags (src/cli/node-flags.ts), the admin
// kubeconfig, and the chart's arguments otherwise; it is the only replica, so it leads. Its RSS
// is read from /proc every --sample-ms. While it runs, the nodes heartbeat (each NodePolicyStatus's
// lastSyncTime rewritten every 5 minutes, as agents do). Prints measured figures; asserts nothing:
//   1. populating the API server, and how long it took
//   2. each start's first pass: spawn -> every kind listed -> first NetworkPolicyStatus -> every
//      NetworkPolicyStatus written (seen by the bench's own watch: every policy has a status at
//      its generation); RSS sampled in each phase, the peak (VmHWM), V8's heap, the writes
//   then at rest for --rest-s: RSS, the peak over the whole run, CPU, writes meanwhile
//
//   npm run bench:controller -- --scale=0.1
// Flags: --scale (WEIR_BENCH_SCALE, default 1), --concurrency (API writes in flight while
// populating, 32), --rest-s (60), --settle-s (wait up to this long for the load average to fall
// under 1 after populating, 60), --max-populate-s (stop creating pods after this long; 0: no
// limit), --sample-ms (250), --source (run src/cli/main.ts instead of the bundle that
// scripts/build.ts makes in .cache/controller-scale/weir-dist, which is what the image runs),
// --first-pass-timeout-s (900), --starts (controllers run one after the other on the populated
// cluster, every NetworkPolicyStatus deleted before each: 1).
// WEIR_BENCH_CONTROLLER_NODE_FLAGS: extra Node flags for the controller (e.g. --trace-gc).
// WEIR_BENCH_MEMDIR=DIR: the controller's /proc/PID/smaps there halfway through the first pass's
// writes, at its end and at rest; with WEIR_BENCH_HEAPSNAPSHOTS=1 a heap snapshot too (--heapsnapshot-signal: the
// snapshot leaves RSS higher, so such a run's later figures are not the product's).
// WEIR_BENCH_CONTROLLER_LOG=FILE keeps the controller's output.

import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { NODE_FLAGS } from '../src/cli/node-flags.ts';
import { ControllerModel } from '../src/controller/policy-inputs.ts';
import type { ModelEvent } from '../src/model/types.ts';
import { registerExitCleanup } from '../src/sim/cleanup.ts';
import { agentFieldManager, nodeObjectBody, nodeStatusBody, nodeStatusPath, policyStatusListPath } from '../src/status/bodies.ts';
import { buildNodeStatus, type EnforcedPolicy } from '../src/status/node-status.ts';
import type { ControlPlane } from '../test/integration/controlplane.ts';
import type { Api } from './peers/api.ts';
import { ProcessLog } from './process-log.ts';
import { heap, log, machine, mb, metric, section, sourceState, words } from './report.ts';
import { Clients, loadAverage, type Population, startApiServer, pool, populate, progress, secs, settle, withRetry, benchNumber } from './populate-cluster.ts';
import { makeNamespace, makePod, makePolicy, type SyntheticSize } from './synthetic.ts';

const REPO = fileURLToPath(new URL('../', import.meta.url));
const OUT = join(REPO, '.cache/controller-scale/weir-dist');

const { values: flags } = parseArgs({
  options: {
    scale: { type: 'string' },
    concurrency: { type: 'string' },
    'rest-s': { type: 'string' },
    'settle-s': { type: 'string' },
    'max-populate-s': { type: 'string' },
    'sample-ms': { type: 'string' },
    'first-pass-timeout-s': { type: 'string' },
    source: { type: 'boolean' },
    starts: { type: 'string' },
  },
  strict: true,
});
const num = benchNumber;
const scale = num(flags.scale, process.env.WEIR_BENCH_SCALE, 1);
const CONCURRENCY = Math.max(1, Math.round(num(flags.concurrency, undefined, 32)));
const REST_S = num(flags['rest-s'], undefined, 60);
const SETTLE_S = num(flags['settle-s'], undefined, 60);
const MAX_POPULATE_S = num(flags['max-populate-s'], undefined, 0);
const SAMPLE_MS = Math.max(20, num(flags['sample-ms'], undefined, 250));
const FIRST_PASS_TIMEOUT_S = num(flags['first-pass-timeout-s'], undefined, 900);
const FROM_SOURCE = flags.source ?? false;
/** Controllers run one after the other on the one populated cluster, every NetworkPolicyStatus
 *  deleted before each but the first: the spread of the figures in one run. */
const STARTS = Math.max(1, Math.round(num(flags.starts, undefined, 1)));
const EXTRA_NODE_FLAGS = words(process.env.WEIR_BENCH_CONTROLLER_NODE_FLAGS);
const MEMDIR = process.env.WEIR_BENCH_MEMDIR;
const HEAPSNAPSHOTS = MEMDIR !== undefined && process.env.WEIR_BENCH_HEAPSNAPSHOTS === '1';
const LOG_FILE = process.env.WEIR_BENCH_CONTROLLER_LOG;
if (MEMDIR) mkdirSync(MEMDIR, { recursive: true });

/** 100 pods a node: 1,000 nodes at the default scale, each namespace's pods on several of them
 *  (a policy is enforced on 1-10 nodes), as a scheduler spreads them. */
const size: SyntheticSize = {
  pods: Math.round(100_000 * scale),
  namespaces: Math.max(1, Math.round(10_000 * scale)),
  policies: Math.round(20_000 * scale),
  localPods: 100,
  spreadNamespaces: true,
};
const NODES = Math.max(1, Math.round(size.pods / size.localPods));
/** How often an agent rewrites its NodePolicyStatus when only lastSyncTime changed
 *  (src/status/node-reporter.ts DEFAULT_HEARTBEAT_MS). */
const HEARTBEAT_MS = 5 * 60_000;
const TARGET_MB = 300;

// ---------------------------------------------------------------------------------------------
// What each node enforces, and its NodePolicyStatus

/** Each node's enforced policies: those that select one of its pods, as the controller's own
 *  model decides (src/controller/policy-inputs.ts), at the uid and generation the API server
 *  gave each policy. */
function enforcedByNode(pop: Population): Map<string, EnforcedPolicy[]> {
  const model = new ControllerModel();
  const events: ModelEvent[] = [];
  for (let i = 0; i < pop.namespaces; i++) events.push({ kind: 'Namespace', op: 'upsert', object: makeNamespace(i) });
  for (let j = 0; j < pop.policies; j++) {
    const p = makePolicy(j, size);
    const ref = pop.policyRefs[j];
    events.push({ kind: 'NetworkPolicy', op: 'upsert', object: { ...p, uid: ref.uid, generation: ref.generation } });
  }
  for (let i = 0; i < pop.pods; i++) events.push({ kind: 'Pod', op: 'upsert', object: makePod(i, size) });
  model.apply(events);
  const out = new Map<string, EnforcedPolicy[]>();
  for (let n = 0; n < NODES; n++) out.set(`node-${n}`, []);
  for (const p of model.statusInputs()) {
    // An invalid policy is still enforced (its pods isolated), and listed as failing.
    const error = p.accepted.ok ? undefined : p.accepted.message;
    for (const node of p.desiredNodes) out.get(node)?.push({ namespace: p.namespace, name: p.name, uid: p.uid, generation: p.generation, ...(error === undefined ? {} : { error }) });
  }
  return out;
}

const APPLY = 'application/apply-patch+yaml';

/** A node's NodePolicyStatus as its agent writes it (src/status/node-reporter.ts): the object with
 *  its owner, then the status, both server-side applies of the node's field manager. Counts of
 *  sets, chains and rules are left at 0: the controller does not read them. */
async function writeNodeStatus(api: Api, node: string, nodeUid: string, policies: readonly EnforcedPolicy[], objectToo: boolean): Promise<void> {
  const q = `?fieldManager=${encodeURIComponent(agentFieldManager(node))}&force=true`;
  if (objectToo) await withRetry(`NodePolicyStatus ${node}`, () => api.request('PATCH', nodeStatusPath(node) + q, nodeObjectBody(node, nodeUid), APPLY));
  const now = Date.now();
  const status = buildNodeStatus(
    { synced: true, lastApply: { ok: true }, lastSyncTime: now, counts: { localPods: size.localPods, policies: policies.length, sets: 0, chains: 0, rules: 0 }, policies },
    undefined,
    now,
  );
  await withRetry(`status of NodePolicyStatus ${node}`, () => api.request('PATCH', nodeStatusPath(node, 'status') + q, nodeStatusBody(node, status), APPLY));
}

// ---------------------------------------------------------------------------------------------
// The bench's own watch of every NetworkPolicyStatus

interface StatusWatch {
  /** Objects with a status at their policy's generation. */
  written(): number;
  /** Of those, how many say Enforced True, and the others' reasons. */
  reasons(): Map<string, number>;
  readonly events: { added: number; modified: number; deleted: number };
  firstEventAt: number | undefined;
  /** When written() reached the number of policies. */
  allWrittenAt: number | undefined;
  stop(): void;
}

type StatusObject = {
  metadata: { namespace: string; name: string; resourceVersion: string };
  status?: { observedGeneration?: number; conditions?: { type: string; status: string; reason: string }[] };
};

async function watchStatuses(cp: ControlPlane, api: Api, pop: Population): Promise<StatusWatch> {
  const generation = new Map<string, number>();
  for (let j = 0; j < pop.policies; j++) {
    const p = makePolicy(j, size);
    generation.set(`${p.namespace}/${p.name}`, pop.policyRefs[j].generation);
  }
  const list = await api.request<{ metadata: { resourceVersion: string } }>('GET', `${policyStatusListPath()}?limit=1`);
  let rv = list.metadata.resourceVersion;
  /** Per object: undefined (no status at its generation yet), or its Enforced reason. */
  const state = new Map<string, string>();
  const ca = /certificate-authority-data:\s*(\S+)/.exec(readFileSync(cp.kubeconfig, 'utf8'))?.[1] ?? '';
  const agent = new HttpsAgent({ keepAlive: true, ca: Buffer.from(ca, 'base64') });
  let stopped = false;
  let current: { destroy(): void } | undefined;
  const w: StatusWatch = {
    written: () => state.size,
    reasons() {
      const out = new Map<string, number>();
      for (const r of state.values()) out.set(r, (out.get(r) ?? 0) + 1);
      return out;
    },
    events: { added: 0, modified: 0, deleted: 0 },
    firstEventAt: undefined,
    allWrittenAt: undefined,
    stop() {
      stopped = true;
      current?.destroy();
      agent.destroy();
    },
  };
  const onEvent = (type: string, o: StatusObject): void => {
    if (type === 'BOOKMARK') {
      rv = o.metadata.resourceVersion;
      return;
    }
    if (type === 'ERROR') {
      // 410 Gone: start again from now (what was missed is counted from the next events).
      rv = '';
      return;
    }
    rv = o.metadata.resourceVersion;
    w.firstEventAt ??= performance.now();
    const key = `${o.metadata.namespace}/${o.metadata.name}`;
    if (type === 'ADDED') w.events.added++;
    else if (type === 'MODIFIED') w.events.modified++;
    else if (type === 'DELETED') w.events.deleted++;
    const enforced = o.status?.conditions?.find((c) => c.type === 'Enforced');
    if (type !== 'DELETED' && enforced !== undefined && o.status?.observedGeneration === generation.get(key)) state.set(key, `Enforced ${enforced.status} (${enforced.reason})`);
    else state.delete(key);
    if (w.allWrittenAt === undefined && state.size >= pop.policies) w.allWrittenAt = performance.now();
  };
  const loop = async (): Promise<void> => {
    while (!stopped) {
      await new Promise<void>((resolve) => {
        const url = new URL(`${policyStatusListPath()}?watch=1&allowWatchBookmarks=true${rv ? `&resourceVersion=${rv}` : ''}`, cp.server);
        const req = httpsRequest(url, { agent, headers: { authorization: `Bearer ${cp.token}`, accept: 'application/json' } }, (res) => {
          const lines = createInterface({ input: res });
          // Stopped, or the API server ended the watch: the loop watches again or ends.
          lines.on('error', () => resolve());
          res.on('error', () => resolve());
          lines.on('line', (l) => {
            const e = JSON.parse(l) as { type: string; object: StatusObject };
            onEvent(e.type, e.object);
          });
          res.on('close', () => resolve());
        });
        current = req;
        req.on('error', () => resolve());
        req.end();
      });
      if (!stopped) await sleep(200);
    }
  };
  void loop();
  return w;
}

// ---------------------------------------------------------------------------------------------
// The controller process

interface Mem {
  readonly rssMB: number;
  readonly hwmMB: number;
  readonly anonMB: number;
  readonly fileMB: number;
  readonly cpuS: number;
}

const TICK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** The process's own figures from /proc (the controller starts no children). */
function memOf(pid: number): Mem | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? Number.NaN) / 1024;
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { rssMB: kb('VmRSS'), hwmMB: kb('VmHWM'), anonMB: kb('RssAnon'), fileMB: kb('RssFile'), cpuS: (Number(f[11]) + Number(f[12])) / TICK };
  } catch {
    return null;
  }
}

interface LogRecord {
  readonly level?: number;
  readonly msg?: string;
  readonly port?: number;
  readonly [k: string]: unknown;
}

class Controller {
  readonly child: ChildProcess;
  readonly spawnedAt = performance.now();
  readonly output: ProcessLog<LogRecord>;
  readonly firstAt = new Map<string, number>();
  port: number | undefined;
  /** RSS samples: [ms since spawn, MB]. */
  readonly samples: [number, number][] = [];
  readonly #timer: NodeJS.Timeout;

  constructor(argv: readonly string[]) {
    this.child = spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'], cwd: MEMDIR ?? REPO });
    this.output = new ProcessLog(this.spawnedAt, LOG_FILE ? { path: LOG_FILE, append: true } : undefined);
    for (const s of [this.child.stdout!, this.child.stderr!]) createInterface({ input: s }).on('line', (l) => this.#onLine(l));
    this.#timer = setInterval(() => {
      const m = this.mem();
      if (m) this.samples.push([performance.now() - this.spawnedAt, m.rssMB]);
    }, SAMPLE_MS);
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  mem(): Mem | null {
    return this.exited ? null : memOf(this.pid);
  }

  /** The largest RSS sampled between two times (ms since spawn). */
  maxRss(from: number, to: number): number {
    let m = Number.NaN;
    for (const [t, v] of this.samples) if (t >= from && t <= to && !(v <= m)) m = v;
    return m;
  }

  /** Resolves once the controller logs `msg` (at once if it has). */
  async logged(msg: string, timeoutMs: number): Promise<number> {
    const until = performance.now() + timeoutMs;
    while (!this.firstAt.has(msg)) {
      if (this.exited) throw new Error(`the controller exited (${this.child.exitCode ?? this.child.signalCode}); last lines:\n${this.output.last(10)}`);
      if (performance.now() > until) throw new Error(`the controller did not log "${msg}" within ${timeoutMs} ms; last lines:\n${this.output.last(10)}`);
      await sleep(50);
    }
    return this.firstAt.get(msg)!;
  }

  async metrics(): Promise<string> {
    if (this.port === undefined) return '';
    try {
      return await (await fetch(`http://127.0.0.1:${this.port}/metrics`)).text();
    } catch {
      return '';
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    if (!this.exited) {
      const gone = new Promise<void>((r) => this.child.once('exit', () => r()));
      this.child.kill('SIGTERM');
      const force = setTimeout(() => this.child.kill('SIGKILL'), 5000);
      await gone;
      clearTimeout(force);
    }
    this.output.end();
  }

  #onLine(line: string): void {
    const at = performance.now();
    const rec = this.output.read(line, at);
    if (rec === undefined) return;
    if (typeof rec.msg === 'string' && !this.firstAt.has(rec.msg)) this.firstAt.set(rec.msg, at);
    if (typeof rec.port === 'number' && rec.msg?.startsWith('serving /metrics')) this.port = rec.port;
  }
}

/** GC pauses of each kind since the process started, from its /metrics. */
function gcPauses(text: string): string {
  return ['major', 'minor', 'incremental']
    .map((k) => {
      const count = metric(text, 'weir_controller_nodejs_gc_duration_seconds_count', (l) => l.includes(`kind="${k}"`));
      const sum = metric(text, 'weir_controller_nodejs_gc_duration_seconds_sum', (l) => l.includes(`kind="${k}"`));
      return `${k} ${count ?? '-'} (${sum === undefined ? '-' : (sum * 1000).toFixed(0)} ms)`;
    })
    .join(', ');
}

function passes(text: string): string {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const m = /^weir_status_writes_total\{([^}]*)\} (\S+)$/.exec(line);
    if (m) out.push(`${m[1].replace(/"/g, '')}: ${m[2]}`);
  }
  return out.join('; ') || 'none';
}

const memLine = (m: Mem | null): string => (m === null ? 'the process is gone' : `RSS ${mb(m.rssMB)} (anonymous ${mb(m.anonMB)}, file-backed ${mb(m.fileMB)}), peak (VmHWM) ${mb(m.hwmMB)}`);

/** The controller's mappings, and on request a heap snapshot (which it writes into MEMDIR, its
 *  working directory, on SIGUSR2). */
async function memoryFiles(c: Controller, label: string): Promise<void> {
  if (!MEMDIR) return;
  writeFileSync(join(MEMDIR, `${label}.smaps`), readFileSync(`/proc/${c.pid}/smaps`));
  log(`  written: ${join(MEMDIR, `${label}.smaps`)}`);
  if (!HEAPSNAPSHOTS) return;
  const before = new Set(readdirSync(MEMDIR));
  c.child.kill('SIGUSR2');
  for (let k = 0; k < 600; k++) {
    await sleep(500);
    const made = readdirSync(MEMDIR).filter((f) => f.endsWith('.heapsnapshot') && !before.has(f));
    // Written once its size stops growing.
    if (made.length > 0) {
      const file = join(MEMDIR, made[0]);
      let last = -1;
      for (;;) {
        const sizeNow = readFileSync(file).length;
        if (sizeNow === last) break;
        last = sizeNow;
        await sleep(1000);
      }
      const named = join(MEMDIR, `${label}.heapsnapshot`);
      renameSync(file, named);
      log(`  written: ${named}`);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------

interface StartFigures {
  readonly listedMs: number;
  readonly doneMs: number;
  readonly writesMs: number;
  readonly allWritten: boolean;
  readonly atDone: Mem | null;
  readonly atRest: Mem | null;
  readonly writes: { added: number; modified: number };
}

/** Removes every NetworkPolicyStatus (one collection per namespace), so that the next controller
 *  has a whole first pass to make; resolves once none is left. */
async function deleteStatuses(clients: Clients, pop: Population): Promise<void> {
  const r = await pool(pop.namespaces, CONCURRENCY, async (i) => {
    await withRetry(`NetworkPolicyStatus of ns-${i}`, () => clients.pick().request('DELETE', `/apis/weir.dev/v1alpha1/namespaces/ns-${i}/networkpolicystatuses`));
  });
  if (r.error) throw r.error;
  while ((await clients.one.request<{ items: unknown[] }>('GET', `${policyStatusListPath()}?limit=1`)).items.length > 0) await sleep(500);
}

/** One controller: its first pass and its rest. `label` names its memory files. */
async function oneStart(
  ctx: { cp: ControlPlane; clients: Clients; pop: Population; enforced: Map<string, EnforcedPolicy[]>; main: string },
  label: string,
  stopLater: (c: Controller, w: StatusWatch, hb: AbortController) => void,
): Promise<StartFigures> {
  const { cp, clients, pop, enforced } = ctx;
  const watch = await watchStatuses(cp, clients.one, pop);
  const argv = [
    ...NODE_FLAGS,
    ...EXTRA_NODE_FLAGS,
    ...(HEAPSNAPSHOTS ? ['--heapsnapshot-signal=SIGUSR2'] : []),
    ctx.main,
    'controller',
    '--kubeconfig',
    cp.kubeconfig,
    '--identity',
    'bench-controller',
    '--daemonset',
    'kube-system/weir',
    '--metrics-addr',
    '127.0.0.1:0',
    '--log-level',
    'info',
  ];
  log(`controller: node ${argv.map((x) => (x === cp.kubeconfig ? '(admin kubeconfig)' : x.replace(REPO, ''))).join(' ')}`);
  const ctl = new Controller(argv);
  // The nodes' heartbeats, spread evenly: NODES every HEARTBEAT_MS.
  const hb = new AbortController();
  stopLater(ctl, watch, hb);
  let beats = 0;
  void (async () => {
    for (let k = 0; !hb.signal.aborted; k++) {
      await sleep(HEARTBEAT_MS / NODES, undefined, { signal: hb.signal }).catch(() => {});
      if (hb.signal.aborted) break;
      const node = `node-${k % NODES}`;
      await writeNodeStatus(clients.pick(), node, pop.nodeUids[k % NODES], enforced.get(node)!, false).catch((e: unknown) => progress(`heartbeat of ${node}: ${(e as Error).message}`));
      beats++;
    }
  })();

  const listedAt = (await ctl.logged('every kind listed: this replica can write status once it holds the Lease', 600_000)) - ctl.spawnedAt;
  const atListed = ctl.mem();
  log(`spawn -> every kind listed                  ${secs(listedAt)}; then ${memLine(atListed)}; largest RSS sampled meanwhile ${mb(ctl.maxRss(0, listedAt))}`);
  const deadline = performance.now() + FIRST_PASS_TIMEOUT_S * 1000;
  let lastProgress = performance.now();
  let halfway = false;
  while (watch.allWrittenAt === undefined && performance.now() < deadline && !ctl.exited) {
    await sleep(100);
    if (!halfway && watch.written() >= pop.policies / 2) {
      halfway = true;
      await memoryFiles(ctl, `${label}halfway`);
    }
    if (performance.now() - lastProgress > 10_000) {
      lastProgress = performance.now();
      const m = ctl.mem();
      progress(`NetworkPolicyStatus at their generation: ${watch.written()}/${pop.policies}; RSS ${mb(m?.rssMB)}, VmHWM ${mb(m?.hwmMB)}; load ${loadAverage().toFixed(2)}`);
    }
  }
  const doneAt = (watch.allWrittenAt ?? performance.now()) - ctl.spawnedAt;
  const evDone = { ...watch.events };
  const atDone = ctl.mem();
  const firstAt = watch.firstEventAt === undefined ? Number.NaN : watch.firstEventAt - ctl.spawnedAt;
  log(`spawn -> first NetworkPolicyStatus written  ${secs(firstAt)}`);
  if (watch.allWrittenAt === undefined) log(`NOT ALL WRITTEN within ${FIRST_PASS_TIMEOUT_S} s${ctl.exited ? ' (the controller exited)' : ''}: ${watch.written()} of ${pop.policies}`);
  log(`spawn -> every NetworkPolicyStatus written  ${secs(doneAt)} (the writes: ${secs(doneAt - firstAt)}); then ${memLine(atDone)}`);
  log(`largest RSS sampled: while listing ${mb(ctl.maxRss(0, listedAt))}, from the lists to the last write ${mb(ctl.maxRss(listedAt, doneAt))}`);
  log(`writes seen by the bench's watch: ${evDone.added} created, ${evDone.modified} modified, ${evDone.deleted} deleted; statuses: ${[...watch.reasons()].map(([r, n]) => `${n} ${r}`).join(', ')}`);
  // The pass compacts V8's heap once its last write is answered: a few seconds on.
  await sleep(5000);
  const metricsDone = await ctl.metrics();
  log(`5 s later: ${memLine(ctl.mem())}; ${heap(metricsDone, 'weir_controller_')}`);
  log(`CPU of the controller: ${atListed?.cpuS.toFixed(1) ?? '-'} s by the end of the lists, ${atDone?.cpuS.toFixed(1) ?? '-'} s by the last write; GC pauses so far: ${gcPauses(metricsDone)}`);
  log(`the controller's passes so far (weir_status_writes_total): ${passes(metricsDone)}`);
  await memoryFiles(ctl, `${label}first-pass`);

  log(`at rest for ${REST_S} s (nodes heartbeat: ${NODES} every ${HEARTBEAT_MS / 60_000} min):`);
  const ev0 = { ...watch.events };
  const beats0 = beats;
  const r0 = ctl.mem();
  const restFrom = performance.now() - ctl.spawnedAt;
  await sleep(REST_S * 1000);
  const r1 = ctl.mem();
  const restTo = performance.now() - ctl.spawnedAt;
  const metricsRest = await ctl.metrics();
  const cpuRest = r0 && r1 ? (100 * (r1.cpuS - r0.cpuS)) / REST_S : Number.NaN;
  log(`  ${memLine(r1)}; largest RSS sampled during the rest ${mb(ctl.maxRss(restFrom, restTo))}; ${heap(metricsRest, 'weir_controller_')}`);
  log(
    `  CPU ${cpuRest.toFixed(1)}% of a core; NodePolicyStatus heartbeats meanwhile ${beats - beats0}; NetworkPolicyStatus writes meanwhile ${watch.events.added - ev0.added + watch.events.modified - ev0.modified + watch.events.deleted - ev0.deleted}`,
  );
  log(`  the controller's passes in all: ${passes(metricsRest)}`);
  await memoryFiles(ctl, `${label}rest`);
  if (ctl.output.warnings.length > 0) {
    log(`controller warnings and errors: ${ctl.output.warnings.length}; the first ones:`);
    for (const l of ctl.output.warnings.slice(0, 5)) log(`  ${l.slice(0, 300)}`);
  }
  return {
    listedMs: listedAt,
    doneMs: doneAt,
    writesMs: doneAt - firstAt,
    allWritten: watch.allWrittenAt !== undefined,
    atDone,
    atRest: r1,
    writes: { added: evDone.added, modified: evDone.modified },
  };
}

async function main(): Promise<void> {
  log(`bench:controller: weir controller's memory against a real kube-apiserver`);
  log(`machine: ${machine()}`);
  log(`source: ${sourceState('run')}`);
  log(`cluster (bench/synthetic.ts shapes, scale ${scale}): ${size.pods} pods on ${NODES} nodes (${size.localPods} each), ${size.namespaces} namespaces, ${size.policies} policies`);

  let main: string;
  if (FROM_SOURCE) main = join(REPO, 'src/cli/main.ts');
  else {
    progress(`building the bundle from src/ into ${OUT}`);
    const built = spawnSync(process.execPath, [join(REPO, 'scripts/build.ts'), OUT], { encoding: 'utf8' });
    if (built.status !== 0) throw new Error(`scripts/build.ts failed:\n${(built.stdout + built.stderr).slice(0, 2000)}`);
    main = join(OUT, 'cli/main.js');
  }

  let cp: ControlPlane | undefined;
  let clients: Clients | undefined;
  let running: { c: Controller; w: StatusWatch; hb: AbortController } | undefined;
  const stopRunning = async (): Promise<void> => {
    const r = running;
    running = undefined;
    r?.hb.abort();
    await r?.c.stop().catch(() => {});
    r?.w.stop();
  };
  const unregister = registerExitCleanup(() => {
    if (running && !running.c.exited) running.c.child.kill('SIGKILL');
  });
  try {
    section('1. populating the API server');
    cp = await startApiServer(log);
    clients = new Clients(cp, CONCURRENCY);
    const pop = await populate(cp, clients, { size, concurrency: CONCURRENCY, maxPopulateS: MAX_POPULATE_S, nodes: NODES, log });
    const t0 = performance.now();
    const enforced = enforcedByNode(pop);
    const perNode = [...enforced.values()].map((ps) => ps.length);
    const perPolicy = new Map<string, number>();
    for (const ps of enforced.values()) for (const p of ps) perPolicy.set(p.uid, (perPolicy.get(p.uid) ?? 0) + 1);
    const spread = [...perPolicy.values()];
    const c = clients;
    const nodeStatuses = await pool(NODES, 16, async (n) => {
      const node = `node-${n}`;
      await writeNodeStatus(c.pick(), node, pop.nodeUids[n], enforced.get(node)!, true);
    });
    if (nodeStatuses.error) throw nodeStatuses.error;
    log(
      `NodePolicyStatus: ${nodeStatuses.done} in ${secs(performance.now() - t0)}, each node's digests over the policies that select its pods (${Math.min(...perNode)}-${Math.max(...perNode)} a node, ${perNode.reduce((a, b) => a + b, 0)} in all; a policy on ${Math.min(...spread)}-${Math.max(...spread)} nodes, ${pop.policies - spread.length} on none)`,
    );

    const starts: StartFigures[] = [];
    for (let k = 1; k <= STARTS; k++) {
      if (k > 1) {
        const t = performance.now();
        await deleteStatuses(clients, pop);
        progress(`every NetworkPolicyStatus deleted in ${secs(performance.now() - t)}`);
      }
      await settle(SETTLE_S);
      section(`2.${k} the first pass${STARTS > 1 ? ` of start ${k} of ${STARTS}` : ''}: ${pop.pods} pods, ${pop.policies} policies, ${NODES} nodes, no NetworkPolicyStatus yet`);
      starts.push(
        await oneStart({ cp, clients, pop, enforced, main }, STARTS > 1 ? `start-${k}-` : '', (c, w, hb) => {
          running = { c, w, hb };
        }),
      );
      await stopRunning();
    }

    log(`\n== target, ${pop.pods} pods / ${pop.policies} policies / ${NODES} nodes${pop.podsError ? ` (NOT the full size: ${pop.podsError})` : ''}${STARTS > 1 ? `, ${STARTS} starts` : ''}`);
    const all = (pick: (s: StartFigures) => number | undefined) => starts.map((s) => pick(s) ?? Number.NaN);
    const list = (xs: number[], f: (x: number) => string) => xs.map(f).join(', ');
    const verdict = (xs: number[]) => (xs.some(Number.isNaN) ? 'not measured' : Math.max(...xs) < TARGET_MB ? 'met' : 'NOT met');
    const peaks = all((s) => s.atDone?.hwmMB);
    const rests = all((s) => s.atRest?.rssMB);
    log(`controller RSS < ${TARGET_MB} MB through its first pass: peak (VmHWM) by the last write ${list(peaks, mb)}  -> ${verdict(peaks)}`);
    log(
      `controller RSS < ${TARGET_MB} MB at rest: ${list(rests, mb)} ${REST_S} s after the last write; peak over each whole run ${list(
        all((s) => s.atRest?.hwmMB),
        mb,
      )}  -> ${verdict([...rests, ...all((s) => s.atRest?.hwmMB)])}`,
    );
    log(
      `every NetworkPolicyStatus written after spawn: ${list(
        all((s) => (s.allWritten ? s.doneMs : Number.NaN)),
        (x) => (Number.isNaN(x) ? 'not all' : secs(x)),
      )} (lists ${list(
        all((s) => s.listedMs),
        secs,
      )}; writes ${list(
        all((s) => s.writesMs),
        secs,
      )}); writes seen: ${starts.map((s) => `${s.writes.added} created + ${s.writes.modified} modified`).join(', ')}`,
    );
  } finally {
    await stopRunning();
    unregister();
    clients?.close();
    await cp?.stop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
