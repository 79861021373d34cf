// Calculator.selection, which `weir explain` names policies by, against what each local pod's
// chains were built from: over random walks of cluster states, its enforced policies isolate
// the pod, its merged ones are exactly the peers of the merged rules, the policy chains the pod
// consults are those of its enforced (or audit-only) policies, and its tiers rebuild the pod's
// Admin and Baseline chains rule for rule. Explain and calc can then never disagree on which
// policies select a pod.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Calculator, Rule } from '../../../src/calc/index.ts';
import { makeNames } from '../../../src/calc/index.ts';
import { mergedRules } from '../../../src/calc/merge.ts';
import type { Direction, SetSpec } from '../../../src/calc/rules.ts';
import { allowAlternatives, setKey } from '../../../src/calc/rules.ts';
import type { Tier } from '../../../src/calc/tier-rules.ts';
import { tierChainRules, tierSteps } from '../../../src/calc/tier-rules.ts';
import type { Family, Labels, Namespace, Pod, RawClusterNetworkPolicy, RawNetworkPolicy } from '../../../src/model/types.ts';
import { isPoliced } from '../../../src/model/cluster.ts';
import { familyOf } from '../../../src/model/types.ts';
import type { World } from './fixtures.ts';
import { clusterPolicy, diff, EMPTY, MARKS, NODE, newCalc, pod, policy, rng } from './fixtures.ts';
import { baselineTeamA, DB_FROM_WEB } from './walk-policies.ts';

const names = makeNames('cali');

/** Enforced policies with mergeable and unmergeable rules (an ipBlock with an except), an
 *  audit-only one, one audited at level all (its own chain), one invalid. */
const POLICIES: RawNetworkPolicy[] = [
  policy('web', 'from-db', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ port: 80 }] }] }),
  policy('web', 'from-lb', { podSelector: {}, ingress: [{ from: [{ podSelector: { matchLabels: { role: 'lb' } } }], ports: [{ port: 80 }] }] }),
  policy('web', 'egress-mixed', {
    podSelector: { matchLabels: { app: 'web' } },
    egress: [
      { to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8'] } }], ports: [{ protocol: 'UDP', port: 53 }] },
      { to: [{ podSelector: {} }], ports: [{ port: 'http' }] },
    ],
  }),
  { ...policy('web', 'audit-only', { podSelector: {}, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'db' } } }] }], egress: [] }), annotations: { 'weir.dev/enforcement': 'audit' } },
  {
    ...policy('web', 'logged-all', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: {} }], ports: [{ port: 80 }] }] }),
    annotations: { 'weir.dev/audit': 'all' },
  },
  policy('db', 'deny-egress', { podSelector: {}, policyTypes: ['Egress'] }),
  DB_FROM_WEB,
  policy('db', 'broken', { podSelector: { matchLabels: { app: 'x' } }, ingress: [{ from: [{ ipBlock: { cidr: 'nonsense' } }] }] }),
];

const CLUSTER_POLICIES: RawClusterNetworkPolicy[] = [
  clusterPolicy('admin', {
    tier: 'Admin',
    priority: 5,
    subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'web' } } } },
    ingress: [
      { action: 'Pass', from: [{ namespaces: { matchLabels: { team: 'b' } } }] },
      { action: 'Deny', from: [{ networks: ['10.9.0.0/16'] }] },
    ],
    egress: [{ action: 'Accept', to: [{ pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } } }], protocols: [{ tcp: { destinationPort: { number: 5432 } } }] }],
  }),
  baselineTeamA('baseline'),
];

const NAMESPACES: Namespace[] = [
  { name: 'web', labels: { team: 'a' } },
  { name: 'db', labels: { team: 'b' } },
];

/** A random walk: pods relabelled, added and removed, policies and ClusterNetworkPolicies
 *  coming and going, namespaces relabelled and audited (level all takes a policy out of the
 *  merged rules). */
