// Section 2: from an API write to the change being enforced, seen with real packets, at each
// cluster size. Every change turns a connection from denied to allowed, so "enforced" is the
// send time of the first probe that gets through (probes leave every 5 ms, each waits 200 ms:
// less than a SYN's first retransmit, so a probe sent before enforcement never passes late).
// The clock starts when the bench sends the write (for a new pod: the status write that gives
// it its IP, as a kubelet's would). Each change is undone, and the undo awaited (denied again),
// before the next. Also measured: cold start, from the enforcer's process start to the whole
// state enforced (the first connection allowed and denied as it should be).
//   policy apply          a policy allowing other-a (node-a) to the server is created
//   label, same node      other-a (node-a) is relabelled app=client: a peer set gains it
//   label, other node     other-b (node-b) likewise
//   new pod, other node   a pod app=client appears on node-b (namespace, veth, then API)

import { setTimeout as sleep } from 'node:timers/promises';
import { buildConnectLoop } from './connect-loop.ts';
import { CLIENT_A, CLIENT_B, OTHER_A, OTHER_B, PORT, SERVER, serveUntil, setPolicyCount } from './connect.ts';
import { type Ctx, quiet } from './context.ts';
import type { EnforcerName } from './enforcers.ts';
import { key, type PodDef, podObject, policyObject, type Turn } from './env.ts';
import { podCount, scalePolicyCount, scaleTo } from './scale.ts';
import { dist, type Value } from './table.ts';

const PROBE_EVERY_MS = 5;
const PROBE_TIMEOUT_MS = 200;

/** Milliseconds from t0 to the send time of the first probe from `from` to ip:PORT that passed. */
export function firstAllowed(t: Turn, from: string, ip: string, t0: number, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    let best = Number.POSITIVE_INFINITY;
    let inflight = 0;
    let stopped = false;
    let failed: unknown;
    const settle = () => {
      if (!stopped || inflight > 0) return;
      if (Number.isFinite(best)) resolve(best - t0);
      else reject(failed ?? new Error(`${t.spec.name}: ${from} -> ${ip}:${PORT} not allowed within ${timeoutMs} ms`));
    };
    const fire = () => {
      if (stopped) return;
      const sent = performance.now();
      if (sent - t0 > timeoutMs) {
        stopped = true;
        settle();
        return;
      }
      inflight++;
      t.connects(from, ip, PORT, PROBE_TIMEOUT_MS).then(
        (ok) => {
          inflight--;
          if (ok) {
            best = Math.min(best, sent);
            stopped = true;
          }
          settle();
        },
        (e: unknown) => {
          inflight--;
          failed = e;
          stopped = true;
          settle();
        },
      );
      setTimeout(fire, PROBE_EVERY_MS);
    };
    fire();
  });
}

interface Kind {
  readonly figure: string;
  /** Makes the change; resolves with t0 (when the write that enforces it was sent) and the probe's source. */
  readonly apply: (t: Turn, i: number) => Promise<{ t0: number; from: string }>;
  /** Undoes it and waits until denied again. */
  readonly undo: (t: Turn, i: number) => Promise<void>;
}

