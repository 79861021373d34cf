// Section 1: the cost of a new connection through a policed pod. The server pod on node-a is
// selected by K policies (K = 1, 100, 1000): K-1 of them allow TCP 8080 from peers the client
// does not match (podSelector peer=pN, 50 phantom pods), one, named to sort last, allows the
// client. Clients on node-a (same node: one bridge hop, node-a's FORWARD) and node-b (cross
// node: node-b's FORWARD out, node-a's FORWARD in) connect in a bounded sequential loop
// (latency), then with several connects always in flight (new connections per second).
// Measurements start once the enforcers and the API server are idle (context.ts idle()): the
// work an enforcer does after its first sync is reported as a row of its own, not mixed into
// the per-packet figures.

import { inParallel } from './api.ts';
import { buildConnectLoop, connectLatency, connectRate } from './connect-loop.ts';
import { type Ctx, idle, kernelState, quiet } from './context.ts';
import type { EnforcerName, EnforcerSpec } from './enforcers.ts';
import { key, phantomPlace, policyObject, type PodDef, type Turn } from './env.ts';
import { type Capture, captureRules, medianRate, repliesFirst, replayRates } from './replay.ts';
import { percentile } from '../stats.ts';
import { dist, type Value } from './table.ts';

const NS = 'bench';
export const SERVER: PodDef = { namespace: NS, name: 'server', node: 'node-a', ips: ['10.244.1.10', 'fd00:10:244:1::10'], labels: { app: 'server' } };
export const CLIENT_A: PodDef = { namespace: NS, name: 'client-a', node: 'node-a', ips: ['10.244.1.11', 'fd00:10:244:1::11'], labels: { app: 'client' } };
export const CLIENT_B: PodDef = { namespace: NS, name: 'client-b', node: 'node-b', ips: ['10.244.2.11', 'fd00:10:244:2::11'], labels: { app: 'client' } };
export const OTHER_A: PodDef = { namespace: NS, name: 'other-a', node: 'node-a', ips: ['10.244.1.12', 'fd00:10:244:1::12'], labels: { app: 'other' } };
export const OTHER_B: PodDef = { namespace: NS, name: 'other-b', node: 'node-b', ips: ['10.244.2.12', 'fd00:10:244:2::12'], labels: { app: 'other' } };
/** How many distinct peer labels (peer=p0..p49) the phantom peers carry. */
export const PEER_LABELS = 50;
/** The port every policy of the scene allows, served by connect-loop's own server in the server pod. */
export const PORT = 8080;

/**
 * Starts connect-loop's server in the server pod and waits until each client pod's verdict on
 * it holds (`verdicts`: pod key -> allowed), i.e. the enforcer has caught up; resolves with
 * when that was first seen, after its first sync (Turn.until).
 */
export async function serveUntil(t: Turn, bin: string, verdicts: Readonly<Record<string, boolean>>, timeoutMs: number, what: string): Promise<number> {
  await t.spawnHelper(t.pod(key(SERVER)).netns, [bin, 'serve', String(PORT), key(SERVER)]);
  const ip = SERVER.ips[0];
  return t.until(
    Object.entries(verdicts).map(([from, allowed]) => ({ from, ip, port: PORT, allowed })),
    timeoutMs,
    what,
  );
}

/** The bench namespace, its five simulated pods and the 50 phantom peers; idempotent. */
let sceneReady = false;
export async function connectScene(ctx: Ctx): Promise<void> {
  if (sceneReady) return;
  await ctx.env.ensureNamespace(NS);
  for (const p of [SERVER, CLIENT_A, CLIENT_B, OTHER_A, OTHER_B]) await ctx.env.addSimPod(p);
  const first = ctx.env.reservePhantoms(PEER_LABELS);
  await ctx.env.addPhantomPods(first, first + PEER_LABELS, (i) => ({
    namespace: NS,
    name: `peer-${i - first}`,
    node: phantomPlace(i).node,
    ips: [phantomPlace(i).ip],
    labels: { peer: `p${i - first}` },
  }));
  sceneReady = true;
}

const SERVER_SELECTOR = { matchLabels: { app: 'server' } };
const clientPolicy = policyObject(NS, 'zz-allow-client', {
  podSelector: SERVER_SELECTOR,
  ingress: [{ from: [{ podSelector: { matchLabels: { app: 'client' } } }], ports: [{ protocol: 'TCP', port: PORT }] }],
});
const otherPolicy = (i: number) =>
  policyObject(NS, `p${String(i).padStart(4, '0')}`, {
    podSelector: SERVER_SELECTOR,
    ingress: [{ from: [{ podSelector: { matchLabels: { peer: `p${i % PEER_LABELS}` } } }], ports: [{ protocol: 'TCP', port: PORT }] }],
  });

