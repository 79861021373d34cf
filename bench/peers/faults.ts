// Section 4: faults, one row each.
//   agent SIGKILLed     node-a's enforcer is killed; for 10 s new connections are probed every
//                       100 ms, one that policy allows and one it denies: how many got the
//                       verdict policy gives
//   new pod, agent down while node-a's enforcer is still dead, a pod appears on node-a (API and
//                       namespace), selected by the server's policy (only app=client may reach
//                       it): is it policed? then the enforcer is restarted: how long until it is
//   API server down     kube-apiserver is SIGKILLed for 10 s (etcd keeps running): verdicts
//                       during the outage, whether the enforcers survive, and, once it is back,
//                       how long a change takes from its write to enforcement

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildConnectLoop } from './connect-loop.ts';
import { CLIENT_A, OTHER_A, PORT, SERVER, serveUntil, setPolicyCount } from './connect.ts';
import { type Ctx, quiet } from './context.ts';
import type { EnforcerName } from './enforcers.ts';
import { key, type PodDef, type Turn } from './env.ts';
import { firstAllowed } from './latency.ts';
import { scaleTo } from './scale.ts';
import type { Value } from './table.ts';

const OUTAGE_MS = 10_000;
const LATE: PodDef = { namespace: 'bench', name: 'late-a', node: 'node-a', ips: ['10.244.1.60'], labels: { app: 'server' } };

type Col = Partial<Record<EnforcerName, Value>>;

/** Probes an allowed and a denied connection every 100 ms for `ms`; counts right verdicts. */
async function verdicts(t: Turn, ms: number): Promise<{ allowedOk: number; deniedOk: number; n: number }> {
  const server = SERVER.ips[0];
  let allowedOk = 0;
  let deniedOk = 0;
  let n = 0;
  const end = performance.now() + ms;
  while (performance.now() < end) {
    const [a, d] = await Promise.all([t.connects(key(CLIENT_A), server, PORT, 200), t.connects(key(OTHER_A), server, PORT, 200)]);
    n++;
    if (a) allowedOk++;
    if (!d) deniedOk++;
    await sleep(100);
  }
  return { allowedOk, deniedOk, n };
}

const pct = (k: number, n: number) => (n === 0 ? Number.NaN : (100 * k) / n);

/** SIGKILLs the control plane's kube-apiserver, by the PID its script recorded, only while
 *  that PID's start time is the recorded one. */
function killApiServer(ctx: Ctx): void {
  const line = readFileSync(join(ctx.env.cp.dir, 'pids'), 'utf8')
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .find(([name]) => name === 'kube-apiserver');
  if (!line) throw new Error('no kube-apiserver in the control plane pids file');
  const [, pid, start] = line;
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  if (stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] !== start) throw new Error(`pid ${pid} is no longer the bench's kube-apiserver`);
  process.kill(Number(pid), 'SIGKILL');
}