function kinds(ctx: Ctx): Kind[] {
  const { env } = ctx;
  const server = SERVER.ips[0];
  const denied = (t: Turn, from: string) => t.until([{ from, ip: server, port: PORT, allowed: false }], 60_000, `${from} denied again`).then(() => undefined);
  const relabel = (p: PodDef, app: string) => env.api.patch('Pod', p.namespace, p.name, { metadata: { labels: { app } } });
  const allowOther = policyObject('bench', 'lat-allow-other', {
    podSelector: { matchLabels: { app: 'server' } },
    ingress: [{ from: [{ podSelector: { matchLabels: { app: 'other' } } }], ports: [{ protocol: 'TCP', port: PORT }] }],
  });
  const newPod = (i: number): PodDef => ({ namespace: 'bench', name: `new-${i}`, node: 'node-b', ips: [`10.244.2.${100 + (i % 100)}`], labels: { app: 'client' } });
  return [
    {
      figure: 'policy apply',
      apply: async () => {
        const t0 = performance.now();
        await env.api.apply(allowOther);
        return { t0, from: key(OTHER_A) };
      },
      undo: async (t) => {
        await env.api.delete('NetworkPolicy', 'bench', 'lat-allow-other');
        await denied(t, key(OTHER_A));
      },
    },
    {
      figure: 'pod label change, peer on the same node',
      apply: async () => {
        const t0 = performance.now();
        await relabel(OTHER_A, 'client');
        return { t0, from: key(OTHER_A) };
      },
      undo: async (t) => {
        await relabel(OTHER_A, 'other');
        await denied(t, key(OTHER_A));
      },
    },
    {
      figure: 'pod label change, peer on the other node',
      apply: async () => {
        const t0 = performance.now();
        await relabel(OTHER_B, 'client');
        return { t0, from: key(OTHER_B) };
      },
      undo: async (t) => {
        await relabel(OTHER_B, 'other');
        await denied(t, key(OTHER_B));
      },
    },
    {
      figure: 'new pod (allowed peer) on the other node',
      apply: async (t, i) => {
        const p = newPod(i);
        await t.addSimPod(p);
        await env.api.apply(podObject(p));
        const t0 = performance.now();
        await env.setPodStatus(p, env.hostIPOf(p.node));
        return { t0, from: key(p) };
      },
      undo: async (t, i) => {
        const p = newPod(i);
        await env.api.delete('Pod', p.namespace, p.name);
        await t.cluster.removePod(key(p));
      },
    },
  ];
}

export async function benchLatency(ctx: Ctx): Promise<void> {
  const bin = buildConnectLoop();
  const sizes = [...ctx.flags.pods].sort((a, b) => a - b);
  for (const n of sizes) {
    await scaleTo(ctx, n);
    await setPolicyCount(ctx, 1);
    const size = podCount(ctx);
    const section = `2 API write -> enforced, ${size.toLocaleString('en-US')} pods`;
    const results = new Map<string, Partial<Record<EnforcerName, Value>>>();
    const cold: Partial<Record<EnforcerName, Value>> = {};
    const rss: Partial<Record<EnforcerName, Value>> = {};
    // kube-router's changes are slow at the large sizes (docs/performance.md): fewer of them keep the run short.
    const changes = n >= 5000 ? Math.max(5, Math.floor(ctx.flags.changes / 3)) : ctx.flags.changes;
    for (const spec of ctx.enforcers(false)) {
      await ctx.env.turn(spec, async (t) => {
        await serveUntil(t, bin, { [key(CLIENT_A)]: true, [key(CLIENT_B)]: true, [key(OTHER_A)]: false, [key(OTHER_B)]: false }, 300_000, 'cold start');
        const server = SERVER.ips[0];
        cold[spec.name] = { p50: t.heldSince - t.startedAt };
        await quiet(t);
        rss[spec.name] = { p50: t.procs.get('node-a')?.usage()?.rssMB ?? Number.NaN };
        ctx.sampleLoad();
        for (const kind of kinds(ctx)) {
          const xs: number[] = [];
          for (let i = 0; i < changes; i++) {
            const { t0, from } = await kind.apply(t, i);
            xs.push(await firstAllowed(t, from, server, t0, 60_000));
            await kind.undo(t, i);
            await sleep(100);
          }
          const v = dist(xs);
          const row = results.get(kind.figure) ?? {};
          row[spec.name] = v;
          results.set(kind.figure, row);
          ctx.log(`  ${spec.name}, ${size} pods, ${kind.figure}: p50 ${v.p50.toFixed(1)} ms, p99 ${v.p99!.toFixed(1)} ms (n=${xs.length})`);
        }
      });
    }
    ctx.add(
      {
        section,
        figure: `cold start: process start -> enforced (${scalePolicyCount() + 1} policies)`,
        unit: 'ms',
        better: 'lower',
        values: cold,
      },
      { section, figure: 'RSS after cold start (node-a)', unit: 'MB', better: 'lower', values: rss },
      ...[...results].map(([figure, values]) => ({ section, figure: `${figure} (n=${changes})`, unit: 'ms', better: 'lower' as const, values })),
    );
  }
}
