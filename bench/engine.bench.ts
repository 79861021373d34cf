// npm run bench: the engine at cluster scale. Prints measured figures; asserts nothing.
//   cold compile, payload sizes, incremental compute per kind of change, and the time to
//   apply each, all inside a network namespace this script creates (and always deletes).
// Size: WEIR_BENCH_SCALE=0.1 runs a tenth of the default 100k pods / 10k ns / 20k policies.
// Then, in calc alone, ClusterNetworkPolicies: one node with 110 local pods and 1,000 Admin
// policies (the first batch, one policy's change, and a namespace's label change under them);
// WEIR_BENCH_ONLY=cnp runs that part alone (no network namespace, no root),
// WEIR_BENCH_CNP_CHANGES sets its changes (50).

import { spawn } from 'node:child_process';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { Calculator, makeNames } from '../src/calc/index.ts';
import { NODE_FLAGS } from '../src/cli/node-flags.ts';
import type { Dirty } from '../src/calc/index.ts';
import { createDataplane, processRunner, recordingRunner } from '../src/dataplane/index.ts';
import { silentLogger } from '../src/log.ts';
import type { ModelEvent, RawClusterNetworkPolicy } from '../src/model/types.ts';
import { createNs, deleteNs, uniquePrefix } from '../src/sim/netns.ts';
import { percentile } from './stats.ts';
import { initialEvents, makeNamespace, makePod, makePolicy, NODE, type SyntheticSize } from './synthetic.ts';

const scale = Number(process.env.WEIR_BENCH_SCALE ?? 1);
const size: SyntheticSize = {
  pods: Math.round(100_000 * scale),
  namespaces: Math.round(10_000 * scale),
  policies: Math.round(20_000 * scale),
  localPods: 110,
};
const ITERATIONS = Number(process.env.WEIR_BENCH_ITERATIONS ?? 100);
/** Changes of each kind made first and not counted: the first of a kind runs code the JIT has
 *  not compiled yet (a one-off after start, not a steady cost). GC pauses are counted. */
const WARMUP = Number(process.env.WEIR_BENCH_WARMUP ?? 5);
const names = makeNames('cali');
const marks = { accept: 0x10000, pass: 0x20000 };
const ms = (t0: number) => performance.now() - t0;
const fmt = (x: number) => (x < 10 ? x.toFixed(3) : x.toFixed(1));
const mb = (bytes: number) => (bytes / 1e6).toFixed(1);
/** RSS beside what V8 holds: a gap between them is memory the heap has given back to V8 but
 *  the process has not returned to the system, or buffers outside the heap. */
const memory = () => {
  const m = process.memoryUsage();
  return `rss ${mb(m.rss)} MB, heap used ${mb(m.heapUsed)} MB of ${mb(m.heapTotal)} MB, external ${mb(m.external)} MB, peak rss ${mb(process.resourceUsage().maxRSS * 1024)} MB`;
};