function walk(seed: number, steps: number): World[] {
  const r = rng(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
  const labels: Record<string, string>[] = [{ app: 'web' }, { app: 'db' }, { role: 'lb' }, { app: 'x' }, {}];
  let pods = new Map<string, Pod>();
  for (let i = 1; i <= 6; i++) {
    const p = pod(pick(['web', 'db']), `p${i}`, { ip4: i, ip6: i % 2 === 0, labels: pick(labels), nodeName: pick([NODE, NODE, 'node-b']), ports: [{ name: 'http', port: 8080, protocol: 'TCP' }] });
    pods.set(p.uid, p);
  }
  let nss = new Map(NAMESPACES.map((n) => [n.name, n]));
  let pols = new Map(POLICIES.map((p) => [`${p.namespace}/${p.name}`, p]));
  let cnps = new Map(CLUSTER_POLICIES.map((p) => [p.name, p]));
  const out: World[] = [{ pods, namespaces: nss, policies: pols, clusterPolicies: cnps }];
  let next = 10;
  for (let i = 0; i < steps; i++) {
    pods = new Map(pods);
    nss = new Map(nss);
    pols = new Map(pols);
    cnps = new Map(cnps);
    const choice = r();
    const some = pods.size > 0 ? pick([...pods.values()]) : undefined;
    if (choice < 0.3 && some) pods.set(some.uid, { ...some, labels: pick(labels) });
    else if (choice < 0.4) {
      const n = next++;
      const p = pod(pick(['web', 'db']), `p${n}`, { ip4: n, labels: pick(labels), nodeName: pick([NODE, 'node-b']) });
      pods.set(p.uid, p);
    } else if (choice < 0.5 && some) pods.delete(some.uid);
    else if (choice < 0.65) {
      const n = pick(NAMESPACES);
      const audit = pick([undefined, 'all', 'deny', 'off']);
      nss.set(n.name, { ...n, labels: pick<Labels>([{ team: 'a' }, { team: 'b' }, {}]), ...(audit ? { audit } : {}) });
    } else if (choice < 0.85) {
      const p = pick(POLICIES);
      const k = `${p.namespace}/${p.name}`;
      if (pols.has(k)) pols.delete(k);
      else pols.set(k, p);
    } else {
      const p = pick(CLUSTER_POLICIES);
      if (cnps.has(p.name)) cnps.delete(p.name);
      else cnps.set(p.name, p);
    }
    out.push({ pods, namespaces: nss, policies: pols, clusterPolicies: cnps });
  }
  return out;
}

/** Where the pod's chains and its selection differ, in words (none: they agree). */
function mismatches(calc: Calculator, p: Pod, f: Family, dir: Direction): string[] {
  const sel = calc.selection(p.uid);
  assert.ok(sel, `no selection for local pod ${p.uid}`);
  const { enforced, auditOnly, merged } = sel[dir];
  const chains = calc.desired.chains[f];
  const wl = dir === 'ingress' ? names.toWorkload(p.uid) : names.fromWorkload(p.uid);
  const rules = chains.get(wl);
  assert.ok(rules, `no ${wl} for ${p.uid}`);
  const out: string[] = [];
  const at = `${p.uid} IPv${f} ${dir}`;
  const useSet = (spec: SetSpec) => names.peerSet(f, setKey(spec));
  const json = (rs: readonly Rule[]) => rs.map((r) => JSON.stringify(r));

  // Isolated: the chain ends in the default drop.
  if ((rules.at(-1)?.action.kind === 'drop') !== enforced.length > 0) out.push(`${at}: ${enforced.length} enforced policies, yet the chain ends in ${rules.at(-1)?.action.kind}`);

  // The merged rules stand for the merged policies' alternatives, and for nothing else.
  const comment = `merged peers of ${dir} policies`;
  const allow = { kind: 'setMark', value: MARKS.accept, mask: MARKS.accept } as const;
  const want = mergedRules(
    merged.flatMap((q) => allowAlternatives(q, dir, f)),
    f,
    allow,
    comment,
    useSet,
  );
  const have = rules.filter((r) => r.comment === comment);
  if (JSON.stringify(json(have)) !== JSON.stringify(json(want))) out.push(`${at}: merged rules ${JSON.stringify(have)}, from its merged policies ${JSON.stringify(want)}`);

  // The policy chains it consults: its enforced policies' that exist; not isolated, its
  // audit-only policies' (audit is on).
  const chainOf = (key: string) => (dir === 'ingress' ? names.policyIngress(key) : names.policyEgress(key));
  const policyChains = new Set([...calc.cluster.policies.keys()].map(chainOf));
  const jumped = rules.flatMap((r) => (r.action.kind === 'jump' && policyChains.has(r.action.chain) ? [r.action.chain] : [])).sort();
  const expected = (enforced.length > 0 ? enforced.map((q) => chainOf(q.key)).filter((c) => chains.has(c)) : auditOnly.map((q) => chainOf(q.key))).sort();
  if (JSON.stringify(jumped) !== JSON.stringify(expected)) out.push(`${at}: consults ${jumped.join(',')}, its selection ${expected.join(',')}`);

  // Its tier chains, rebuilt from its tiers (the ClusterNetworkPolicies here are not audited).
  for (const tier of ['admin', 'baseline'] as const satisfies readonly Tier[]) {
    const consulted = tier === 'admin' || enforced.length === 0;
    const policies = consulted ? sel.tiers[tier] : [];
    const want = policies.length > 0 ? tierChainRules(tier, tierSteps(policies, dir, f), f, names.tierAccept, useSet) : [];
    const have = chains.get(names.tierChain(tier, dir, p.uid)) ?? [];
    if (JSON.stringify(json(have)) !== JSON.stringify(json(want))) out.push(`${at}: ${tier} chain differs from its tiers ${policies.map((q) => q.name).join(',')}`);
  }
  return out;
}

test("Calculator.selection names exactly the policies and tiers each local pod's chains were built from", () => {
  let checked = 0;
  let mergedSeen = 0;
  let ownChainSeen = 0;
  for (let seed = 1; seed <= 12; seed++) {
    const calc = newCalc();
    let prev = EMPTY;
    for (const [step, w] of walk(seed, 40).entries()) {
      calc.applyEvents(diff(prev, w));
      prev = w;
      const wrong: string[] = [];
      for (const p of calc.cluster.pods.values()) {
        const local = p.nodeName === NODE && isPoliced(p);
        if (!local) {
          assert.equal(calc.selection(p.uid), undefined, `${p.uid} is not this node's, yet has a selection`);
          continue;
        }
        for (const f of [4, 6] as const) {
          if (!p.ips.some((ip) => familyOf(ip) === f)) continue;
          for (const dir of ['ingress', 'egress'] as const) {
            wrong.push(...mismatches(calc, p, f, dir));
            const sel = calc.selection(p.uid)![dir];
            mergedSeen += sel.merged.length;
            ownChainSeen += sel.enforced.length - sel.merged.length;
            checked++;
          }
        }
      }
      assert.deepEqual(wrong, [], `seed ${seed} step ${step}`);
    }
  }
  assert.ok(checked > 500, `only ${checked} directions checked`);
  assert.ok(mergedSeen > 0 && ownChainSeen > 0, 'the walks must hold merged policies and policies with their own chain');
});
