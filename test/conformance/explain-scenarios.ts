// Scenarios weir explain is checked over, cell by cell: those of cluster-network-policy.test.ts
// and isolation-peers.test.ts, as steps of state (policies, labels, phases, pods) with the
// truth tables those files state, written by hand from the APIs (never from Weir's code).
// explain.test.ts (here) compares explain with real probes; test/unit/explain/scenarios.test.ts
// compares it with these tables, without a cluster.

import type { Explanation, ExplainRequest } from '../../src/explain/explain.ts';
import { familyOf } from '../../src/model/types.ts';
import { EXTERNAL_HOST, underlayIp } from '../../src/sim/addressing.ts';
import { A1, A2, B1, B2, type Cell, cnp, EXTERNAL, G1, NODES, np, nsOf, type PodDef } from './harness.ts';
import { allow, always, from, fromAnyPod, fromNs, not, nothing, tcp, to, toNs } from './predicates.ts';

export type Verdict = (x: Cell) => boolean;

export interface Step {
  readonly what: string;
  /** Replaces every policy; absent: the previous step's stay. */
  readonly policies?: readonly unknown[];
  readonly podLabels?: Readonly<Record<string, Record<string, string>>>;
  readonly namespaceLabels?: Readonly<Record<string, Record<string, string>>>;
  readonly podPhases?: Readonly<Record<string, string>>;
  readonly addPods?: readonly PodDef[];
  readonly removePods?: readonly string[];
  /** Every pod and the external host to every pod. */
  readonly expect: Verdict;
  /** Every pod to the external host, when the scenario states it. */
  readonly toExternal?: Verdict;
}

export interface Scenario {
  readonly name: string;
  readonly steps: readonly Step[];
}

const WEB = { matchLabels: { app: 'web' } };
const DB = { matchLabels: { app: 'db' } };
const TEAM_A = { matchLabels: { team: 'a' } };
const TEAM_B = { matchLabels: { team: 'b' } };
const ALPHA = TEAM_A;
const BETA = TEAM_B;
const GAMMA = { matchExpressions: [{ key: 'kubernetes.io/metadata.name', operator: 'In', values: ['gamma'] }] };
const A3 = 'alpha/a3';

export const CLUSTER_NETWORK_POLICY_SCENARIOS: readonly Scenario[] = [
  {
    name: 'an Admin Deny holds over a NetworkPolicy that allows everything',
    steps: [
      {
        what: 'admin deny',
        policies: [
          np('alpha', 'allow-all', { podSelector: {}, ingress: [{}] }),
          cnp('deny-beta-to-alpha-web', {
            tier: 'Admin',
            priority: 10,
            subject: { pods: { namespaceSelector: ALPHA, podSelector: WEB } },
            ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }],
          }),
        ],
        expect: allow({ ingress: { [A1]: not(from(B1, B2)) } }),
      },
    ],
  },
  {
    name: 'an Admin Accept holds over a NetworkPolicy that denies everything',
    steps: [
      {
        what: 'admin accept',
        policies: [
          np('alpha', 'deny-all', { podSelector: {}, policyTypes: ['Ingress'] }),
          cnp('gamma-to-alpha', { tier: 'Admin', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: GAMMA }] }] }),
        ],
        expect: allow({ ingress: { [A1]: from(G1), [A2]: from(G1) } }),
      },
    ],
  },
  {
    name: 'Pass leaves the Admin tier: NetworkPolicy decides for a pod it isolates, the Baseline tier for one it does not',
    steps: [
      {
        what: 'pass',
        policies: [
          cnp('pass-beta', { tier: 'Admin', priority: 1, subject: { namespaces: ALPHA }, ingress: [{ action: 'Pass', from: [{ namespaces: BETA }] }] }),
          cnp('deny-pods', { tier: 'Admin', priority: 2, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
          np('alpha', 'a1-from-b1', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: BETA, podSelector: WEB }] }] }),
          cnp('baseline-deny-beta', { tier: 'Baseline', priority: 1, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }] }),
        ],
        expect: allow({ ingress: { [A1]: from(B1), [A2]: from(EXTERNAL) } }),
      },
    ],
  },
  {
    name: 'a NetworkPolicy that isolates a pod overrides a Baseline Deny; other pods keep it',
    steps: [
      {
        what: 'baseline',
        policies: [
          cnp('baseline-deny-pods', { tier: 'Baseline', priority: 5, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
          np('beta', 'b1-from-alpha', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: ALPHA }] }] }),
        ],
        expect: allow({ ingress: { [B1]: from(A1, A2), [A1]: from(EXTERNAL), [A2]: from(EXTERNAL), [B2]: from(EXTERNAL), [G1]: from(EXTERNAL) } }),
      },
    ],
  },
  {
    name: 'networks egress: overlapping CIDRs decide by priority, a narrower Deny inside a wider Accept',
    steps: [
      {
        what: 'networks',
        policies: [
          cnp('a1-not-node-b', {
            tier: 'Admin',
            priority: 1,
            subject: { pods: { namespaceSelector: ALPHA, podSelector: WEB } },
            egress: [
              { action: 'Accept', to: [{ networks: ['10.244.2.12/32', 'fd00:10:244:2::12/128'] }], protocols: [{ tcp: { destinationPort: { number: 80 } } }] },
              { action: 'Deny', to: [{ networks: ['10.244.2.0/24', 'fd00:10:244:2::/64'] }] },
            ],
          }),
          cnp('a1-cluster', {
            tier: 'Admin',
            priority: 2,
            subject: { pods: { namespaceSelector: ALPHA, podSelector: WEB } },
            egress: [{ action: 'Accept', to: [{ networks: ['10.244.0.0/16', 'fd00:10:244::/48'] }] }],
          }),
          np('alpha', 'a1-egress-nothing', { podSelector: WEB, policyTypes: ['Egress'] }),
        ],
        expect: allow({ egress: { [A1]: (x) => (x.target === A2 && tcp(80)(x)) || (x.target !== A2 && x.target !== B2) } }),
        toExternal: allow({ egress: { [A1]: nothing } }),
      },
    ],
  },
  {
    name: 'a priority change applies: the Accept moved before the Deny wins',
    steps: [20, 5].map((acceptPriority) => ({
      what: acceptPriority === 20 ? 'Deny first' : 'Accept first',
      policies: [
        np('alpha', 'a1-isolated', { podSelector: WEB, policyTypes: ['Ingress'] }),
        cnp('deny-beta', { tier: 'Admin', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }] }),
        cnp('accept-beta', { tier: 'Admin', priority: acceptPriority, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: BETA }] }] }),
      ],
      expect: acceptPriority === 20 ? allow({ ingress: { [A1]: nothing, [A2]: not(from(B1, B2)) } }) : allow({ ingress: { [A1]: from(B1, B2) } }),
    })),
  },
];