async function main(): Promise<void> {
  console.log(`synthetic cluster: ${size.pods} pods, ${size.namespaces} namespaces, ${size.policies} policies, ~${size.localPods} pods on ${NODE}`);
  const events = initialEvents(size);

  // Cold compile.
  let t0 = performance.now();
  const calc = new Calculator({ nodeName: NODE, names, families: [4, 6], marks });
  calc.applyEvents(events);
  const coldCompile = ms(t0);
  events.length = 0;
  (globalThis as { gc?: () => void }).gc?.();
  console.log(`memory after cold compile: ${memory()}`);
  let members = 0;
  for (const s of calc.desired.sets.values()) members += s.members.size;
  const rules = [4, 6].reduce((n, f) => n + [...calc.desired.chains[f as 4 | 6].values()].reduce((m, r) => m + r.length, 0), 0);
  console.log(
    `\ncold compile: ${fmt(coldCompile)} ms  (local pods ${calc.localPodCount}, sets ${calc.desired.sets.size}, members ${members}, chains ${calc.desired.chains[4].size}+${calc.desired.chains[6].size}, rules ${rules})`,
  );

  // The kernel side runs in a namespace of our own: this process was started inside it (see
  // the end of the file), so commands run directly, as in an agent on a node.
  {
    const backend = process.env.WEIR_BENCH_BACKEND === 'legacy' ? 'legacy' : 'nft';
    console.log(`backend: ${backend}`);
    // Each write's steps (sets, chains, destroy), to show where an apply's time goes.
    let steps: Record<string, number[]> = {};
    const onMetric = { step: (step: string, seconds: number) => (steps[step] ??= []).push(seconds * 1000) };
    const dataplane = createDataplane({ runner: processRunner(), names, families: [4, 6], backend, log: silentLogger(), onMetric });
    dataplane.markDirty(cloneDirtyAll(calc));
    t0 = performance.now();
    await dataplane.resync(calc.desired);
    const coldApply = ms(t0);
    const coldSteps = Object.entries(steps)
      .map(([step, xs]) => `${step} ${fmt(xs[0])}`)
      .join(', ');
    console.log(`cold apply in a network namespace: ${fmt(coldApply)} ms (${coldSteps})  -> cold start (compile + apply) ${fmt(coldCompile + coldApply)} ms`);
    // What an agent holds after start-up: the model, the desired state and the dataplane's
    // record (the source's objects are the model's own).
    (globalThis as { gc?: () => void }).gc?.();
    console.log(`memory after cold start: ${memory()}`);
    // What the agent's periodic resync costs when nothing drifted: every member read back and
    // compared (one in FULL_READ_EVERY), or set sizes only (the others).
    for (const members of ['all', 'counts'] as const) {
      steps = {};
      t0 = performance.now();
      const resynced = await dataplane.resync(calc.desired, { members });
      const resyncSteps = Object.entries(steps)
        .map(([step, xs]) => `${step} ${fmt(xs[0])}`)
        .join(', ');
      console.log(
        `periodic resync reading ${members === 'all' ? 'every member' : 'set sizes'}, nothing drifted: ${fmt(ms(t0))} ms (${resyncSteps}; members added ${resynced.membersAdded}, removed ${resynced.membersRemoved})`,
      );
    }

    const kinds = changeKinds();
    console.log(`\nincremental changes, ${ITERATIONS} of each after ${WARMUP} not counted: compute (calc) and apply (kernel), p50 / p99 in ms`);
    console.log('(on nft a change is written as additions only; the tidy that the agent runs after a quiet second follows each, timed apart)');
    console.log('kind'.padEnd(28), 'compute p50', 'compute p99', '  apply p50', '  apply p99', '   tidy p50', ' sets/members/chains dirtied (last)', ' steps p50');
    for (const [kind, make] of kinds) {
      const compute: number[] = [];
      const apply: number[] = [];
      const tidy: number[] = [];
      let last = '';
      steps = {};
      for (let i = 0; i < WARMUP + ITERATIONS; i++) {
        if (i === WARMUP) steps = {};
        const ev = make(i);
        let t = performance.now();
        const dirty = calc.applyEvents(ev);
        const computeMs = ms(t);
        dataplane.markDirty(dirty);
        t = performance.now();
        await dataplane.apply(calc.desired);
        const applyMs = ms(t);
        const stepsOfApply = steps;
        steps = {};
        t = performance.now();
        if (dataplane.status().tidyPending > 0) {
          await dataplane.apply(calc.desired, { tidy: true });
          if (i >= WARMUP) tidy.push(ms(t));
        }
        steps = stepsOfApply;
        if (i < WARMUP) continue;
        compute.push(computeMs);
        apply.push(applyMs);
        last = describeDirty(dirty);
      }
      console.log(
        kind.padEnd(28),
        fmt(percentile(compute, 50)).padStart(11),
        fmt(percentile(compute, 99)).padStart(11),
        fmt(percentile(apply, 50)).padStart(11),
        fmt(percentile(apply, 99)).padStart(11),
        (tidy.length > 0 ? fmt(percentile(tidy, 50)) : '-').padStart(11),
        ' ' + last.padEnd(34),
        Object.entries(steps)
          .map(([step, xs]) => `${step} ${fmt(percentile(xs, 50))}`)
          .join(', '),
      );
    }
  }
  (globalThis as { gc?: () => void }).gc?.();
  console.log(`\nmemory at the end: ${memory()}`);

  // Payload sizes, from the real dataplane writing to a recorded empty kernel.
  const recorder = recordingRunner();
  const dry = createDataplane({ runner: recorder, names, families: [4, 6], backend: 'nft', log: silentLogger() });
  dry.markDirty(cloneDirtyAll(calc));
  t0 = performance.now();
  await dry.resync(calc.desired);
  const renderMs = ms(t0);
  for (const call of recorder.calls) {
    if (call.input) console.log(`payload ${call.cmd.padEnd(22)} ${mb(Buffer.byteLength(call.input)).padStart(6)} MB, ${call.input.split('\n').length} lines`);
  }
  console.log(`render of the full payloads: ${fmt(renderMs)} ms`);

  console.log('targets: incremental compute < 2 ms, one-pod change applied < 50 ms, cold start < 3000 ms, RSS < 400 MB');
  clusterPolicyBench();
}