export async function benchFaults(ctx: Ctx): Promise<void> {
  const bin = buildConnectLoop();
  await scaleTo(ctx, Math.max(...ctx.flags.pods));
  await setPolicyCount(ctx, 1);
  const section = '4 faults';
  const rows = { killed: {} as Col, late: {} as Col, lateRecover: {} as Col, apiDuring: {} as Col, apiAfter: {} as Col };
  const server = SERVER.ips[0];
  const late = LATE.ips[0];
  for (const spec of ctx.enforcers(false)) {
    await ctx.env.turn(spec, async (t) => {
      await serveUntil(t, bin, { [key(CLIENT_A)]: true, [key(OTHER_A)]: false }, 300_000, 'enforced');
      const steady = [
        { from: key(CLIENT_A), ip: server, port: PORT, allowed: true },
        { from: key(OTHER_A), ip: server, port: PORT, allowed: false },
      ];
      await quiet(t);
      ctx.sampleLoad();

      // The agent killed.
      await t.procs.get('node-a')!.kill();
      const k = await verdicts(t, OUTAGE_MS);
      rows.killed[spec.name] = {
        p50: pct(k.allowedOk + k.deniedOk, 2 * k.n),
        text: `% right (allowed ${k.allowedOk}/${k.n} passed, denied ${k.deniedOk}/${k.n} blocked)`,
      };

      // A new pod while it is down.
      await t.addSimPod(LATE);
      await t.spawnHelper(t.pod(key(LATE)).netns, [bin, 'serve', String(PORT), key(LATE)]);
      await ctx.env.putPod(LATE, ctx.env.hostIPOf('node-a'));
      await sleep(3000); // node-b's enforcer has had time to learn it
      const probe = async () => ({
        client: await t.connects(key(CLIENT_A), late, PORT, 300),
        other: await t.connects(key(OTHER_A), late, PORT, 300),
        // To a pod no policy selects (its pod server's port 80): egress alone decides.
        out: await t.connects(key(LATE), CLIENT_A.ips[0], 80, 300),
      });
      const down = await probe();
      const policed = down.client && !down.other ? 'policed' : !down.client && !down.other ? 'isolated (fail closed)' : !down.other ? 'partly' : 'NOT policed';
      rows.late[spec.name] = {
        p50: Number.NaN,
        text: `${policed}: allowed client ${down.client ? 'passes' : 'blocked'}, denied peer ${down.other ? 'PASSES' : 'blocked'}, its own egress ${down.out ? 'passes' : 'blocked'}`,
      };
      const restarted = performance.now();
      t.startEnforcer('node-a');
      await t.until([...steady, { from: key(CLIENT_A), ip: late, port: PORT, allowed: true }, { from: key(OTHER_A), ip: late, port: PORT, allowed: false }], 300_000, 'after restart');
      rows.lateRecover[spec.name] = { p50: t.heldSince - restarted };
      await ctx.env.api.delete('Pod', LATE.namespace, LATE.name);
      await t.cluster.removePod(key(LATE));
      await quiet(t);

      // The API server down.
      killApiServer(ctx);
      const a = await verdicts(t, OUTAGE_MS);
      await ctx.env.cp.restartApiServer();
      const alive = [...t.procs.values()].every((p) => !p.exited);
      rows.apiDuring[spec.name] = {
        p50: pct(a.allowedOk + a.deniedOk, 2 * a.n),
        text: `% right (allowed ${a.allowedOk}/${a.n}, denied ${a.deniedOk}/${a.n}); enforcers ${alive ? 'kept running' : 'EXITED'}`,
      };
      const t0 = performance.now();
      await ctx.env.api.patch('Pod', OTHER_A.namespace, OTHER_A.name, { metadata: { labels: { app: 'client' } } });
      rows.apiAfter[spec.name] = { p50: await firstAllowed(t, key(OTHER_A), server, t0, 300_000) };
      await ctx.env.api.patch('Pod', OTHER_A.namespace, OTHER_A.name, { metadata: { labels: { app: 'other' } } });
      ctx.log(
        `  ${spec.name}: killed ${rows.killed[spec.name]!.text}; new pod while down: ${rows.late[spec.name]!.text}; right ${rows.lateRecover[spec.name]!.p50.toFixed(0)} ms after restart; API down: ${rows.apiDuring[spec.name]!.text}; first change after: ${rows.apiAfter[spec.name]!.p50.toFixed(0)} ms`,
      );
    });
  }
  ctx.add(
    { section, figure: 'agent SIGKILLed: new connections for 10 s with the verdict policy gives', unit: '%', better: 'higher', values: rows.killed },
    { section, figure: 'a new pod while the agent is down', unit: '', values: rows.late },
    { section, figure: 'agent restarted: until that pod is policed', unit: 'ms', better: 'lower', values: rows.lateRecover },
    { section, figure: 'API server down 10 s: verdicts meanwhile', unit: '%', better: 'higher', values: rows.apiDuring },
    { section, figure: 'API server back: a change, write -> enforced', unit: 'ms', better: 'lower', values: rows.apiAfter },
  );
}
