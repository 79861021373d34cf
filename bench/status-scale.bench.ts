// npm run bench:status: the policy status aggregator at scale on a real kube-apiserver.
// 1,000 NodePolicyStatus objects written as 1,000 agents would (the reporter's own bodies and
// server-side applies, through the shared client, at a bounded rate), 20k NetworkPolicies, one
// node enforcing all of them, and one aggregator (the real code) in a child process run with
// the image's Node flags, so that its CPU, RSS and requests are its own. Prints, asserts nothing:
//   - the largest NodePolicyStatus in bytes (as the API server serves it);
//   - the aggregator's requests (lists, watches, writes, Lease), CPU and memory per phase
//     (RSS at the end and its peak during the phase, V8's heap): before it starts (modules and
//     input loaded), initial (write 20k NetworkPolicyStatus), steady (node heartbeats only),
//     changes;
//   - the time from a policy change to its NetworkPolicyStatus saying Enforced at the new
//     generation (the desired nodes report after a simulated 50 ms apply).
// WEIR_BENCH_NODES, WEIR_BENCH_POLICIES, WEIR_BENCH_CHANGES, WEIR_BENCH_STEADY_S scale it down.
// Where the memory goes: WEIR_BENCH_MEMDIR=DIR writes the child's /proc/self/smaps halfway
// through the first pass's writes and after each phase; with WEIR_BENCH_HEAPSNAPSHOTS=1 a heap
// snapshot too (which leaves RSS higher), with WEIR_BENCH_HEAPPROF=1 (or =promoted) a sampling
// heap profile. WEIR_BENCH_CHILD_FLAGS adds Node flags to the child (e.g. --trace-gc).

import { fork } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Session } from 'node:inspector';
import v8 from 'node:v8';
import { KubeConfig } from '@kubernetes/client-node';
import { NODE_FLAGS } from '../src/cli/node-flags.ts';
import { APPLY_PATCH, createKubeClient, MERGE_PATCH } from '../src/kube/client.ts';
import type { RequestRecord } from '../src/kube/client.ts';
import { silentLogger } from '../src/log.ts';
import { agentFieldManager, applyQuery, nodeObjectBody, nodeStatusBody, nodeStatusPath, policyStatusPath } from '../src/status/bodies.ts';
import { buildNodeStatus } from '../src/status/node-status.ts';
import type { EnforcedPolicy } from '../src/status/node-status.ts';
import { createPolicyStatusAggregator } from '../src/controller/aggregator.ts';
import type { PolicyStatusInput } from '../src/status/index.ts';
import { rng } from '../test/support/rng.ts';
import { percentile } from './stats.ts';

const NODES = Number(process.env.WEIR_BENCH_NODES ?? 1000);
const POLICIES = Number(process.env.WEIR_BENCH_POLICIES ?? 20_000);
const CHANGES = Number(process.env.WEIR_BENCH_CHANGES ?? 10);
const STEADY_S = Number(process.env.WEIR_BENCH_STEADY_S ?? 60);
const NAMESPACES = 200;
/** Each policy selects pods on this many random nodes, and on node 0 (which enforces all). */
const SPREAD = 5;
const CRDS = fileURLToPath(new URL('../crds/', import.meta.url));

interface Stats {
  readonly requests: Record<string, number>;
  readonly cpuMs: number;
  readonly passes: Record<string, number>;
  readonly mem: Mem;
}

/** The child's memory, MiB: RSS now and its peak since the last reset (VmHWM), V8's heap
 *  (committed, in use) and what V8 counts outside it (external, of which array buffers). */
interface Mem {
  readonly rss: number;
  readonly peak: number;
  readonly heapTotal: number;
  readonly heapUsed: number;
  readonly external: number;
  readonly arrayBuffers: number;
}

type ToChild = { type: 'update'; uid: string; generation: number } | { type: 'stats'; resetPeak?: boolean } | { type: 'snapshot'; label: string };
type FromChild = { type: 'ready'; mem: Mem } | { type: 'stats'; stats: Stats } | { type: 'pass'; result: string } | { type: 'snapshot'; file: string };

const MIB = 2 ** 20;

