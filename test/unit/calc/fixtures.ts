// States of a small cluster for calc tests: a "world" is the full set of objects; the tests
// turn the difference between two worlds into events, the way a source would.

import assert from 'node:assert/strict';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import type { DesiredDataplane, Dirty, Rule } from '../../../src/calc/index.ts';
import type { CalcEvent, Namespace, Node, Pod, RawClusterNetworkPolicy, RawNetworkPolicy } from '../../../src/model/types.ts';

export interface World {
  readonly pods: ReadonlyMap<string, Pod>;
  readonly namespaces: ReadonlyMap<string, Namespace>;
  readonly policies: ReadonlyMap<string, RawNetworkPolicy>;
  /** Nodes (this node's pod CIDRs close its unknown addresses). */
  readonly nodes?: ReadonlyMap<string, Node>;
  /** Local pod address -> bridge port, as the node's kernel reports them. */
  readonly ports?: ReadonlyMap<string, string>;
  /** ClusterNetworkPolicies by name. */
  readonly clusterPolicies?: ReadonlyMap<string, RawClusterNetworkPolicy>;
}

export const NODE = 'node-a';
export const MARKS = { accept: 0x10000, pass: 0x20000 };
/** Audit rules are written only where an annotation asks for them (the default is off). */
export const AUDIT = { group: 77, defaultLevel: 'off', perSecond: 100, burst: 200 } as const;

/** The agent's own shape: the pod bridge fails closed and addresses are bound to ports. */
export function newCalc(): Calculator {
  return new Calculator({ nodeName: NODE, names: makeNames('cali'), families: [4, 6], marks: MARKS, podBridge: 'cni0', sourceBinding: true, audit: AUDIT });
}

export function pod(ns: string, name: string, o: Partial<Pod> & { ip4?: number; ip6?: boolean } = {}): Pod {
  const n = o.ip4 ?? 1;
  const ips = o.ips ?? [`10.244.${o.nodeName === 'node-b' ? 2 : 1}.${n}`, ...(o.ip6 === false ? [] : [`fd00::${n.toString(16)}`])];
  return {
    uid: `${ns}/${name}`,
    namespace: ns,
    name,
    labels: {},
    nodeName: NODE,
    hostNetwork: false,
    phase: 'Running',
    terminating: false,
    ports: [],
    ...o,
    ips,
  };
}

export function policy(ns: string, name: string, spec: unknown, generation = 1): RawNetworkPolicy {
  return { namespace: ns, name, uid: `${ns}/${name}`, generation, spec };
}

export function world(pods: Pod[], namespaces: Namespace[], policies: RawNetworkPolicy[]): World {
  return {
    pods: new Map(pods.map((p) => [p.uid, p])),
    namespaces: new Map(namespaces.map((n) => [n.name, n])),
    policies: new Map(policies.map((p) => [`${p.namespace}/${p.name}`, p])),
  };
}

export const EMPTY: World = world([], [], []);

export function clusterPolicy(name: string, spec: unknown, generation = 1): RawClusterNetworkPolicy {
  return { name, uid: `cnp/${name}`, generation, spec };
}

/** The events that take a source from `a` to `b`. */
export function diff(a: World, b: World): CalcEvent[] {
  const out: CalcEvent[] = [];
  const none = new Map();
  for (const [k, n] of b.nodes ?? none) if (a.nodes?.get(k) !== n) out.push({ kind: 'Node', op: 'upsert', object: n });
  for (const [k] of a.nodes ?? none) if (!b.nodes?.has(k)) out.push({ kind: 'Node', op: 'delete', name: k });
  for (const [ip, port] of b.ports ?? none) if (a.ports?.get(ip) !== port) out.push({ kind: 'PodInterface', op: 'upsert', object: { ip, port } });
  for (const [ip] of a.ports ?? none) if (!b.ports?.has(ip)) out.push({ kind: 'PodInterface', op: 'delete', ip });
  for (const [k, n] of b.namespaces) if (a.namespaces.get(k) !== n) out.push({ kind: 'Namespace', op: 'upsert', object: n });
  for (const [k, p] of b.policies) if (a.policies.get(k) !== p) out.push({ kind: 'NetworkPolicy', op: 'upsert', object: p });
  for (const [k, p] of b.clusterPolicies ?? none) if (a.clusterPolicies?.get(k) !== p) out.push({ kind: 'ClusterNetworkPolicy', op: 'upsert', object: p });
  for (const [k, p] of b.pods) if (a.pods.get(k) !== p) out.push({ kind: 'Pod', op: 'upsert', object: p });
  for (const [k] of a.pods) if (!b.pods.has(k)) out.push({ kind: 'Pod', op: 'delete', uid: k });
  for (const [k, p] of a.policies) if (!b.policies.has(k)) out.push({ kind: 'NetworkPolicy', op: 'delete', namespace: p.namespace, name: p.name });
  for (const [k] of a.clusterPolicies ?? none) if (!b.clusterPolicies?.has(k)) out.push({ kind: 'ClusterNetworkPolicy', op: 'delete', name: k });
  for (const [k] of a.namespaces) if (!b.namespaces.has(k)) out.push({ kind: 'Namespace', op: 'delete', name: k });
  return out;
}