export const ISOLATION_PEERS_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a pod selected by no policy accepts everything and sends everywhere',
    steps: [{ what: 'no policy', policies: [], expect: always, toExternal: always }],
  },
  {
    name: 'a connection needs the source egress and the destination ingress to allow it, same-node and cross-node',
    steps: [{ podSelector: WEB }, { namespaceSelector: TEAM_A }].map((b2From, i) => ({
      what: i === 0 ? 'a1 reaches nothing but itself' : 'once b2 accepts alpha, a1 -> b2 passes',
      policies: [
        np('beta', 'b1-in', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A, podSelector: DB }] }] }),
        np('beta', 'b2-in', { podSelector: DB, ingress: [{ from: [b2From] }] }),
        np('alpha', 'a1-out', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [{ namespaceSelector: TEAM_B }] }] }),
        np('alpha', 'a2-in', { podSelector: DB, ingress: [{ from: [{ podSelector: {} }] }] }),
        np('gamma', 'g1-in', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }] }] }),
      ],
      expect: allow({
        ingress: { [B1]: from(A2), [B2]: i === 0 ? from(B1) : from(A1, A2), [A2]: from(A1), [G1]: fromAnyPod },
        egress: { [A1]: to(B1, B2) },
      }),
    })),
  },
  {
    name: 'a pod always reaches itself, even when every pod denies all ingress and all egress',
    steps: [
      {
        what: 'deny all',
        policies: ['alpha', 'beta', 'gamma'].map((ns) => np(ns, 'deny-all', { podSelector: {}, policyTypes: ['Ingress', 'Egress'] })),
        expect: (x) => x.source === x.target,
        toExternal: nothing,
      },
    ],
  },
  {
    name: 'given policyTypes are authoritative: rules of a direction not listed isolate nothing',
    steps: [
      {
        what: 'egress only',
        policies: [
          np('alpha', 'egress-only', {
            podSelector: {},
            policyTypes: ['Egress'],
            ingress: [{ from: [{ podSelector: { matchLabels: { app: 'nope' } } }] }],
            egress: [{ to: [{ namespaceSelector: {} }] }],
          }),
        ],
        expect: always,
        toExternal: (x) => nsOf(x.source) !== 'alpha',
      },
      {
        what: 'ingress only',
        policies: [
          np('alpha', 'ingress-only', {
            podSelector: {},
            policyTypes: ['Ingress'],
            ingress: [{ from: [{ namespaceSelector: TEAM_B }] }],
            egress: [{ to: [{ podSelector: { matchLabels: { app: 'nope' } } }] }],
          }),
        ],
        expect: allow({ ingress: { [A1]: fromNs('beta'), [A2]: fromNs('beta') } }),
        toExternal: always,
      },
    ],
  },
  {
    name: 'without policyTypes an egress rule isolates egress, and ingress [{}] allows every source',
    steps: [
      {
        what: 'inferred',
        policies: [np('alpha', 'inferred', { podSelector: {}, ingress: [{}], egress: [{ to: [{ podSelector: {} }] }] })],
        expect: allow({ egress: { [A1]: toNs('alpha'), [A2]: toNs('alpha') } }),
        toExternal: (x) => nsOf(x.source) !== 'alpha',
      },
    ],
  },
  {
    name: 'a rule allows only traffic matching one of its peers and one of its ports',
    steps: [
      {
        what: 'one peer, one port',
        policies: [np('alpha', 'db-tcp80', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }], ports: [{ protocol: 'TCP', port: 80 }] }] })],
        expect: allow({ ingress: { [A1]: (x) => x.source === A2 && tcp(80)(x) } }),
      },
      {
        what: 'two peers x two ports',
        policies: [
          np('alpha', 'db-tcp80', {
            podSelector: WEB,
            ingress: [{ from: [{ podSelector: DB }, { namespaceSelector: TEAM_B, podSelector: WEB }], ports: [{ port: 80 }, { protocol: 'UDP', port: 81 }] }],
          }),
        ],
        expect: allow({ ingress: { [A1]: (x) => [A2, B1].includes(x.source) && (tcp(80)(x) || (x.proto === 'udp' && x.port === 81)) } }),
      },
    ],
  },
  {
    name: 'a rule with missing or empty from/to matches every address, the external host included',
    steps: [
      {
        what: 'any peer',
        policies: [
          np('alpha', 'any-source-81', { podSelector: WEB, ingress: [{ ports: [{ port: 81 }] }] }),
          np('beta', 'any-source-udp80', { podSelector: {}, ingress: [{ from: [], ports: [{ protocol: 'UDP', port: 80 }] }] }),
          np('gamma', 'to-anywhere-80', { podSelector: {}, policyTypes: ['Egress'], egress: [{ ports: [{ port: 80 }] }] }),
        ],
        expect: allow({
          ingress: { [A1]: (x) => x.proto === 'tcp' && x.port === 81, [B1]: (x) => x.proto === 'udp' && x.port === 80, [B2]: (x) => x.proto === 'udp' && x.port === 80 },
          egress: { [G1]: tcp(80) },
        }),
        toExternal: (x) => x.source !== G1 || tcp(80)(x),
      },
    ],
  },
  {
    name: 'separate peer items are OR while selectors in one item are AND',
    steps: [
      { namespaceSelector: TEAM_B, podSelector: DB },
      { namespaceSelector: TEAM_A, podSelector: WEB },
    ].map((andPeer, i) => ({
      what: i === 0 ? 'OR beside AND' : 'AND selectors updated',
      policies: [
        np('alpha', 'or', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_B }, { podSelector: DB }] }] }),
        np('alpha', 'and', { podSelector: DB, ingress: [{ from: [andPeer] }] }),
      ],
      expect: allow({ ingress: { [A1]: from(B1, B2, A2), [A2]: i === 0 ? from(B2) : from(A1) } }),
    })),
  },
  {
    name: 'matchLabels and matchExpressions must all hold, and pod label changes move pods in and out of the peer set',
    steps: [
      {
        what: 'no pod has tier=back',
        policies: [
          np('alpha', 'from-back-db', {
            podSelector: WEB,
            ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' }, matchExpressions: [{ key: 'tier', operator: 'In', values: ['back'] }] } }] }],
          }),
        ],
        expect: allow({ ingress: { [A1]: nothing } }),
      },
      { what: 'b2 gains tier=back', podLabels: { [B2]: { app: 'db', tier: 'back' } }, expect: allow({ ingress: { [A1]: from(B2) } }) },
      { what: 'b1 has tier=back but not app=db', podLabels: { [B1]: { app: 'web', tier: 'back' } }, expect: allow({ ingress: { [A1]: from(B2) } }) },
    ],
  },
  {
    name: 'In and NotIn select namespaces, NotIn holding when the label is absent',
    steps: [
      {
        what: 'gamma has no team label',
        policies: [
          np('beta', 'from-not-team-b', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'NotIn', values: ['b'] }] } }] }] }),
          np('alpha', 'from-team-a-or-b', { podSelector: DB, ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'In', values: ['a', 'b'] }] } }] }] }),
        ],
        expect: allow({ ingress: { [B1]: fromNs('alpha', 'gamma'), [A2]: fromNs('alpha', 'beta') } }),
      },
      { what: 'gamma labelled team=b', namespaceLabels: { gamma: { team: 'b' } }, expect: allow({ ingress: { [B1]: fromNs('alpha'), [A2]: fromNs('alpha', 'beta', 'gamma') } }) },
    ],
  },
  {
    name: 'a new pod is at once in the peer sets and isolated as its labels say',
    steps: [
      {
        what: 'a3 (node-a) is a peer of b1',
        policies: [np('beta', 'web-from-alpha-db', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A, podSelector: DB }] }] })],
        addPods: [{ namespace: 'alpha', name: 'a3', node: 'node-a', ips: ['10.244.1.50', 'fd00:10:244:1::50'], labels: { app: 'db' }, ports: [] }],
        expect: allow({ ingress: { [B1]: from(A2, A3) } }),
      },
    ],
  },
  {
    name: 'a Pending or Succeeded pod is in no peer set',
    steps: [
      {
        what: 'a2 Pending',
        policies: [np('beta', 'web-from-team-a', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] })],
        podPhases: { [A2]: 'Pending' },
        expect: allow({ ingress: { [B1]: from(A1) } }),
      },
      {
        what: 'a2 Succeeded: its node fails closed both ways',
        podPhases: { [A2]: 'Succeeded' },
        expect: (x) => x.source === x.target || (x.source !== A2 && x.target !== A2 && allow({ ingress: { [B1]: from(A1) } })(x)),
      },
    ],
  },
];