function memNow(): Mem {
  const m = process.memoryUsage();
  const hwm = /VmHWM:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'));
  return {
    rss: m.rss / MIB,
    peak: hwm === null ? Number.NaN : Number(hwm[1]) / 1024,
    heapTotal: m.heapTotal / MIB,
    heapUsed: m.heapUsed / MIB,
    external: m.external / MIB,
    arrayBuffers: m.arrayBuffers / MIB,
  };
}

/** Starts a new peak (VmHWM) from the current RSS: writing 5 to clear_refs resets it. */
function resetPeak(): void {
  writeFileSync('/proc/self/clear_refs', '5');
}

/** The aggregator, alone in this process: counts its requests, reports on demand. */
async function aggregatorChild(): Promise<void> {
  const kc = new KubeConfig();
  kc.loadFromFile(process.env.WEIR_BENCH_KUBECONFIG!);
  const policies = JSON.parse(await readFile(process.env.WEIR_BENCH_INPUT!, 'utf8')) as PolicyStatusInput[];
  const requests: Record<string, number> = {};
  const passes: Record<string, number> = {};
  const kindOf = (r: RequestRecord) => (r.path.includes('/leases') ? 'lease' : r.watch ? 'watch' : r.method === 'GET' ? (/statuses$/.test(r.path) ? 'list' : 'get') : 'write');
  const agg = createPolicyStatusAggregator({
    kubeConfig: kc,
    identity: 'node-00000',
    log: silentLogger(),
    onRequest: (r) => void (requests[kindOf(r)] = (requests[kindOf(r)] ?? 0) + 1),
    onWrite: (result) => {
      passes[result] = (passes[result] ?? 0) + 1;
      process.send!({ type: 'pass', result } satisfies FromChild);
    },
  });
  const byUid = new Map(policies.map((p, i) => [p.uid, i]));
  // Before the aggregator does anything: the modules and the input, which are not its memory.
  const before = memNow();
  resetPeak();
  // WEIR_BENCH_HEAPPROF=1: V8's sampling heap profiler from here on; its profile holds what
  // has not been collected yet, garbage included, by the function that allocated it.
  // WEIR_BENCH_HEAPPROF=promoted: also what a major collection freed, i.e. every object that
  // outlived the young generation (what grows the old one), live or not.
  const heapProf = process.env.WEIR_BENCH_HEAPPROF;
  const inspector = heapProf === '1' || heapProf === 'promoted' ? new Session() : undefined;
  inspector?.connect();
  inspector?.post('HeapProfiler.startSampling', { samplingInterval: 8192, includeObjectsCollectedByMajorGC: heapProf === 'promoted' });
  agg.start();
  agg.update({ policies: [...policies] });
  process.on('message', (m: ToChild) => {
    if (m.type === 'update') {
      const i = byUid.get(m.uid)!;
      policies[i] = { ...policies[i], generation: m.generation };
      agg.update({ policies: [...policies] });
    } else if (m.type === 'snapshot') {
      // The mappings first: a heap snapshot allocates a lot outside V8's heap, and keeps some.
      const dir = process.env.WEIR_BENCH_MEMDIR!;
      writeFileSync(join(dir, `${m.label}.smaps`), readFileSync('/proc/self/smaps'));
      const written = async (): Promise<string> => {
        if (inspector !== undefined) {
          const profile = await new Promise<unknown>((resolve, reject) => inspector.post('HeapProfiler.getSamplingProfile', (err, r) => (err ? reject(err) : resolve(r.profile))));
          writeFileSync(join(dir, `${m.label}.heapprofile`), JSON.stringify(profile));
        }
        if (process.env.WEIR_BENCH_HEAPSNAPSHOTS === '1') return v8.writeHeapSnapshot(join(dir, `${m.label}.heapsnapshot`));
        return join(dir, `${m.label}.smaps`);
      };
      void written().then((file) => process.send!({ type: 'snapshot', file } satisfies FromChild));
    } else {
      const cpu = process.cpuUsage();
      const stats: Stats = { requests: { ...requests }, passes: { ...passes }, cpuMs: (cpu.user + cpu.system) / 1000, mem: memNow() };
      if (m.resetPeak) resetPeak();
      process.send!({ type: 'stats', stats } satisfies FromChild);
    }
  });
  process.on('disconnect', () => void agg.stop().then(() => process.exit(0)));
  process.send!({ type: 'ready', mem: before } satisfies FromChild);
}

