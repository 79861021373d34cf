// Section 3: memory and CPU of each enforcer on each node (read from /proc for the process and
// every process it started: RSS, and CPU time, iptables-restore and ipset included; the row
// gives the larger node), at rest once every node and the API server are idle, and during
// churn: pod label changes through the API at a fixed rate (default 100/s for 60 s), each
// moving a phantom pod in or out of a policy's peer set. After the churn, one more change is
// timed from its write to its enforcement: the backlog an enforcer carries.

import { setTimeout as sleep } from 'node:timers/promises';
import { buildConnectLoop } from './connect-loop.ts';
import { CLIENT_A, OTHER_A, SERVER, serveUntil, setPolicyCount } from './connect.ts';
import { type Ctx, idle, quiet } from './context.ts';
import type { EnforcerName } from './enforcers.ts';
import { type Usage, usagesOf } from './usage.ts';
import { key, type Turn } from './env.ts';
import { firstAllowed } from './latency.ts';
import { podCount, scalePods, scaleTo } from './scale.ts';
import type { Value } from './table.ts';

const REST_S = 10;

type Col = Partial<Record<EnforcerName, Value>>;

/** The largest of the nodes' figures, with every node's in its text. */
function largest(byNode: ReadonlyMap<string, number>, unit: string): Value {
  const p50 = Math.max(...byNode.values());
  const digits = unit === '%' ? 1 : 0;
  return { p50, text: `(${[...byNode].map(([n, v]) => `${n} ${v.toFixed(digits)}${unit === '%' ? '%' : ` ${unit}`}`).join(', ')})` };
}

function usageOrThrow(t: Turn, node: string): Usage {
  const p = t.procs.get(node);
  const u = p?.usage();
  if (!u) throw new Error(`${t.spec.name} on ${node} is not running: ${p?.log.slice(-10).join('\n')}`);
  return u;
}

/** Label patches at `rate` per second for `seconds`; resolves with the rate achieved. */
async function churn(ctx: Ctx, rate: number, seconds: number, flips: Map<number, boolean>): Promise<{ sent: number; achieved: number; errors: number }> {
  const { api } = ctx.env;
  const t0 = performance.now();
  const end = t0 + seconds * 1000;
  let sent = 0;
  let inflight = 0;
  let errors = 0;
  let k = 0;
  const pending: Promise<unknown>[] = [];
  while (performance.now() < end) {
    const due = Math.floor(((performance.now() - t0) / 1000) * rate);
    while (sent < due && inflight < 64) {
      const pod = scalePods[k % scalePods.length];
      const base = Number(pod.app.slice(1));
      const flipped = !(flips.get(k % scalePods.length) ?? false);
      flips.set(k % scalePods.length, flipped);
      k++;
      sent++;
      inflight++;
      pending.push(
        api
          .patch('Pod', pod.namespace, pod.name, { metadata: { labels: { app: `a${flipped ? base ^ 1 : base}` } } })
          .catch(() => void errors++)
          .finally(() => void inflight--),
      );
    }
    await sleep(5);
  }
  await Promise.all(pending);
  return { sent, achieved: sent / ((performance.now() - t0) / 1000), errors };
}