const CNP_CHANGES = Number(process.env.WEIR_BENCH_CNP_CHANGES ?? 50);

/**
 * ClusterNetworkPolicies in calc alone: one node's 110 pods (of 1,100 in 20 namespaces) and
 * 1,000 Admin policies that select them all, or that select no pod at all. Times the first
 * batch (everything at once, as a cold start) and one policy's change: its priority, or the
 * port of its ingress rule.
 */
function clusterPolicyBench(): void {
  const POLICIES = 1000;
  const cluster: SyntheticSize = { pods: 1100, namespaces: 20, policies: 0, localPods: 110 };
  const base: ModelEvent[] = [];
  for (let i = 0; i < cluster.namespaces; i++) base.push({ kind: 'Namespace', op: 'upsert', object: makeNamespace(i) });
  for (let i = 0; i < cluster.pods; i++) base.push({ kind: 'Pod', op: 'upsert', object: makePod(i, cluster) });
  const load = loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');
  console.log(
    `\nClusterNetworkPolicies, calc alone: ${cluster.pods} pods (${cluster.localPods} on ${NODE}), ${POLICIES} Admin policies; ${CNP_CHANGES} changes of each kind after ${WARMUP} not counted, p50 / p99 in ms; load average ${load}`,
  );
  for (const subjects of ['every pod', 'no pod'] as const) {
    const priority = Array.from({ length: POLICIES }, (_, j) => j % 1000);
    const port = Array.from({ length: POLICIES }, (_, j) => 8000 + (j % 50));
    const generation = Array.from({ length: POLICIES }, () => 1);
    const cnp = (j: number): ModelEvent => ({ kind: 'ClusterNetworkPolicy', op: 'upsert', object: benchClusterPolicy(j, subjects === 'every pod', priority[j], port[j], generation[j]) });
    const calc = new Calculator({ nodeName: NODE, names, families: [4, 6], marks });
    const events = [...base, ...Array.from({ length: POLICIES }, (_, j) => cnp(j))];
    const t0 = performance.now();
    calc.applyEvents(events);
    const first = ms(t0);
    const enforced = calc.enforcedClusterPolicyReports().length;
    console.log(`  subjects select ${subjects}: first batch ${fmt(first)} ms (local pods ${calc.localPodCount}, policies whose subject holds one ${enforced})`);
    const kinds: [string, (j: number, i: number) => void][] = [
      ['priority change', (j, i) => (priority[j] = (priority[j] + 1 + (i % 7)) % 1000)],
      ['rule change (a port)', (j, i) => (port[j] = 9000 + i)],
    ];
    for (const [kind, change] of kinds) {
      const times: number[] = [];
      let last = '';
      for (let i = 0; i < WARMUP + CNP_CHANGES; i++) {
        const j = (i * 37) % POLICIES;
        change(j, i);
        generation[j]++;
        const t = performance.now();
        const dirty = calc.applyEvents([cnp(j)]);
        if (i < WARMUP) continue;
        times.push(ms(t));
        last = describeDirty(dirty);
      }
      console.log(`    one policy's ${kind}: p50 ${fmt(percentile(times, 50))}, p99 ${fmt(percentile(times, 99))}  (sets/members/chains dirtied, last: ${last})`);
    }
  }
  namespaceLabelBench(POLICIES);
}

/**
 * A namespace's label change under ClusterNetworkPolicies: 1,100 pods in one namespace, 110 of
 * them local, and policies that select every pod, but one that selects the namespaces labelled
 * flip=yes. Times a label no subject reads, the flip label that moves that one policy, and a
 * change of a NetworkPolicy of that namespace that selects every pod.
 */