/** Makes exactly K policies select the server: K-1 others and the client's. */
export async function setPolicyCount(ctx: Ctx, k: number): Promise<void> {
  const { api } = ctx.env;
  const have = new Set((await api.list('NetworkPolicy', NS)).map((p) => p.name));
  const want = new Set(['zz-allow-client', ...Array.from({ length: k - 1 }, (_, i) => otherPolicy(i).metadata.name)]);
  await inParallel(
    [...have].filter((n) => !want.has(n)),
    16,
    (n) => api.delete('NetworkPolicy', NS, n),
  );
  await api.apply(clientPolicy);
  await inParallel(
    Array.from({ length: k - 1 }, (_, i) => i).filter((i) => !have.has(otherPolicy(i).metadata.name)),
    16,
    (i) => api.apply(otherPolicy(i)),
  );
}

export async function benchConnect(ctx: Ctx): Promise<void> {
  const bin = buildConnectLoop();
  await connectScene(ctx);
  for (const k of ctx.flags.policies) {
    await setPolicyCount(ctx, k);
    await connectRows(ctx, bin, {
      section: `1 connect, ${k} polic${k === 1 ? 'y' : 'ies'}`,
      what: `${k} policies`,
      enforcers: ctx.enforcers(),
      replay: ctx.flags.replayRounds > 0 && ctx.flags.replayPolicies.includes(k),
    });
  }
}

export interface SceneRun {
  /** The rows' section. */
  readonly section: string;
  /** The scene in the log lines (and in a verdict that does not hold). */
  readonly what: string;
  /** Who takes turns. */
  readonly enforcers: readonly EnforcerSpec[];
  /** Replay the rules with no agent running (replay.ts), as rows of the section. */
  readonly replay: boolean;
}

/** Measures the scene the API holds now: each enforcer's turns, then the section's rows. */
export async function connectRows(ctx: Ctx, bin: string, scene: SceneRun): Promise<void> {
  const samples = new SceneSamples();
  // Rounds alternate the order of the enforcers, so that a slow drift of the machine's load
  // (others' tests) does not always fall on the same one; samples are pooled.
  for (let round = 0; round < ctx.flags.rounds; round++) {
    const order = round % 2 === 0 ? [...scene.enforcers] : [...scene.enforcers].reverse();
    for (const spec of order) await measureTurn(ctx, bin, spec, { round, what: scene.what, replay: scene.replay }, samples);
  }
  addSceneRows(ctx, scene.section, samples);
  if (scene.replay) await replayConnect(ctx, bin, scene.section, samples.captures);
}

type Acc = Partial<Record<EnforcerName, number[]>>;

/** What the turns of one scene measured, pooled over its rounds. */
export class SceneSamples {
  readonly lat: Record<'same' | 'cross', Acc> = { same: {}, cross: {} };
  readonly rate: Record<'same' | 'cross', Acc> = { same: {}, cross: {} };
  readonly rules: Partial<Record<EnforcerName, Value>> = {};
  readonly sets: Partial<Record<EnforcerName, Value>> = {};
  readonly settle: Partial<Record<EnforcerName, Value>> = {};
  readonly captures: Record<string, Capture> = {};
  failures = '';
}

/** One enforcer's turn on the scene the API holds now (its `round`-th); adds to `samples`. */
export async function measureTurn(ctx: Ctx, bin: string, spec: EnforcerSpec, turn: { round: number; what: string; replay: boolean }, samples: SceneSamples): Promise<void> {
  const { connects, rateMs, inflight } = ctx.flags;
  const { round, what, replay } = turn;
  const { lat, rate, captures } = samples;
  await ctx.env.turn(spec, async (t) => {
    const policed = spec.name !== 'none';
    const server = SERVER.ips[0];
    const ready = await serveUntil(t, bin, { [key(CLIENT_A)]: true, [key(CLIENT_B)]: true, [key(OTHER_A)]: !policed }, 120_000, what);
    await quiet(t);
    const settled = await idle(t);
    if (round === 0 && policed) samples.settle[spec.name] = { p50: settled.cpuS, text: `(idle ${(settled.ms / 1000).toFixed(0)} s after the first right verdicts)` };
    if (replay && policed && !captures[spec.name]) captures[spec.name] = captureRules(t);
    const ks = kernelState(t, 'node-a');
    samples.rules[spec.name] = { p50: ks.rules };
    samples.sets[spec.name] = { p50: ks.sets, text: `(${ks.members} members)` };
    const load = ctx.sampleLoad();
    const line: string[] = [];
    for (const [where, from] of [
      ['same', t.pod('bench/client-a').netns],
      ['cross', t.pod('bench/client-b').netns],
    ] as const) {
      // Warm-up: neighbour entries and the first-run costs of the path.
      await connectLatency(bin, from, server, PORT, 50);
      const run = await connectLatency(bin, from, server, PORT, connects);
      (lat[where][spec.name] ??= []).push(...run.samples);
      if (run.failures) samples.failures += ` ${spec.name} ${where}: ${run.failures} failed (${[...run.reasons].map(([r, n]) => `${r} ×${n}`).join(', ')});`;
      const r = await connectRate(bin, from, server, PORT, inflight, rateMs);
      (rate[where][spec.name] ??= []).push(r.perSecond);
      if (r.fail) samples.failures += ` ${spec.name} ${where} rate: ${r.fail} failed;`;
      line.push(`${where}-node p50 ${percentile(run.samples, 50).toFixed(1)} p99 ${percentile(run.samples, 99).toFixed(1)} µs, ${r.perSecond.toFixed(0)} conn/s`);
    }
    ctx.log(
      `  round ${round + 1}, ${spec.name}, ${what} (enforced ${ready.toFixed(0)} ms after its first sync; node-a: ${ks.rules} iptables rules, ${ks.sets} ipsets; load ${load.toFixed(2)}): ${line.join('; ')}`,
    );
  });
}