export async function benchResources(ctx: Ctx): Promise<void> {
  const bin = buildConnectLoop();
  const size = Math.max(...ctx.flags.pods);
  await scaleTo(ctx, size);
  await setPolicyCount(ctx, 1);
  const { churnRate, churnSeconds } = ctx.flags;
  const section = `3 memory and CPU, ${podCount(ctx).toLocaleString('en-US')} pods`;
  const rows = { restRss: {} as Col, restCpu: {} as Col, churnRss: {} as Col, churnCpu: {} as Col, after: {} as Col, rate: {} as Col };
  const flips = new Map<number, boolean>();
  for (const spec of ctx.enforcers(false)) {
    await ctx.env.turn(spec, async (t) => {
      await serveUntil(t, bin, { [key(CLIENT_A)]: true, [key(OTHER_A)]: false }, 300_000, 'enforced');
      const server = SERVER.ips[0];
      await quiet(t, 3000);
      // Weir's agent writes its node's NodePolicyStatus after its first sync: at rest means after it
      // (the policies' own statuses are the cluster controller's, which this bench does not run).
      const settled = await idle(t);
      ctx.sampleLoad();
      // Every node: the nodes of one enforcer need not cost the same, and the row gives the
      // larger, the figure to provision for.
      const nodes = [...t.procs.keys()].sort();
      const r0 = new Map(nodes.map((n) => [n, usageOrThrow(t, n)]));
      await sleep(REST_S * 1000);
      const r1 = new Map(nodes.map((n) => [n, usageOrThrow(t, n)]));
      const restCpu = new Map(nodes.map((n) => [n, ((r1.get(n)!.cpuS - r0.get(n)!.cpuS) / REST_S) * 100]));
      rows.restRss[spec.name] = largest(new Map(nodes.map((n) => [n, r1.get(n)!.rssMB])), 'MB');
      rows.restCpu[spec.name] = largest(restCpu, '%');

      const peak = new Map(nodes.map((n) => [n, r1.get(n)!.rssMB]));
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const now = usagesOf(nodes.map((n) => t.procs.get(n)!.pid));
          for (const n of nodes) peak.set(n, Math.max(peak.get(n)!, now.get(t.procs.get(n)!.pid)?.rssMB ?? 0));
          await sleep(500);
        }
      })();
      const c0 = new Map(nodes.map((n) => [n, usageOrThrow(t, n)]));
      const tc = performance.now();
      const done = await churn(ctx, churnRate, churnSeconds, flips);
      const c1 = new Map(nodes.map((n) => [n, usageOrThrow(t, n)]));
      const wall = (performance.now() - tc) / 1000;
      sampling = false;
      await sampler;
      rows.churnRss[spec.name] = largest(peak, 'MB');
      rows.churnCpu[spec.name] = largest(new Map(nodes.map((n) => [n, ((c1.get(n)!.cpuS - c0.get(n)!.cpuS) / wall) * 100])), '%');
      rows.rate[spec.name] = { p50: done.achieved, text: done.errors ? `(${done.errors} writes failed)` : undefined };
      // The backlog: one more change, right after the churn's last write.
      const t0 = performance.now();
      await ctx.env.api.patch('Pod', OTHER_A.namespace, OTHER_A.name, { metadata: { labels: { app: 'client' } } });
      rows.after[spec.name] = { p50: await firstAllowed(t, key(OTHER_A), server, t0, 300_000) };
      await ctx.env.api.patch('Pod', OTHER_A.namespace, OTHER_A.name, { metadata: { labels: { app: 'other' } } });
      const each = (row: Col) => row[spec.name]?.text ?? '';
      ctx.log(
        `  ${spec.name}: idle ${(settled.ms / 1000).toFixed(0)} s after its first sync (${settled.cpuS.toFixed(1)} CPU s meanwhile, API server included); at rest ${each(rows.restRss)}, CPU ${each(rows.restCpu)}; churn ${done.achieved.toFixed(0)}/s for ${wall.toFixed(0)} s: peak ${each(rows.churnRss)}, CPU ${each(rows.churnCpu)}; next change enforced ${rows.after[spec.name]!.p50.toFixed(0)} ms after its write`,
      );
    });
  }
  ctx.add(
    { section, figure: 'RSS at rest (the larger node)', unit: 'MB', better: 'lower', values: rows.restRss },
    { section, figure: `CPU at rest (the busier node, over ${REST_S} s)`, unit: '% of a core', better: 'lower', values: rows.restCpu },
    { section, figure: `churn: pod label changes sent`, unit: 'changes/s', values: rows.rate },
    { section, figure: `RSS peak during churn (the larger node)`, unit: 'MB', better: 'lower', values: rows.churnRss },
    { section, figure: `CPU during churn (the busier node)`, unit: '% of a core', better: 'lower', values: rows.churnCpu },
    { section, figure: 'a change right after the churn: write -> enforced', unit: 'ms', better: 'lower', values: rows.after },
  );
}