function namespaceLabelBench(policies: number): void {
  const cluster: SyntheticSize = { pods: 1100, namespaces: 1, policies: 0, localPods: 110 };
  const ns = (i: number, flip: boolean) => makeNamespace(0, { note: `n${i}`, flip: flip ? 'yes' : 'no' });
  const calc = new Calculator({ nodeName: NODE, names, families: [4, 6], marks });
  const events: ModelEvent[] = [{ kind: 'Namespace', op: 'upsert', object: ns(0, false) }];
  for (let i = 0; i < cluster.pods; i++) events.push({ kind: 'Pod', op: 'upsert', object: makePod(i, cluster) });
  for (let j = 0; j < policies; j++) {
    const p = benchClusterPolicy(j, true, j, 8000 + (j % 50), 1);
    const spec = p.spec as Record<string, unknown>;
    events.push({ kind: 'ClusterNetworkPolicy', op: 'upsert', object: j === 0 ? { ...p, spec: { ...spec, subject: { namespaces: { matchLabels: { flip: 'yes' } } } } } : p });
  }
  calc.applyEvents(events);
  console.log(`  one namespace holding ${calc.localPodCount} local pods, ${policies} policies (all but one select every pod)`);
  let flip = false;
  const relabel = (i: number): ModelEvent => ({ kind: 'Namespace', op: 'upsert', object: ns(i + 1, flip) });
  // A NetworkPolicy of that namespace selecting every pod, its port changed each time.
  const networkPolicy = (i: number): ModelEvent => ({
    kind: 'NetworkPolicy',
    op: 'upsert',
    object: { namespace: 'ns-0', name: 'bench-np', uid: 'bench-np-uid', generation: i + 1, spec: { podSelector: {}, ingress: [{ ports: [{ port: 9000 + i }] }] } },
  });
  const kinds: [string, (i: number) => ModelEvent][] = [
    ["the namespace's label change that moves no policy", relabel],
    [
      "the namespace's label change that moves one policy",
      (i) => {
        flip = !flip;
        return relabel(i);
      },
    ],
    ['a change of a NetworkPolicy of the namespace (a port)', networkPolicy],
  ];
  for (const [kind, change] of kinds) {
    const times: number[] = [];
    let last = '';
    for (let i = 0; i < WARMUP + CNP_CHANGES; i++) {
      const event = change(i);
      const t = performance.now();
      const dirty = calc.applyEvents([event]);
      if (i < WARMUP) continue;
      times.push(ms(t));
      last = describeDirty(dirty);
    }
    console.log(`    ${kind}: p50 ${fmt(percentile(times, 50))}, p99 ${fmt(percentile(times, 99))}  (sets/members/chains dirtied, last: ${last})`);
  }
}

/** Admin policy j: Accept from one team's namespaces on one port, Deny to one /16, subject
 *  every pod or no pod (a label no pod has). */
function benchClusterPolicy(j: number, everyPod: boolean, priority: number, port: number, generation: number): RawClusterNetworkPolicy {
  const subject = everyPod ? { namespaces: {} } : { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'no-such-app' } } } };
  return {
    name: `cnp-${j}`,
    uid: `cnp-uid-${j}`,
    generation,
    spec: {
      tier: 'Admin',
      priority,
      subject,
      ingress: [{ name: 'team', action: 'Accept', from: [{ namespaces: { matchLabels: { team: `t${j % 20}` } } }], protocols: [{ tcp: { destinationPort: { number: port } } }] }],
      egress: [{ name: 'net', action: 'Deny', to: [{ networks: [`10.${100 + (j % 100)}.0.0/16`] }] }],
    },
  };
}

/** Everything calc holds, marked dirty: the cold apply writes it all. */
function cloneDirtyAll(calc: Calculator): Dirty {
  const d: Dirty = { sets: new Map(), chains: { 4: new Set(), 6: new Set() } };
  for (const name of calc.desired.sets.keys()) d.sets.set(name, 'all');
  for (const f of [4, 6] as const) for (const c of calc.desired.chains[f].keys()) d.chains[f].add(c);
  return d;
}