/** The section's rows from a scene's pooled samples; `absent`: the cells of enforcers that took
 *  no turn (saying why), in every row. */
export function addSceneRows(ctx: Ctx, section: string, samples: SceneSamples, absent: Partial<Record<EnforcerName, Value>> = {}): void {
  const { inflight, rounds } = ctx.flags;
  const { lat, rate } = samples;
  const note = samples.failures ? `failed connects:${samples.failures}` : undefined;
  const dists = (acc: Acc) => ({ ...absent, ...Object.fromEntries(Object.entries(acc).map(([e, xs]) => [e, dist(xs)])) });
  // A rate per round: their mean.
  const means = (acc: Acc) => ({ ...absent, ...Object.fromEntries(Object.entries(acc).map(([e, xs]) => [e, { p50: xs.reduce((a, b) => a + b, 0) / xs.length }])) });
  ctx.add(
    { section, figure: 'connect latency, same node', unit: 'µs', better: 'lower', values: dists(lat.same), note },
    { section, figure: 'connect latency, cross node', unit: 'µs', better: 'lower', values: dists(lat.cross) },
    { section, figure: `new connections/s, same node (${inflight} in flight, mean of ${rounds} rounds)`, unit: 'conn/s', better: 'higher', values: means(rate.same) },
    { section, figure: `new connections/s, cross node (${inflight} in flight, mean of ${rounds} rounds)`, unit: 'conn/s', better: 'higher', values: means(rate.cross) },
    { section, figure: 'iptables rules on node-a (IPv4, all tables)', unit: 'rules', better: 'lower', values: { ...absent, ...samples.rules } },
    { section, figure: 'ipsets on node-a', unit: 'sets', better: 'lower', values: { ...absent, ...samples.sets } },
    {
      section,
      figure: 'work after the first right verdicts until idle: CPU of both enforcers and the API server',
      unit: 'CPU s',
      better: 'lower',
      values: { ...absent, ...samples.settle },
    },
  );
  if (note) ctx.log(`  ${note}`);
}

const REPLIES_FIRST = 'weir, replies first';

/** The same rate runs with each enforcer's rules alone (replay.ts), as rows of the section. */
async function replayConnect(ctx: Ctx, bin: string, section: string, captures: Record<string, Capture>): Promise<void> {
  const { replayRounds: rounds, inflight, rateMs } = ctx.flags;
  ctx.log(`  replaying the rules of ${Object.keys(captures).join(' and ')} with no agent running, ${rounds} rounds (load ${ctx.sampleLoad().toFixed(2)})`);
  const weir = captures.weir;
  const { rates } = await replayRates(
    ctx.env,
    bin,
    weir ? { ...captures, [REPLIES_FIRST]: repliesFirst(weir) } : captures,
    { server: { key: key(SERVER), ip: SERVER.ips[0] }, clients: { same: key(CLIENT_A), cross: key(CLIENT_B) }, denied: key(OTHER_A), port: PORT },
    { rounds, inflight, rateMs },
  );
  for (const [name, r] of Object.entries(rates)) ctx.log(`    ${name}: same node ${r.same.map((x) => x.toFixed(0)).join(' ')}; cross node ${r.cross.map((x) => x.toFixed(0)).join(' ')} conn/s`);
  const conntrack = rates['conntrack only'];
  const row = (path: 'same' | 'cross') => ({
    section,
    figure: `new connections/s, ${path === 'same' ? 'same' : 'cross'} node, the rules replayed with no agent running (${inflight} in flight, median of ${rounds} interleaved rounds)`,
    unit: 'conn/s',
    better: 'higher' as const,
    values: {
      none: { ...medianRate(rates['no rules'][path]), text: `(conntrack on, no verdict: ${medianRate(conntrack[path]).p50.toFixed(0)})` },
      ...Object.fromEntries(Object.keys(captures).map((e) => [e, medianRate(rates[e][path])])),
    },
  });
  ctx.add(row('same'), row('cross'));
  if (weir) {
    const gain = (path: 'same' | 'cross') => (medianRate(rates[REPLIES_FIRST][path]).p50 / medianRate(rates.weir[path]).p50).toFixed(3);
    const note = `${section}: Weir's replayed rules with replies accepted first in its top chain (before its per-packet source and destination checks): ${gain('same')}× Weir's rate on the same node, ${gain('cross')}× across nodes`;
    ctx.notes.push(note);
    ctx.log(`  ${note}`);
  }
}
