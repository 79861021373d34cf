// The cluster at a given size: the simulated pods of the connect scene (connect.ts) plus
// phantom pods (API objects only, on nodes no enforcer runs on) in namespaces of 20 pods, with
// one policy per 10 pods, so that policies, peer sets and their members all grow with it:
//   scale-J/pod-I   labels app=a(I%4), namespace labels team=t(J%10)
//   scale-J/web     selects app=a0, allows TCP 8080 from app=a1 of its namespace
//   scale-J/api     selects app=a2, allows TCP 8080 from app=a3 of namespaces with team=t(J%10)
// Sizes only grow within a run (objects are added, never removed).

import { connectScene } from './connect.ts';
import type { Ctx } from './context.ts';
import { phantomPlace, policyObject } from './env.ts';
import { inParallel } from './api.ts';

const PER_NAMESPACE = 20;
let phantoms = 0;
let namespaces = 0;

export const scaleNamespace = (j: number): string => `scale-${j}`;

/** The phantom pods made so far, in order: their numbers (for addresses) and names. */
export const scalePods: { i: number; namespace: string; name: string; app: string }[] = [];

/** Every pod in the API (simulated and phantom, the connect scene's peers included). */
export function podCount(ctx: Ctx): number {
  return ctx.env.simPods.size + 50 + phantoms;
}

/** Grows the cluster to `total` pods; logs how long the API writes took. */
export async function scaleTo(ctx: Ctx, total: number): Promise<void> {
  await connectScene(ctx);
  const want = total - ctx.env.simPods.size - 50;
  if (want <= phantoms) return;
  const t0 = performance.now();
  const add = want - phantoms;
  const first = ctx.env.reservePhantoms(add);
  const needNs = Math.ceil(want / PER_NAMESPACE);
  for (let j = namespaces; j < needNs; j++) await ctx.env.ensureNamespace(scaleNamespace(j), { team: `t${j % 10}` });
  await ctx.env.addPhantomPods(first, first + add, (i) => {
    const k = phantoms + (i - first);
    const j = Math.floor(k / PER_NAMESPACE);
    const p = { namespace: scaleNamespace(j), name: `pod-${k}`, node: phantomPlace(i).node, ips: [phantomPlace(i).ip], labels: { app: `a${k % 4}` } };
    scalePods[k] = { i, namespace: p.namespace, name: p.name, app: p.labels.app };
    return p;
  });
  await inParallel(
    Array.from({ length: needNs - namespaces }, (_, x) => namespaces + x),
    16,
    async (j) => {
      const ns = scaleNamespace(j);
      await ctx.env.api.apply(
        policyObject(ns, 'web', {
          podSelector: { matchLabels: { app: 'a0' } },
          ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a1' } } }], ports: [{ protocol: 'TCP', port: 8080 }] }],
        }),
      );
      await ctx.env.api.apply(
        policyObject(ns, 'api', {
          podSelector: { matchLabels: { app: 'a2' } },
          ingress: [
            {
              from: [{ namespaceSelector: { matchLabels: { team: `t${j % 10}` } }, podSelector: { matchLabels: { app: 'a3' } } }],
              ports: [{ protocol: 'TCP', port: 8080 }],
            },
          ],
        }),
      );
    },
  );
  phantoms = want;
  namespaces = needNs;
  ctx.log(`  cluster grown to ${podCount(ctx)} pods, ${namespaces * 2} scale policies, in ${((performance.now() - t0) / 1000).toFixed(1)} s of API writes`);
}

export function scalePolicyCount(): number {
  return namespaces * 2;
}