function describeDirty(d: Dirty): string {
  let members = 0;
  for (const m of d.sets.values()) members += m === 'all' ? 0 : m.size;
  return `${d.sets.size}/${members}/${d.chains[4].size + d.chains[6].size}`;
}

/** Each kind of change as a generator of event batches; i makes every iteration distinct. */
function changeKinds(): [string, (i: number) => ModelEvent[]][] {
  const nodes = Math.max(1, Math.round(size.pods / size.localPods));
  const fresh = size.pods + 1000;
  const localIndex = (i: number) => fresh + i * nodes - ((fresh + i * nodes) % nodes); // lands on node-0
  const remoteIndex = (i: number) => localIndex(i) + 1;
  const peerPod = (i: number) => makePod(i * nodes + 7, size); // a remote pod in some namespace
  const localNsPolicy = (i: number) => {
    const pod = makePod((i % size.localPods) * nodes, size); // a pod on node-0
    return Number(pod.namespace.slice(3));
  };
  return [
    ['pod add (local)', (i) => [{ kind: 'Pod', op: 'upsert', object: makePod(localIndex(i), size) }]],
    ['pod delete (local)', (i) => [{ kind: 'Pod', op: 'delete', uid: `uid-${localIndex(i)}` }]],
    ['pod add (remote)', (i) => [{ kind: 'Pod', op: 'upsert', object: makePod(remoteIndex(i), size) }]],
    ['pod delete (remote)', (i) => [{ kind: 'Pod', op: 'delete', uid: `uid-${remoteIndex(i)}` }]],
    [
      'pod label change (remote)',
      (i) => {
        const p = peerPod(i);
        return [{ kind: 'Pod', op: 'upsert', object: { ...p, labels: { ...p.labels, tier: i % 2 ? 'api' : 'web' } } }];
      },
    ],
    [
      'pod label change (local)',
      (i) => {
        const p = makePod((i % size.localPods) * nodes, size);
        return [{ kind: 'Pod', op: 'upsert', object: { ...p, labels: { ...p.labels, tier: i % 2 ? 'db' : 'api' } } }];
      },
    ],
    ['namespace label change', (i) => [{ kind: 'Namespace', op: 'upsert', object: makeNamespace((i * 37) % size.namespaces, { env: i % 2 ? 'prod' : 'dev', bench: String(i) }) }]],
    ['policy add', (i) => [{ kind: 'NetworkPolicy', op: 'upsert', object: { ...makePolicy(size.policies + i, size), namespace: `ns-${localNsPolicy(i)}`, name: `bench-${i}` } }]],
    [
      'policy update',
      (i) => {
        const p = makePolicy(size.policies + i, size);
        const spec = { podSelector: {}, ingress: [{ from: [{ podSelector: { matchLabels: { tier: i % 2 ? 'web' : 'db' } } }], ports: [{ port: 80 + (i % 3) }] }] };
        return [{ kind: 'NetworkPolicy', op: 'upsert', object: { ...p, namespace: `ns-${localNsPolicy(i)}`, name: `bench-${i}`, generation: 2, spec } }];
      },
    ],
    ['policy delete', (i) => [{ kind: 'NetworkPolicy', op: 'delete', namespace: `ns-${localNsPolicy(i)}`, name: `bench-${i}` }]],
  ];
}

/** Re-runs this script inside a fresh network namespace, and always deletes the namespace. */
async function inOwnNamespace(): Promise<void> {
  const ns = `${uniquePrefix('wbench')}node`;
  await createNs(ns);
  try {
    const child = spawn(
      'ip',
      ['netns', 'exec', ns, process.execPath, ...NODE_FLAGS, ...(process.env.WEIR_BENCH_NODE_FLAGS ?? '').split(' ').filter(Boolean), '--expose-gc', fileURLToPath(import.meta.url)],
      {
        stdio: 'inherit',
        env: { ...process.env, WEIR_BENCH_NETNS: ns },
      },
    );
    const code = await new Promise<number>((resolve) => child.on('exit', (c) => resolve(c ?? 1)));
    process.exitCode = code;
  } finally {
    await deleteNs(ns);
  }
}

(process.env.WEIR_BENCH_ONLY === 'cnp' ? Promise.resolve().then(clusterPolicyBench) : process.env.WEIR_BENCH_NETNS ? main() : inOwnNamespace()).catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