/** Runs `fn` over `items`, `n` at a time. */
async function pool<T>(items: readonly T[], n: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (next < items.length) await fn(items[next++]);
    }),
  );
}

const nodeName = (i: number) => `node-${String(i).padStart(5, '0')}`;

async function main(): Promise<void> {
  const { startControlPlane } = await import('../test/integration/controlplane.ts');
  const began = performance.now();
  const since = () => `${((performance.now() - began) / 1000).toFixed(1)} s`;
  const cp = await startControlPlane();
  const work = await mkdtemp(join(tmpdir(), 'weir-bench-status-'));
  let child: ChildProcess | null = null;
  try {
    await cp.kubectl(['apply', '-f', CRDS]);
    await cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev']);
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
    const client = createKubeClient(kc, { timeoutMs: 60_000 });
    const random = rng(7);

    // The cluster: namespaces, nodes, policies.
    await pool(
      Array.from({ length: NAMESPACES }, (_, i) => `bench-${i}`),
      16,
      async (name) => {
        await client.send({ method: 'POST', path: '/api/v1/namespaces', body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name } } });
      },
    );
    const nodeUids: string[] = [];
    await pool(
      Array.from({ length: NODES }, (_, i) => i),
      16,
      async (i) => {
        const o = (await client.send({ method: 'POST', path: '/api/v1/nodes', body: { apiVersion: 'v1', kind: 'Node', metadata: { name: nodeName(i) } } })) as { metadata: { uid: string } };
        nodeUids[i] = o.metadata.uid;
      },
    );
    const policies: PolicyStatusInput[] = [];
    await pool(
      Array.from({ length: POLICIES }, (_, i) => i),
      32,
      async (i) => {
        const namespace = `bench-${i % NAMESPACES}`;
        const name = `policy-${i}`;
        const body = { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name, namespace }, spec: { podSelector: { matchLabels: { app: name } }, policyTypes: ['Ingress'] } };
        const o = (await client.send({ method: 'POST', path: `/apis/networking.k8s.io/v1/namespaces/${namespace}/networkpolicies`, body })) as { metadata: { uid: string; generation: number } };
        const desired = new Set([nodeName(0)]);
        while (desired.size < Math.min(NODES, SPREAD + 1)) desired.add(nodeName(Math.floor(random() * NODES)));
        policies[i] = { namespace, name, uid: o.metadata.uid, generation: o.metadata.generation, accepted: { ok: true, message: '' }, desiredNodes: [...desired].sort() };
      },
    );
    console.log(`cluster: ${NAMESPACES} namespaces, ${NODES} nodes, ${POLICIES} NetworkPolicies (${since()})`);

    // What each node enforces, and its NodePolicyStatus as its reporter writes it.
    const enforced = new Map<string, Map<string, EnforcedPolicy>>();
    for (let i = 0; i < NODES; i++) enforced.set(nodeName(i), new Map());
    for (const p of policies) for (const n of p.desiredNodes) enforced.get(n)!.set(p.uid, { namespace: p.namespace, name: p.name, uid: p.uid, generation: p.generation });
    const writeNode = async (i: number, objectToo: boolean): Promise<void> => {
      const node = nodeName(i);
      const ps = [...enforced.get(node)!.values()];
      const q = applyQuery(agentFieldManager(node));
      if (objectToo) await client.send({ method: 'PATCH', path: nodeStatusPath(node), query: q, body: nodeObjectBody(node, nodeUids[i]), contentType: APPLY_PATCH });
      const status = buildNodeStatus(
        { synced: true, lastApply: { ok: true }, lastSyncTime: Date.now(), counts: { localPods: 30, policies: ps.length, sets: 40, chains: 90, rules: 1_500 }, policies: ps },
        undefined,
        Date.now(),
      );
      await client.send({ method: 'PATCH', path: nodeStatusPath(node, 'status'), query: q, body: nodeStatusBody(node, status), contentType: APPLY_PATCH });
    };
    await pool(
      Array.from({ length: NODES }, (_, i) => i),
      8,
      (i) => writeNode(i, true),
    );
    console.log(`${NODES} NodePolicyStatus objects written (${since()})`);

    // Object sizes as the API server serves them.
    let largest = { node: '', bytes: 0 };
    let total = 0;
    let cont = '';
    do {
      const page = (await client.send({ method: 'GET', path: '/apis/weir.dev/v1alpha1/nodepolicystatuses', query: { limit: '500', ...(cont ? { continue: cont } : {}) } })) as {
        items: { metadata: { name: string } }[];
        metadata: { continue?: string };
      };
      for (const item of page.items) {
        const bytes = Buffer.byteLength(JSON.stringify(item));
        total += bytes;
        if (bytes > largest.bytes) largest = { node: item.metadata.name, bytes };
      }
      cont = page.metadata.continue ?? '';
    } while (cont !== '');
    console.log(`NodePolicyStatus size: largest ${largest.bytes} bytes (${largest.node}, enforcing ${enforced.get(largest.node)!.size} policies); all ${NODES}: ${(total / 2 ** 20).toFixed(1)} MiB`);

    // The aggregator.
    const input = join(work, 'input.json');
    await writeFile(input, JSON.stringify(policies));
    child = fork(fileURLToPath(import.meta.url), ['--aggregator'], {
      env: { ...process.env, WEIR_BENCH_KUBECONFIG: cp.kubeconfig, WEIR_BENCH_INPUT: input },
      // The image's Node flags, as the agent and the controller run; WEIR_BENCH_CHILD_FLAGS adds
      // more for the measured child alone (e.g. --trace-gc).
      execArgv: [...process.execArgv, ...NODE_FLAGS, ...(process.env.WEIR_BENCH_CHILD_FLAGS ?? '').split(' ').filter(Boolean)],
    });
    const c = child;
    let lastPass = performance.now();
    let oks = 0;
    const statsWaiters: ((s: Stats) => void)[] = [];
    const snapshotWaiters: ((file: string) => void)[] = [];
    const ready = new Promise<Mem>((resolve) => {
      c.on('message', (m: FromChild) => {
        if (m.type === 'pass') {
          lastPass = performance.now();
          if (m.result === 'ok') oks++;
        } else if (m.type === 'stats') statsWaiters.shift()?.(m.stats);
        else if (m.type === 'snapshot') snapshotWaiters.shift()?.(m.file);
        else resolve(m.mem);
      });
    });
    /** The child's figures; `resetPeak` starts the next phase's peak from here. */
    const stats = (resetPeak = false): Promise<Stats> =>
      new Promise((resolve) => {
        statsWaiters.push(resolve);
        c.send({ type: 'stats', resetPeak } satisfies ToChild);
      });
    const snapshots = process.env.WEIR_BENCH_MEMDIR;
    const snapshot = async (label: string): Promise<void> => {
      if (snapshots === undefined) return;
      const file = await new Promise<string>((resolve) => {
        snapshotWaiters.push(resolve);
        c.send({ type: 'snapshot', label } satisfies ToChild);
      });
      console.log(`  written: ${file}`);
    };
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    const mib = (x: number) => `${x.toFixed(0)} MiB`;
    const memLine = (m: Mem) => `RSS ${mib(m.rss)} (peak ${mib(m.peak)}), V8 heap ${mib(m.heapUsed)} used of ${mib(m.heapTotal)}, external ${mib(m.external)} (array buffers ${mib(m.arrayBuffers)})`;
    const report = (label: string, a: Stats, b: Stats, seconds: number) => {
      const req = Object.fromEntries(
        Object.keys({ ...a.requests, ...b.requests })
          .sort()
          .map((k) => [k, (b.requests[k] ?? 0) - (a.requests[k] ?? 0)]),
      );
      const n = Object.values(req).reduce((x, y) => x + y, 0);
      console.log(
        `  ${label.padEnd(9)} ${seconds.toFixed(1).padStart(6)} s  requests ${String(n).padStart(6)} (${(n / seconds).toFixed(1)}/s: ${Object.entries(req)
          .map(([k, v]) => `${k} ${v}`)
          .join(', ')})  ` + `CPU ${((b.cpuMs - a.cpuMs) / 1000).toFixed(1)} s (${((100 * (b.cpuMs - a.cpuMs)) / 1000 / seconds).toFixed(0)}%)`,
      );
      console.log(`  ${''.padEnd(9)} ${memLine(b.mem)}`);
    };
    const zero: Stats = { requests: {}, cpuMs: 0, passes: {}, mem: { rss: 0, peak: 0, heapTotal: 0, heapUsed: 0, external: 0, arrayBuffers: 0 } };
    console.log('aggregator (its own process):');
    console.log(`  before     (modules loaded, input of ${POLICIES} policies parsed) ${memLine(await ready)}`);
    if (process.env.WEIR_BENCH_HEAPSNAPSHOTS === '1') console.log('  (with heap snapshots: the RSS figures after one include what the snapshot kept)');

    // Initial: every NetworkPolicyStatus written; done when no pass ran for 3 s after the first ok.
    // A snapshot halfway through the writes shows what the first pass holds while it runs.
    const t0 = performance.now();
    let halfway = snapshots === undefined;
    while (oks === 0 || performance.now() - lastPass < 3_000) {
      await sleep(halfway ? 100 : 1_000);
      if (!halfway && ((await stats()).requests.write ?? 0) >= POLICIES) {
        halfway = true;
        await snapshot('first-pass');
      }
    }
    const initial = await stats(true);
    report('initial', zero, initial, (performance.now() - t0) / 1000);
    await snapshot('initial');

    // Steady: nodes heartbeat (lastSyncTime every 5 min each: NODES / 300 per second); nothing
    // the aggregator needs changes.
    const s0 = await stats(true);
    const t1 = performance.now();
    let hb = 0;
    while (performance.now() - t1 < STEADY_S * 1000) {
      await writeNode(hb++ % NODES, false);
      await sleep(300_000 / NODES);
    }
    const s1 = await stats();
    report('steady', s0, s1, (performance.now() - t1) / 1000);
    await snapshot('rest');

    // Changes: a policy's spec changes; the holder sees the new generation, the desired nodes
    // apply it (50 ms) and report; measured until its NetworkPolicyStatus says Enforced.
    const converge: number[] = [];
    const c0 = await stats(true);
    const t2 = performance.now();
    for (let k = 0; k < CHANGES; k++) {
      const p = policies[Math.floor(random() * policies.length)];
      const o = (await client.send({
        method: 'PATCH',
        path: `/apis/networking.k8s.io/v1/namespaces/${p.namespace}/networkpolicies/${p.name}`,
        body: { spec: { podSelector: { matchLabels: { app: p.name, change: String(k) } } } },
        contentType: MERGE_PATCH,
      })) as { metadata: { generation: number } };
      const start = performance.now();
      const generation = o.metadata.generation;
      c.send({ type: 'update', uid: p.uid, generation } satisfies ToChild);
      await sleep(50);
      for (const n of p.desiredNodes) enforced.get(n)!.set(p.uid, { namespace: p.namespace, name: p.name, uid: p.uid, generation });
      await Promise.all(p.desiredNodes.map((n) => writeNode(Number(n.slice(5)), false)));
      for (;;) {
        const s = (await client.send({ method: 'GET', path: policyStatusPath(p.namespace, p.name) })) as {
          status?: { observedGeneration?: number; conditions?: { type: string; status: string }[] };
        };
        const ok = s.status?.observedGeneration === generation && s.status.conditions?.some((x) => x.type === 'Enforced' && x.status === 'True');
        if (ok) break;
        if (performance.now() - start > 60_000) throw new Error(`${p.name} not Enforced at generation ${generation} after 60 s`);
        await sleep(10);
      }
      converge.push(performance.now() - start);
    }
    const c1 = await stats();
    report('changes', c0, c1, (performance.now() - t2) / 1000);
    await snapshot('changes');
    console.log(
      `policy change to Enforced at the new generation (${CHANGES} changes, ${SPREAD + 1} nodes each, node ${nodeName(0)} enforcing all ${POLICIES}): ` +
        `p50 ${percentile(converge, 50).toFixed(0)} ms, max ${percentile(converge, 100).toFixed(0)} ms`,
    );
    console.log(`passes: ${JSON.stringify(c1.passes)}; total ${since()}`);
    await client.close();
  } finally {
    child?.disconnect();
    await cp.stop();
    await rm(work, { recursive: true, force: true });
  }
}

if (process.argv[2] === '--aggregator') await aggregatorChild();
else await main();