/** A canonical, order-free text of a desired dataplane, for equality checks. */
export function snapshot(d: DesiredDataplane): string {
  const sets = [...d.sets.values()].map((s) => `${s.name} ${s.type} v${s.family}: ${[...s.members].sort().join(' ')}`).sort();
  const chains = ([4, 6] as const).flatMap((f) => [...d.chains[f].entries()].map(([n, rules]) => `v${f} ${n}:\n${rules.map((r) => '  ' + JSON.stringify(r)).join('\n')}`).sort());
  return [...sets, ...chains].join('\n');
}

/** A calc that got the whole state in one batch, as an agent's first compute. */
export function coldCalc(w: World): Calculator {
  const c = newCalc();
  c.applyEvents(diff(EMPTY, w));
  return c;
}

/** The snapshot of a cold compile, what each incremental step is held equal to. */
export function cold(w: World): string {
  return snapshot(coldCalc(w).desired);
}

/** Every NFLOG prefix the desired chains hold, with the tag the catalog reads it back as. */
export function auditTags(c: Calculator): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const f of [4, 6] as const) {
    for (const rules of c.desired.chains[f].values()) {
      for (const r of rules) if (r.action.kind === 'nflog') out[r.action.prefix] = c.auditCatalog.lookup(r.action.prefix) ?? 'missing';
    }
  }
  return out;
}

/** Names of the sets some rule of the desired chains matches on, sorted: the only sets the
 *  kernel should hold. */
export function referencedSets(d: DesiredDataplane): string[] {
  const out = new Set<string>();
  for (const f of [4, 6] as const) for (const rules of d.chains[f].values()) for (const r of rules) for (const m of r.matches) if (m.kind === 'set') out.add(m.set);
  return [...out].sort();
}

/** A copy of the desired dataplane kept up to date only through Dirty reports: if calc
 *  ever forgets to report a change, the mirror drifts from the real desired state. */
export class Mirror {
  readonly sets = new Map<string, { name: string; family: 4 | 6; type: 'hash:net' | 'hash:ip,port'; members: Set<string> }>();
  readonly chains = { 4: new Map<string, readonly Rule[]>(), 6: new Map<string, readonly Rule[]>() };

  update(d: DesiredDataplane, dirty: Dirty): void {
    for (const [name, members] of dirty.sets) {
      const want = d.sets.get(name);
      if (members === 'all') {
        if (want) this.sets.set(name, { ...want, members: new Set(want.members) });
        else this.sets.delete(name);
        continue;
      }
      // Member dirt is only useful for a set the kernel holds (and already got whole).
      assert.ok(want, `member dirt for ${name}, which desired does not hold`);
      const have = this.sets.get(name);
      assert.ok(have, `member dirt for ${name}, which was never reported whole`);
      for (const m of members) {
        if (want.members.has(m)) have.members.add(m);
        else have.members.delete(m);
      }
    }
    for (const f of [4, 6] as const) {
      for (const name of dirty.chains[f]) {
        const rules = d.chains[f].get(name);
        if (rules) this.chains[f].set(name, rules);
        else this.chains[f].delete(name);
      }
    }
  }

  view(topChain: string): DesiredDataplane {
    return { sets: this.sets, chains: this.chains, topChain };
  }
}

/** n distinct host prefixes spread over the whole IPv6 space (no two share a /32). */
export function scatteredV6(n: number): string[] {
  const out: string[] = [];
  for (let i = 1; i <= n; i++) {
    const h = Math.imul(i, 2654435761) >>> 0;
    out.push(`${(h >>> 16).toString(16)}:${(h & 0xffff).toString(16)}:${i.toString(16)}::${(i & 0xfff).toString(16)}/128`);
  }
  return out;
}

export { rng } from '../../support/rng.ts';
