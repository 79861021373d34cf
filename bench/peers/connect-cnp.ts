// Section 1b: the cost of a new connection through a policed pod that Admin-tier
// ClusterNetworkPolicies select, beside the same scene with none (--cnps=0,1000). The scene is
// section 1's at one NetworkPolicy (the client's allow), plus N Admin policies selecting the
// server pod: N-1 Deny TCP 8080 from the phantom peers the client does not match (peer=pN),
// priorities 0..N-2, and, last in priority, one that Passes the client on TCP 8080.
//
// Pass rather than Accept: the client's new connection then walks the whole Admin chain (a miss
// on the Deny run, a hit on the Pass) and then the same NetworkPolicy path as the scene with
// none, which decides as it does there; an Accept would end the walk in the Admin tier and skip
// the NetworkPolicy path, so the difference between the rows would not be the tier's cost alone.
// Weir and no enforcer take turns; kube-router has no ClusterNetworkPolicy and takes none. Each
// round measures every scene, so the API's policies change between scenes (each turn starts its
// enforcer afresh anyway). Every ClusterNetworkPolicy the section made is deleted at its end.

import { inParallel, type KubeObject } from './api.ts';
import { buildConnectLoop } from './connect-loop.ts';
import { addSceneRows, connectScene, measureTurn, PEER_LABELS, PORT, SceneSamples, SERVER, setPolicyCount } from './connect.ts';
import type { Ctx } from './context.ts';
import type { EnforcerName } from './enforcers.ts';
import type { Value } from './table.ts';

const BENCH_LABEL = 'weir.dev/bench';
const BENCH_VALUE = 'connect-cnp';
const SUBJECT = { pods: { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': SERVER.namespace } }, podSelector: { matchLabels: SERVER.labels } } };
const PROTOCOLS = [{ tcp: { destinationPort: { number: PORT } } }];
/** The API's highest priority value: the Pass sorts after every Deny. */
const LAST = 1000;

function clusterPolicy(name: string, priority: number, action: 'Deny' | 'Pass', from: Record<string, string>): KubeObject {
  return {
    apiVersion: 'policy.networking.k8s.io/v1beta1',
    kind: 'ClusterNetworkPolicy',
    metadata: { name, labels: { [BENCH_LABEL]: BENCH_VALUE } },
    spec: {
      tier: 'Admin',
      priority,
      subject: SUBJECT,
      ingress: [{ action, from: [{ pods: { namespaceSelector: {}, podSelector: { matchLabels: from } } }], protocols: PROTOCOLS }],
    },
  };
}

const passClient = clusterPolicy('bench-zz-pass-client', LAST, 'Pass', { app: 'client' });
const denyPeer = (i: number) => clusterPolicy(`bench-deny-${String(i).padStart(4, '0')}`, Math.min(i, LAST - 1), 'Deny', { peer: `p${i % PEER_LABELS}` });

/** Makes exactly N of the section's Admin policies select the server: N-1 Deny and the Pass. */
export async function setClusterPolicyCount(ctx: Ctx, n: number): Promise<void> {
  const { api } = ctx.env;
  const have = new Set((await api.list('ClusterNetworkPolicy', undefined, `${BENCH_LABEL}=${BENCH_VALUE}`)).map((p) => p.name));
  const want = n === 0 ? [] : [passClient, ...Array.from({ length: n - 1 }, (_, i) => denyPeer(i))];
  const names = new Set(want.map((p) => p.metadata.name));
  await inParallel(
    [...have].filter((name) => !names.has(name)),
    16,
    (name) => api.delete('ClusterNetworkPolicy', undefined, name),
  );
  await inParallel(
    want.filter((p) => !have.has(p.metadata.name)),
    16,
    (p) => api.apply(p),
  );
}

export async function benchConnectCnp(ctx: Ctx): Promise<void> {
  if (!ctx.flags.enforcers.includes('weir')) {
    ctx.log('  skipped: Weir is not among --enforcers, and only Weir enforces ClusterNetworkPolicy here');
    return;
  }
  const bin = buildConnectLoop();
  await connectScene(ctx);
  await setPolicyCount(ctx, 1);
  const enforcers = ctx.enforcers().filter((s) => s.name !== 'kube-router');
  const scenes = ctx.flags.cnps.map((n) => {
    const label = `${n.toLocaleString('en-US')} Admin ClusterNetworkPolic${n === 1 ? 'y' : 'ies'}`;
    return { n, section: `1b connect, 1 policy, ${label}`, what: `1 policy and ${label}`, samples: new SceneSamples() };
  });
  try {
    // The scenes take turns within each round, in alternating order as the enforcers do, so that
    // a drift of the machine's load between scenes falls on both alike.
    for (let round = 0; round < ctx.flags.rounds; round++) {
      const even = round % 2 === 0;
      for (const scene of even ? scenes : [...scenes].reverse()) {
        const t0 = performance.now();
        await setClusterPolicyCount(ctx, scene.n);
        ctx.log(`  round ${round + 1}: ${scene.what} in the API (${((performance.now() - t0) / 1000).toFixed(1)} s of API writes)`);
        for (const spec of even ? enforcers : [...enforcers].reverse()) await measureTurn(ctx, bin, spec, { round, what: scene.what, replay: false }, scene.samples);
      }
    }
  } finally {
    // Later sections build their own scenes: none of them expects these policies.
    await setClusterPolicyCount(ctx, 0).catch((e: unknown) => ctx.log(`  could not delete the section's ClusterNetworkPolicies: ${String(e)}`));
  }
  const absent: Partial<Record<EnforcerName, Value>> = { 'kube-router': { p50: Number.NaN, text: 'not run: kube-router has no ClusterNetworkPolicy' } };
  for (const scene of scenes) addSceneRows(ctx, scene.section, scene.samples, absent);
}