export const EXPLAIN_SCENARIOS: readonly Scenario[] = [...CLUSTER_NETWORK_POLICY_SCENARIOS, ...ISOLATION_PEERS_SCENARIOS];

/** The address the probes of a cell use for an end (the external host's too). */
export function cellAddress(ipsOf: (key: string) => readonly string[], key: string, family: 4 | 6): string {
  if (key === EXTERNAL) return underlayIp(family, EXTERNAL_HOST);
  const ip = ipsOf(key).find((a) => familyOf(a) === family);
  if (ip === undefined) throw new Error(`${key} has no IPv${family} address, yet a cell names it`);
  return ip;
}

/** What explain says of a cell's packet, named by its addresses as the probe sends it, with
 *  every disagreement between the chains and the policies it saw on the way. */
export function explainCell(ex: (req: ExplainRequest) => Explanation, ipsOf: (key: string) => readonly string[], cell: Cell): { allowed: boolean; why: string; disagreements: string[] } {
  const x = ex({
    source: cellAddress(ipsOf, cell.source, cell.family),
    destination: cellAddress(ipsOf, cell.target, cell.family),
    protocol: cell.proto === 'tcp' ? 'TCP' : 'UDP',
    port: cell.port,
    family: cell.family,
  });
  const f = x.families[0];
  const why = f.unpoliced ?? f.directions.map((d) => `${d.direction} ${d.verdict} (${d.reason}${d.rule ? ` at ${d.rule.chain} #${d.rule.position}` : ''})`).join(', ');
  return { allowed: f.verdict === 'allowed', why, disagreements: f.directions.flatMap((d) => (d.disagreement ? [`${d.direction}: ${d.disagreement}`] : [])) };
}

/** The manifests of a state, in the shape the conformance harness writes them. */
export function clusterManifest(pods: readonly PodDef[], namespaces: Record<string, Record<string, string>>, policies: readonly unknown[]): unknown[] {
  return [
    ...Object.entries(namespaces).map(([name, labels]) => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } })),
    ...NODES.map((n) => ({ apiVersion: 'v1', kind: 'Node', metadata: { name: n.name }, spec: { podCIDRs: n.podCIDRs } })),
    ...pods.map((p) => ({
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: p.name, namespace: p.namespace, labels: p.labels },
      spec: { nodeName: p.node, hostNetwork: p.hostNetwork ?? false, containers: [{ name: 'c', image: 'x', ports: p.ports }] },
      status: { phase: p.phase ?? 'Running', podIPs: p.ips.map((ip) => ({ ip })) },
    })),
    ...policies.map((p) => ({ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', ...(p as object) })),
  ];
}
