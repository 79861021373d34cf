// The conformance tier's truth tables that are a question of policy state: for a state
// (policies, raw manifests, labels, phases, pods, agent flags), which new connections pass,
// cell by cell (source, target, family, protocol, port). Each is written by hand from the APIs
// (never from Weir's code), read by the conformance files that prove it with real packets
// (applyStep, probeStep) and by the two checks of `weir explain`: explain.test.ts (here)
// compares explain with real probes, test/unit/explain/scenarios.test.ts with these tables,
// without a cluster.
//
// Held, each written only here: the tables of cluster-network-policy.test.ts,
// isolation-peers.test.ts, ports-blocks-faults.test.ts, manifest-faults.test.ts,
// allow-action.test.ts, smoke.test.ts, large-ipblock.test.ts, node-traffic.test.ts and
// fail-closed.test.ts, which read them from here. Not held, as explain asks about a new
// connection under a given state:
// - isolation-peers: replies of allowed connections through a reverse direction that denies
//   (conntrack), a new pod on a gone pod's addresses (the conntrack flows the gone one leaves);
// - ports-blocks-faults: a manifest file that stops parsing (an agent keeps its last good
//   content; explain, reading once, leaves it out), an established connection outliving a
//   policy (conntrack), drift on a node (repairs of the kernel);
// - allow-action: the administrator's own FORWARD rule (the scenario holds what Weir decides,
//   the test adds the rule's drops), replies and spoofing into an established flow;
// - node-traffic: the node's own traffic (a pod and its node, another node): the probe matrix
//   has no node ends, and explain knows a node's address only through a host-networked pod;
//   its pod matrix is isolation-peers' deny-all scenario, which it reads from here;
// - fail-closed: the time a new pod takes to be enforced, spoofed sources, conntrack flows a
//   deleted pod leaves to the pod taking its address;
// - large-ipblock: the agents' memory and `weir render`'s message;
// - manifest-faults: an agent that cannot read its directory at start;
// - boot-and-drift, layered-writes: agents before their first sync, restarts, the hook's
//   repair, layered chains awaiting the tidy (the kernel's state, not the policies');
// - audit: what it proves is the lines, and its tables come with an audit log file per node.

import { explainConfig } from '../../src/cli/explain.ts';
import { parse, toConfig } from '../../src/cli/flags.ts';
import { type Explanation, type ExplainConfig, ExplainInputError, type ExplainRequest } from '../../src/explain/explain.ts';
import { familyOf } from '../../src/model/types.ts';
import { EXTERNAL_HOST, underlayIp } from '../../src/sim/addressing.ts';
import type { Matrix } from '../../src/sim/prober.ts';
import { A1, A2, B1, B2, type Cell, type Conformance, cnp, EXTERNAL, G1, NODES, np, nsOf, type PodDef } from './harness.ts';
import { allow, always, and, egress, from, fromAnyPod, fromNs, ingress, none, not, nothing, or, self, tcp, to, toNs, udp, v } from './predicates.ts';

export type Verdict = (x: Cell) => boolean;

export interface Step {
  readonly what: string;
  /** Replaces every policy; absent: the previous step's stay. */
  readonly policies?: readonly unknown[];
  readonly podLabels?: Readonly<Record<string, Record<string, string>>>;
  readonly namespaceLabels?: Readonly<Record<string, Record<string, string>>>;
  readonly podPhases?: Readonly<Record<string, string>>;
  /** The pods' hostNetwork field (the simulated pod keeps its bridged namespace and address). */
  readonly hostNetwork?: Readonly<Record<string, boolean>>;
  readonly addPods?: readonly PodDef[];
  readonly removePods?: readonly string[];
  /** Pods in the cluster (their namespace, veth and address) that no manifest names: Weir
   *  does not know them. */
  readonly unknownPods?: readonly PodDef[];
  /** Raw manifest files written beside the harness's, by name (read in name order after
   *  them); null removes one. */
  readonly files?: Readonly<Record<string, string | null>>;
  /** Every pod and the external host to every pod; absent: not stated for this step. */
  readonly expect?: Verdict;
  /** Every pod to the external host, when the scenario states it. */
  readonly toExternal?: Verdict;
}

export interface Scenario {
  readonly name: string;
  /** Flags every agent runs with beside the harness's (explain is given them too). */
  readonly agentArgs?: readonly string[];
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
const B3 = 'beta/b3';
// The cast's named ports, copied from the harness header: http is TCP everywhere (80, but 81 on
// a2), b1 declares none, and g1's dns is UDP 81.
const HTTP: Readonly<Record<string, number>> = { [A1]: 80, [A2]: 81, [B2]: 80, [G1]: 80 };
const toHttp: Verdict = (x) => x.target in HTTP && tcp(HTTP[x.target])(x);
// node-b's pod CIDRs: a2 (both families) and b2 (IPv4).
const NODE_B = ['10.244.2.0/24', 'fd00:10:244:2::/64'];

// ---- cluster-network-policy.test.ts ------------------------------------------------------------

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
        // a1: beta passes to its NetworkPolicy (b1 only); every other pod is denied by the Admin
        // tier, and the external host, which no Admin rule names, by the NetworkPolicy's isolation.
        // a2: beta passes, no NetworkPolicy selects a2, so the Baseline denies it; other pods are
        // denied by the Admin tier; the external host falls through to the default allow.
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
        // node-b's pods (a2, b2): only a2 on TCP 80; node-a's pods: every one (the wider Accept);
        // the external host: no rule names it, so the NetworkPolicy's isolation drops it.
        expect: allow({ egress: { [A1]: (x) => (x.target === A2 && tcp(80)(x)) || (x.target !== A2 && x.target !== B2) } }),
        toExternal: allow({ egress: { [A1]: nothing } }),
      },
    ],
  },
  {
    name: 'a priority change applies live: the Accept moved before the Deny wins',
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
  {
    name: "a namespace relabel moves its pods into and out of an Admin Deny's subject live; a NetworkPolicy change there keeps the Deny",
    steps: (() => {
      const guardFromAlpha = cnp('guarded-from-alpha', {
        tier: 'Admin',
        priority: 10,
        subject: { namespaces: { matchLabels: { guard: 'on' } } },
        ingress: [{ action: 'Deny', from: [{ namespaces: ALPHA }] }],
      });
      const guarded = allow({ ingress: { [B1]: not(fromNs('alpha')), [B2]: not(fromNs('alpha')) } });
      const steps: Step[] = [
        { what: 'no namespace guarded', policies: [guardFromAlpha], expect: always },
        { what: 'beta guarded', namespaceLabels: { beta: { team: 'b', guard: 'on' } }, expect: guarded },
        { what: 'a NetworkPolicy of beta allows everything', policies: [guardFromAlpha, np('beta', 'allow-all', { podSelector: {}, ingress: [{}] })], expect: guarded },
        { what: 'beta unguarded', namespaceLabels: { beta: { team: 'b' } }, expect: always },
      ];
      return steps;
    })(),
  },
  {
    name: "a pod relabel moves it into and out of an Admin Deny's subject live",
    steps: (() => {
      const guardFromAlpha = cnp('guarded-pods-from-alpha', {
        tier: 'Admin',
        priority: 10,
        subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { guard: 'on' } } } },
        ingress: [{ action: 'Deny', from: [{ namespaces: ALPHA }] }],
      });
      const steps: Step[] = [
        { what: 'no pod guarded', policies: [guardFromAlpha], expect: always },
        { what: 'b1 guarded', podLabels: { [B1]: { app: 'web', guard: 'on' } }, expect: allow({ ingress: { [B1]: not(fromNs('alpha')) } }) },
        { what: 'b1 unguarded', podLabels: { [B1]: { app: 'web' } }, expect: always },
      ];
      return steps;
    })(),
  },
  {
    // destinationNamedPort is in the experimental channel only (the standard v1beta1 CRD prunes
    // it); Weir reads it from manifests and the experimental CRD, so it is proved here.
    name: 'a named port Deny drops the port of that name on each pod that declares it, whatever its number or protocol; pods without the name are not matched',
    steps: (() => {
      const denyNamed = (name: string) =>
        cnp(`deny-${name}`, { tier: 'Admin', priority: 10, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }], protocols: [{ destinationNamedPort: name }] }] });
      return [
        // The external host is no pod, so no namespaces peer names it.
        { what: 'ingress to http', policies: [denyNamed('http')], expect: (x: Cell) => self(x) || !(fromAnyPod(x) && toHttp(x)) },
        // The API names no protocol for a named port: it is the container port's own, UDP for dns.
        { what: 'ingress to dns', policies: [denyNamed('dns')], expect: (x: Cell) => self(x) || !(fromAnyPod(x) && x.target === G1 && udp(81)(x)) },
        // In egress the name is resolved on each destination pod.
        {
          what: 'egress to http',
          policies: [
            cnp('a1-no-http-out', {
              tier: 'Admin',
              priority: 10,
              subject: { pods: { namespaceSelector: ALPHA, podSelector: WEB } },
              egress: [{ action: 'Deny', to: [{ namespaces: {} }], protocols: [{ destinationNamedPort: 'http' }] }],
            }),
          ],
          expect: egress(A1, not(toHttp)),
        },
      ];
    })(),
  },
  {
    name: 'a Baseline Accept holds over a later Baseline Deny for pods no NetworkPolicy isolates; one that isolates a pod makes the Baseline irrelevant to it',
    steps: (() => {
      // Named so that name order would put the Deny first: only the priority may decide.
      const baseline = [
        cnp('b-accept-beta', { tier: 'Baseline', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: BETA }] }] }),
        cnp('a-deny-pods', { tier: 'Baseline', priority: 20, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
      ];
      // Beta is accepted, other pods denied; the external host, which no rule names, allowed.
      const betaOrOutside = or(fromNs('beta'), not(fromAnyPod));
      return [
        { what: 'no NetworkPolicy', policies: baseline, expect: ingress({ [A1]: betaOrOutside, [A2]: betaOrOutside }) },
        // a1 isolated for ingress: its NetworkPolicy alone decides (gamma only). a2 is selected
        // for egress only, which leaves its ingress to the Baseline; its egress [{}] allows all.
        {
          what: 'a1 isolated by a NetworkPolicy',
          policies: [
            ...baseline,
            np('alpha', 'a1-from-gamma', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: GAMMA }] }] }),
            np('alpha', 'a2-egress-open', { podSelector: DB, policyTypes: ['Egress'], egress: [{}] }),
          ],
          expect: ingress({ [A1]: from(G1), [A2]: betaOrOutside }),
        },
      ];
    })(),
  },
  {
    name: 'a Baseline Pass skips the rest of the Baseline tier, its own later rules included, so the default allow applies',
    steps: [
      {
        what: 'baseline pass',
        policies: [
          cnp('pass-beta', {
            tier: 'Baseline',
            priority: 10,
            subject: { namespaces: ALPHA },
            ingress: [
              { action: 'Pass', from: [{ namespaces: BETA }] },
              { action: 'Deny', from: [{ pods: { podSelector: WEB } }] },
            ],
          }),
          cnp('deny-pods', { tier: 'Baseline', priority: 20, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
        ],
        // b1 (web) passes before the Deny of web pods, b2 before the later policy's Deny; a1, a2
        // and g1 are denied; the external host, which no rule names, is allowed.
        expect: ingress({ [A1]: or(fromNs('beta'), not(fromAnyPod)), [A2]: or(fromNs('beta'), not(fromAnyPod)) }),
      },
    ],
  },
  {
    name: 'a port range matches every port from its start to its end, in its own protocol only',
    steps: [
      {
        what: 'ranges',
        policies: [
          cnp('a1-ranges-in', {
            tier: 'Admin',
            priority: 10,
            subject: { pods: { namespaceSelector: ALPHA, podSelector: WEB } },
            ingress: [
              {
                action: 'Deny',
                from: [{ namespaces: {} }],
                protocols: [{ tcp: { destinationPort: { range: { start: 80, end: 81 } } } }, { udp: { destinationPort: { range: { start: 81, end: 1000 } } } }],
              },
            ],
          }),
          cnp('b1-range-out', {
            tier: 'Admin',
            priority: 10,
            subject: { pods: { namespaceSelector: BETA, podSelector: WEB } },
            egress: [{ action: 'Deny', to: [{ networks: NODE_B }], protocols: [{ udp: { destinationPort: { range: { start: 1, end: 80 } } } }] }],
          }),
        ],
        // a1: TCP 80 and 81 and UDP 81 denied from pods, UDP 80 and the external host allowed.
        // b1: UDP 80 to node-b's pods (a2, b2) denied, UDP 81 and TCP allowed.
        expect: allow({
          ingress: { [A1]: not(and(fromAnyPod, or(tcp(80), tcp(81), udp(81)))) },
          egress: { [B1]: not(and(to(A2, B2), udp(80))) },
        }),
      },
    ],
  },
  {
    name: 'an invalid ClusterNetworkPolicy denies everything to its subjects in each direction it names, at its own tier and priority',
    steps: (() => {
      const a1 = { pods: { namespaceSelector: ALPHA, podSelector: WEB } };
      const brokenAdmin = (action: string) => cnp('broken', { tier: 'Admin', priority: 20, subject: a1, ingress: [{ action, from: [{ namespaces: BETA }] }] });
      const around = [
        np('alpha', 'allow-all', { podSelector: {}, ingress: [{}] }),
        cnp('accept-gamma', { tier: 'Admin', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: GAMMA }] }] }),
        cnp('accept-beta', { tier: 'Admin', priority: 30, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: BETA }] }] }),
      ];
      return [
        // "Allow" is no action of the API (the CRD's enum refuses it). In the Admin tier no
        // NetworkPolicy reopens it; of the Admin Accepts, the one before it (priority 10) still
        // applies, the one after it (30) no longer does. a1's egress, not named, is untouched.
        { what: 'Admin, ingress, action Allow', policies: [...around, brokenAdmin('Allow')], expect: ingress({ [A1]: from(G1) }), toExternal: () => true },
        // Fixed, its one rule applies.
        { what: 'Admin, ingress, action Deny', policies: [...around, brokenAdmin('Deny')], expect: ingress({ [A1]: not(fromNs('beta')) }) },
        // A networks CIDR with host bits set (the CRD's CEL rule refuses it), in the Baseline
        // tier for egress: b1, which a NetworkPolicy isolates for egress, follows it (alpha
        // only); b2 reaches nothing, the external host included; every pod's ingress is untouched.
        {
          what: 'Baseline, egress, host bits',
          policies: [
            np('beta', 'b1-to-alpha', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [{ namespaceSelector: ALPHA }] }] }),
            cnp('broken', { tier: 'Baseline', priority: 5, subject: { namespaces: BETA }, egress: [{ action: 'Deny', to: [{ networks: ['10.244.2.5/24'] }] }] }),
          ],
          expect: allow({ egress: { [B1]: toNs('alpha'), [B2]: none } }),
          toExternal: (x: Cell) => x.source !== B1 && x.source !== B2,
        },
      ];
    })(),
  },
  {
    name: 'an invalid ClusterNetworkPolicy whose subject cannot be read denies to every pod; one whose spec cannot be read, in both directions',
    steps: [
      // A label value that is no string: the subject selects nothing readable, so every pod.
      {
        what: 'unreadable subject, ingress',
        policies: [cnp('broken', { tier: 'Admin', priority: 5, subject: { namespaces: { matchLabels: { team: 7 } } }, ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }] })],
        expect: self,
        toExternal: () => true,
      },
      { what: 'unreadable spec', policies: [cnp('broken', 'deny everything')], expect: self, toExternal: none },
    ],
  },
];

// ---- isolation-peers.test.ts -------------------------------------------------------------------

export const ISOLATION_PEERS_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a pod selected by no policy accepts everything and sends everywhere',
    steps: [{ what: 'no policy', policies: [], expect: always, toExternal: always }],
  },
  {
    name: 'ingress isolation comes only from a policy in the pod own namespace, not from a matching podSelector elsewhere',
    steps: [
      // app=web also matches alpha/a1 and gamma/g1, but the policy lives in beta.
      { what: 'beta policy isolates b1 only', policies: [np('beta', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] })], expect: allow({ ingress: { [B1]: nothing } }) },
      {
        what: 'a gamma policy now isolates g1 as well',
        policies: [np('beta', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] }), np('gamma', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] })],
        expect: allow({ ingress: { [B1]: nothing, [G1]: nothing } }),
      },
    ],
  },
  {
    name: 'egress isolation comes only from a policy in the pod own namespace with Egress in its types',
    steps: [
      {
        what: 'only a1 is egress-isolated',
        policies: [
          np('alpha', 'web-no-egress', { podSelector: WEB, policyTypes: ['Egress'] }),
          // app=db matches alpha/a2 and beta/b2, but gamma has no such pod: it isolates nobody.
          np('gamma', 'db-no-egress', { podSelector: DB, policyTypes: ['Egress'] }),
        ],
        expect: allow({ egress: { [A1]: nothing } }),
      },
    ],
  },
  {
    name: 'a pod isolated by several policies accepts the union of what each allows, and loses a source when its policy goes',
    steps: (() => {
      const fromDb = np('alpha', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] });
      const fromBetaWeb = np('alpha', 'from-beta-web', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_B, podSelector: WEB }] }] });
      return [
        { what: 'a2 (cross-node) and b1 (same node) both allowed', policies: [fromDb, fromBetaWeb], expect: allow({ ingress: { [A1]: from(A2, B1) } }) },
        { what: 'after deleting from-db only b1 remains', policies: [fromBetaWeb], expect: allow({ ingress: { [A1]: from(B1) } }) },
      ];
    })(),
  },
  {
    name: 'a connection needs the source egress and the destination ingress to allow it, same-node and cross-node',
    steps: [{ podSelector: WEB }, { namespaceSelector: TEAM_A }].map((b2From, i) => ({
      what: i === 0 ? 'a1 reaches nothing but itself' : 'once b2 accepts alpha, a1 -> b2 passes (both sides allow)',
      policies: [
        np('beta', 'b1-in', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A, podSelector: DB }] }] }),
        np('beta', 'b2-in', { podSelector: DB, ingress: [{ from: [b2From] }] }),
        np('alpha', 'a1-out', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [{ namespaceSelector: TEAM_B }] }] }),
        np('alpha', 'a2-in', { podSelector: DB, ingress: [{ from: [{ podSelector: {} }] }] }),
        np('gamma', 'g1-in', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }] }] }),
      ],
      // a1 -> b1 (same node) and a1 -> b2 (cross-node): egress allows, ingress denies (until b2
      // accepts alpha). a1 -> g1 (same node) and a1 -> a2 (cross-node): ingress allows, egress denies.
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
        // namespaceSelector {} is every pod of every namespace, not the external host.
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
    name: 'without policyTypes Ingress is always implied, and egress [] does not isolate egress',
    steps: [
      {
        what: 'beta ingress denied, egress free: egress [] isolates nothing',
        policies: [np('beta', 'no-rules', { podSelector: {}, egress: [] })],
        expect: allow({ ingress: { [B1]: nothing, [B2]: nothing } }),
        toExternal: always,
      },
      {
        what: 'only an egress rule given: ingress still denied, egress to alpha only',
        policies: [np('beta', 'no-rules', { podSelector: {}, egress: [{ to: [{ namespaceSelector: TEAM_A }] }] })],
        expect: allow({ ingress: { [B1]: nothing, [B2]: nothing }, egress: { [B1]: toNs('alpha'), [B2]: toNs('alpha') } }),
      },
    ],
  },
  {
    name: 'policyTypes [Egress] with no egress rules denies all egress, to the external host too',
    steps: [
      {
        what: 'b1 sends nothing, still accepts everything; b1 cannot reach the external host',
        policies: [np('beta', 'web-no-egress', { podSelector: WEB, policyTypes: ['Egress'] })],
        expect: allow({ egress: { [B1]: nothing } }),
        toExternal: (x) => x.source !== B1,
      },
    ],
  },
  {
    name: 'Ingress type with ingress missing or [] denies all ingress; ingress [{}] allows all',
    steps: [
      { what: 'ingress missing', policies: [np('gamma', 'in', { podSelector: {}, policyTypes: ['Ingress'] })], expect: allow({ ingress: { [G1]: nothing } }) },
      { what: 'ingress []', policies: [np('gamma', 'in', { podSelector: {}, policyTypes: ['Ingress'], ingress: [] })], expect: allow({ ingress: { [G1]: nothing } }) },
      { what: 'ingress [{}] allows every source, the external host included', policies: [np('gamma', 'in', { podSelector: {}, policyTypes: ['Ingress'], ingress: [{}] })], expect: always },
    ],
  },
  {
    name: 'a rule allows only traffic matching one of its peers and one of its ports',
    steps: [
      {
        what: 'one peer, one port',
        policies: [np('alpha', 'db-tcp80', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }], ports: [{ protocol: 'TCP', port: 80 }] }] })],
        // a2 on udp or on port 81: peer right, port wrong. b1 on tcp/80: port right, peer wrong.
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
    name: 'a rule with missing or empty ports matches every port of every protocol',
    steps: [
      {
        what: 'a2 -> a1 and b2 -> a2 on tcp/udp 80/81',
        policies: [
          np('alpha', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] }),
          np('beta', 'db-to-alpha', { podSelector: DB, egress: [{ to: [{ namespaceSelector: TEAM_A }], ports: [] }] }),
        ],
        expect: allow({ ingress: { [A1]: from(A2), [B2]: nothing }, egress: { [B2]: toNs('alpha') } }),
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
      // OR: every beta pod, or db pods of alpha. AND: db pods of beta only (not b1, not a2), then
      // web pods of alpha.
      expect: allow({ ingress: { [A1]: from(B1, B2, A2), [A2]: i === 0 ? from(B2) : from(A1) } }),
    })),
  },
  {
    name: 'a podSelector alone selects pods of the policy namespace only',
    steps: [
      {
        what: 'own namespace only',
        policies: [
          np('beta', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] }),
          np('alpha', 'from-own-ns', { podSelector: DB, ingress: [{ from: [{ podSelector: {} }] }] }),
        ],
        // alpha/a2 is app=db too, but not in beta; gamma/g1 and beta pods are not in alpha.
        expect: allow({ ingress: { [B1]: from(B2), [A2]: from(A1) } }),
      },
    ],
  },
  {
    name: 'a namespaceSelector alone selects every pod of matching namespaces; {} matches every pod but not the external host',
    steps: [
      {
        what: 'namespace-wide peers',
        policies: [
          np('beta', 'from-team-a', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] }),
          np('gamma', 'from-all-pods', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }] }] }),
          np('beta', 'db-from-web-anywhere', { podSelector: DB, ingress: [{ from: [{ namespaceSelector: {}, podSelector: WEB }] }] }),
        ],
        expect: allow({ ingress: { [B1]: fromNs('alpha'), [G1]: fromAnyPod, [B2]: from(A1, B1, G1) } }),
      },
    ],
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
      { what: 'b2 loses tier=back', podLabels: { [B2]: { app: 'db' } }, expect: allow({ ingress: { [A1]: nothing } }) },
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
    name: 'Exists and DoesNotExist select by key presence, DoesNotExist holding when the label is absent',
    steps: [
      {
        what: 'no pod has a role label',
        policies: [
          np('alpha', 'from-unlabelled-ns', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'DoesNotExist' }] } }] }] }),
          np('beta', 'from-labelled-ns-no-role', {
            podSelector: WEB,
            ingress: [
              {
                from: [
                  {
                    namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'Exists' }] },
                    podSelector: { matchExpressions: [{ key: 'role', operator: 'DoesNotExist' }] },
                  },
                ],
              },
            ],
          }),
        ],
        expect: allow({ ingress: { [A1]: fromNs('gamma'), [B1]: fromNs('alpha', 'beta') } }),
      },
      { what: 'a2 gains a role label', podLabels: { [A2]: { app: 'db', role: 'x' } }, expect: allow({ ingress: { [A1]: fromNs('gamma'), [B1]: from(A1, B2) } }) },
    ],
  },
  {
    name: 'a NotIn target selector selects pods lacking the label, so removing a label can isolate a pod',
    steps: [
      {
        what: 'a2 (app=db) isolated, a1 (app=web) not',
        policies: [np('alpha', 'isolate-non-web', { podSelector: { matchExpressions: [{ key: 'app', operator: 'NotIn', values: ['web'] }] }, policyTypes: ['Ingress'] })],
        expect: allow({ ingress: { [A2]: nothing } }),
      },
      { what: 'a1 without app label now isolated', podLabels: { [A1]: {} }, expect: allow({ ingress: { [A1]: nothing, [A2]: nothing } }) },
    ],
  },
  {
    name: 'namespace label changes move all its pods in and out of peer sets',
    steps: [
      {
        what: 'alpha is team=a',
        policies: [np('beta', 'from-team-a', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] })],
        expect: allow({ ingress: { [B1]: fromNs('alpha'), [B2]: fromNs('alpha') } }),
      },
      { what: 'gamma joins', namespaceLabels: { gamma: { team: 'a' } }, expect: allow({ ingress: { [B1]: fromNs('alpha', 'gamma'), [B2]: fromNs('alpha', 'gamma') } }) },
      { what: 'alpha leaves', namespaceLabels: { alpha: {} }, expect: allow({ ingress: { [B1]: fromNs('gamma'), [B2]: fromNs('gamma') } }) },
    ],
  },
  {
    name: 'a peer set made again after a namespace relabel holds the pods the namespace selects now',
    steps: (() => {
      const fromTeamA = np('beta', 'from-team-a', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] });
      return [
        { what: 'alpha is team=a', policies: [fromTeamA], expect: allow({ ingress: { [B1]: fromNs('alpha'), [B2]: fromNs('alpha') } }) },
        // The set goes with its only policy; the namespace changes while no set follows it.
        { what: 'the policy deleted', policies: [], expect: always },
        {
          what: 'the policy back after gamma joined',
          namespaceLabels: { gamma: { team: 'a' } },
          policies: [fromTeamA],
          expect: allow({ ingress: { [B1]: fromNs('alpha', 'gamma'), [B2]: fromNs('alpha', 'gamma') } }),
        },
      ];
    })(),
  },
  {
    name: 'pod label changes move pods in and out of a policy target selection',
    steps: [
      { what: 'a1 isolated', policies: [np('alpha', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] })], expect: allow({ ingress: { [A1]: nothing } }) },
      { what: 'a2 relabelled web: isolated too', podLabels: { [A2]: { app: 'web' } }, expect: allow({ ingress: { [A1]: nothing, [A2]: nothing } }) },
      { what: 'a1 relabelled: isolation gone', podLabels: { [A1]: { app: 'other' } }, expect: allow({ ingress: { [A2]: nothing } }) },
    ],
  },
  {
    name: 'a new pod is at once in the peer sets and isolated as its labels say, on either node',
    steps: [
      {
        what: 'a3 (node-a) is a peer of b1',
        policies: [np('beta', 'web-from-alpha-db', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A, podSelector: DB }] }] })],
        addPods: [{ namespace: 'alpha', name: 'a3', node: 'node-a', ips: ['10.244.1.50', 'fd00:10:244:1::50'], labels: { app: 'db' }, ports: [] }],
        expect: allow({ ingress: { [B1]: from(A2, A3) } }),
      },
      {
        what: 'b3 (node-b) is isolated like b1',
        addPods: [{ namespace: 'beta', name: 'b3', node: 'node-b', ips: ['10.244.2.50'], labels: { app: 'web' }, ports: [] }],
        expect: allow({ ingress: { [B1]: from(A2, A3), [B3]: from(A2, A3) } }),
      },
    ],
  },
  {
    name: 'a Pending or Succeeded pod is in no peer set, and rejoins when Running again',
    steps: [
      {
        what: 'a2 Running',
        policies: [np('beta', 'web-from-team-a', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] })],
        expect: allow({ ingress: { [B1]: fromNs('alpha') } }),
      },
      // The sim still lets a non-Running pod's packets out: a Pending pod with an IP is policed
      // on its node, so only b1's peer set decides.
      { what: 'a2 Pending', podPhases: { [A2]: 'Pending' }, expect: allow({ ingress: { [B1]: from(A1) } }) },
      {
        // A finished pod's address belongs to no pod any more.
        what: 'a2 Succeeded: its node fails closed both ways',
        podPhases: { [A2]: 'Succeeded' },
        expect: (x) => x.source === x.target || (x.source !== A2 && x.target !== A2 && allow({ ingress: { [B1]: from(A1) } })(x)),
      },
      { what: 'a2 Running again', podPhases: { [A2]: 'Running' }, expect: allow({ ingress: { [B1]: fromNs('alpha') } }) },
    ],
  },
  {
    name: 'updating a policy target selector re-isolates pods, and deleting the last policy restores default allow',
    steps: [
      { what: 'all alpha pods isolated', policies: [np('alpha', 'deny', { podSelector: {}, policyTypes: ['Ingress'] })], expect: allow({ ingress: { [A1]: nothing, [A2]: nothing } }) },
      { what: 'selector narrowed to app=db', policies: [np('alpha', 'deny', { podSelector: DB, policyTypes: ['Ingress'] })], expect: allow({ ingress: { [A2]: nothing } }) },
      { what: 'policy deleted', policies: [], expect: always },
    ],
  },
];

// ---- ports-blocks-faults.test.ts --------------------------------------------------------------

export const PORT_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a numeric TCP port allows that port only, and editing it moves the allowance',
    steps: [80, 81].map((port) => ({
      what: `TCP ${port}`,
      policies: [np('alpha', 'p', { podSelector: WEB, ingress: [{ ports: [{ protocol: 'TCP', port }] }] })],
      expect: ingress({ [A1]: tcp(port) }),
    })),
  },
  {
    name: 'a protocol with no port allows every port of that protocol and none of the other',
    steps: [
      { what: 'UDP, every port', policies: [np('beta', 'p', { podSelector: DB, ingress: [{ ports: [{ protocol: 'UDP' }] }] })], expect: ingress({ [B2]: udp() }) },
      { what: 'TCP, every port', policies: [np('beta', 'p', { podSelector: DB, ingress: [{ ports: [{ protocol: 'TCP' }] }] })], expect: ingress({ [B2]: tcp() }) },
    ],
  },
  {
    name: 'a port with no protocol means TCP',
    steps: [{ what: 'port 81', policies: [np('gamma', 'p', { podSelector: {}, ingress: [{ ports: [{ port: 81 }] }] })], expect: ingress({ [G1]: tcp(81) }) }],
  },
  {
    name: 'endPort makes a range: 80-81 allows both ports, 81-81 only 81',
    steps: [
      { what: '80-81', policies: [np('alpha', 'p', { podSelector: DB, ingress: [{ ports: [{ port: 80, endPort: 81 }] }] })], expect: ingress({ [A2]: tcp() }) },
      { what: '81-81', policies: [np('alpha', 'p', { podSelector: DB, ingress: [{ ports: [{ port: 81, endPort: 81 }] }] })], expect: ingress({ [A2]: tcp(81) }) },
    ],
  },
  {
    name: 'several ports in one rule each allow their own protocol and port; TCP and UDP on one number are separate entries',
    steps: [
      {
        what: 'UDP 80 + TCP 81',
        policies: [np('beta', 'p', { podSelector: WEB, ingress: [{ ports: [{ protocol: 'UDP', port: 80 }, { port: 81 }] }] })],
        expect: ingress({ [B1]: or(udp(80), tcp(81)) }),
      },
      {
        what: 'TCP 80 + UDP 80',
        policies: [
          np('beta', 'p', {
            podSelector: WEB,
            ingress: [
              {
                ports: [
                  { protocol: 'TCP', port: 80 },
                  { protocol: 'UDP', port: 80 },
                ],
              },
            ],
          }),
        ],
        expect: ingress({ [B1]: (x) => x.port === 80 }),
      },
    ],
  },
  {
    name: 'an ingress named port resolves on each selected pod: http is 80 on a1 but 81 on a2',
    steps: [
      {
        what: 'both selected',
        policies: [np('alpha', 'named', { podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['web', 'db'] }] }, ingress: [{ ports: [{ port: 'http' }] }] })],
        expect: ingress({ [A1]: tcp(80), [A2]: tcp(81) }),
      },
      { what: 'a2 no longer selected', podLabels: { [A2]: { app: 'cache' } }, expect: ingress({ [A1]: tcp(80) }) },
    ],
  },
  {
    name: 'an egress named port resolves on each destination; destinations lacking the name are unreachable',
    // b1 has no named port at all; every other pod has http with its own number.
    steps: (() => {
      const pol = (to: unknown) => np('alpha', 'named-out', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [to], ports: [{ port: 'http' }] }] });
      const toHttpOf = (targets: string[]) => (x: Cell) => targets.includes(x.target) && x.target in HTTP && tcp(HTTP[x.target])(x);
      return [
        { what: 'every namespace', policies: [pol({ namespaceSelector: {} })], expect: egress(A1, toHttpOf([A2, B2, G1])) },
        { what: 'team b only', policies: [pol({ namespaceSelector: TEAM_B })], expect: egress(A1, toHttpOf([B2])) },
        { what: 'gamma joins team b', namespaceLabels: { gamma: { team: 'b' } }, expect: egress(A1, toHttpOf([B2, G1])) },
      ];
    })(),
  },
  {
    name: 'a named port with protocol UDP matches only UDP container ports of that name',
    steps: [
      { what: 'UDP dns', policies: [np('gamma', 'dns', { podSelector: {}, ingress: [{ ports: [{ protocol: 'UDP', port: 'dns' }] }] })], expect: ingress({ [G1]: udp(81) }) },
      // g1's "dns" is UDP, so the same name as TCP (the default) resolves to nothing.
      { what: 'TCP dns', policies: [np('gamma', 'dns', { podSelector: {}, ingress: [{ ports: [{ port: 'dns' }] }] })], expect: ingress({ [G1]: none }) },
    ],
  },
  {
    name: 'an egress named port toward an ipBlock peer matches nothing, while a numeric port does (impl)',
    steps: (() => {
      const pol = (ports: unknown[]) =>
        np('alpha', 'named-block', {
          podSelector: WEB,
          policyTypes: ['Egress'],
          egress: [{ to: [{ ipBlock: { cidr: '10.244.0.0/16' } }, { ipBlock: { cidr: 'fd00:10:244::/48' } }], ports }],
        });
      return [
        { what: 'named port only', policies: [pol([{ port: 'http' }])], expect: egress(A1, none) },
        { what: 'named port plus TCP 80', policies: [pol([{ port: 'http' }, { port: 80 }])], expect: egress(A1, tcp(80)) },
      ];
    })(),
  },
];

export const IPBLOCK_SCENARIOS: readonly Scenario[] = [
  {
    name: 'an ipBlock admits the external host only while a block covers it, in its own family',
    steps: (() => {
      const pol = (...cidrs: string[]) => np('alpha', 'ext', { podSelector: WEB, ingress: [{ from: cidrs.map((cidr) => ({ ipBlock: { cidr } })) }] });
      return [
        { what: '/32', policies: [pol('172.31.0.200/32')], expect: ingress({ [A1]: and(from(EXTERNAL), v(4)) }) },
        { what: '/24 and /64', policies: [pol('172.31.0.0/24', 'fd00:172:31::/64')], expect: ingress({ [A1]: from(EXTERNAL) }) },
        { what: 'blocks beside it', policies: [pol('172.31.1.0/24', 'fd00:172:32::/64')], expect: ingress({ [A1]: none }) },
      ];
    })(),
  },
  {
    name: 'except carves addresses out of a cidr: the external host and node-b pods excepted',
    steps: (() => {
      const pol = (extExcept: string) =>
        np('alpha', 'except', {
          podSelector: WEB,
          ingress: [
            {
              from: [
                { ipBlock: { cidr: '172.31.0.0/24', except: [extExcept] } },
                { ipBlock: { cidr: '10.244.0.0/16', except: ['10.244.2.0/24'] } },
                { ipBlock: { cidr: 'fd00:172:31::/64', except: ['fd00:172:31::200/128'] } },
              ],
            },
          ],
        });
      return [
        { what: 'external excepted', policies: [pol('172.31.0.200/32')], expect: ingress({ [A1]: and(from(B1), v(4)) }) },
        { what: 'except no longer covers .200', policies: [pol('172.31.0.0/25')], expect: ingress({ [A1]: and(from(B1, EXTERNAL), v(4)) }) },
      ];
    })(),
  },
  {
    name: 'overlapping blocks: an address excepted by one block but covered by another is allowed',
    steps: (() => {
      const pol = (v4: string, v6: string) =>
        np('alpha', 'overlap', {
          podSelector: DB,
          ingress: [
            {
              from: [
                { ipBlock: { cidr: '10.244.0.0/16', except: ['10.244.2.0/24'] } },
                { ipBlock: { cidr: v4 } },
                { ipBlock: { cidr: 'fd00:10:244::/48', except: ['fd00:10:244:1::/64'] } },
                { ipBlock: { cidr: v6 } },
              ],
            },
          ],
        });
      // a1 10.244.1.11 / ::11, b1 .1.21 / ::21, b2 .2.22, g1 ::31 (node-a's /64 is excepted).
      return [
        { what: '.16/28 and ::20/124', policies: [pol('10.244.2.16/28', 'fd00:10:244:1::20/124')], expect: ingress({ [A2]: or(and(v(4), from(A1, B1, B2)), and(v(6), from(B1))) }) },
        { what: '.0/28 and ::30/124', policies: [pol('10.244.2.0/28', 'fd00:10:244:1::30/124')], expect: ingress({ [A2]: or(and(v(4), from(A1, B1)), and(v(6), from(G1))) }) },
      ];
    })(),
  },
  {
    name: '0.0.0.0/0 and ::/0 match every address of their family, pods included (impl)',
    steps: (() => {
      const pol = (...blocks: unknown[]) => np('alpha', 'all', { podSelector: WEB, ingress: [{ from: blocks.map((ipBlock) => ({ ipBlock })) }] });
      return [
        { what: '0.0.0.0/0', policies: [pol({ cidr: '0.0.0.0/0' })], expect: ingress({ [A1]: v(4) }) },
        { what: 'both /0', policies: [pol({ cidr: '0.0.0.0/0' }, { cidr: '::/0' })], expect: ingress({ [A1]: () => true }) },
        {
          what: '/0 except the pod ranges',
          policies: [pol({ cidr: '0.0.0.0/0', except: ['10.244.0.0/16'] }, { cidr: '::/0', except: ['fd00:10:244::/48'] })],
          expect: ingress({ [A1]: from(EXTERNAL) }),
        },
      ];
    })(),
  },
  {
    name: 'a cidr with host bits set is treated as its network',
    steps: [
      {
        what: 'host bits',
        policies: [
          np('alpha', 'hostbits', {
            podSelector: DB,
            ingress: [{ from: [{ ipBlock: { cidr: '172.31.0.7/24' } }, { ipBlock: { cidr: '10.244.1.99/24' } }, { ipBlock: { cidr: 'fd00:10:244:1::99/64' } }] }],
          }),
        ],
        // node-a's pods (a1, b1 both families, g1 v6) and the external host over IPv4.
        expect: ingress({ [A2]: or(from(A1, B1, G1), and(from(EXTERNAL), v(4))) }),
      },
    ],
  },
  {
    name: 'an ipBlock of one family allows nothing of the other, even on single-stack pods',
    steps: [
      {
        what: 'other family',
        policies: [
          np('beta', 'v6-to-v4only', { podSelector: DB, ingress: [{ from: [{ ipBlock: { cidr: '::/0' } }] }] }),
          np('gamma', 'v4-to-v6only', { podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0' } }] }] }),
          np('alpha', 'ext-v6', { podSelector: WEB, ingress: [{ from: [{ ipBlock: { cidr: 'fd00:172:31::/64' } }] }] }),
        ],
        expect: ingress({ [B2]: none, [G1]: none, [A1]: and(from(EXTERNAL), v(6)) }),
      },
      {
        what: 'own family',
        policies: [
          np('beta', 'v6-to-v4only', { podSelector: DB, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0' } }] }] }),
          np('gamma', 'v4-to-v6only', { podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '::/0' } }] }] }),
        ],
        expect: () => true,
      },
    ],
  },
  {
    name: 'an egress ipBlock covering a pod IP allows that pod in that family only (impl)',
    steps: (
      [
        ['10.244.2.12/32', 4],
        ['fd00:10:244:2::12/128', 6],
      ] as const
    ).map(([cidr, family]) => ({
      what: `a2 over IPv${family}`,
      policies: [np('beta', 'to-a2', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [{ ipBlock: { cidr } }] }] })],
      expect: egress(
        B1,
        and((x) => x.target === A2, v(family)),
      ),
    })),
  },
  {
    name: 'a /32 ipBlock and a pod selector naming the same address: the address stays allowed when the pod stops matching',
    steps: [
      {
        // Both rules allow every port, so a1's ingress merges their peers into one set per
        // family, where a2's IPv4 address comes from both: the block (as a /32) and the pod.
        what: 'a2 over both families',
        policies: [
          np('alpha', 'from-a2-block', { podSelector: WEB, ingress: [{ from: [{ ipBlock: { cidr: '10.244.2.12/32' } }] }] }),
          np('alpha', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] }),
        ],
        expect: ingress({ [A1]: from(A2) }),
      },
      { what: 'a2 over IPv4 only: the block still covers it', podLabels: { [A2]: { app: 'cache' } }, expect: ingress({ [A1]: and(from(A2), v(4)) }) },
    ],
  },
  {
    name: 'egress to the external host follows the ipBlock, its family and its ports',
    steps: (() => {
      const pol = (cidr: string, ports?: unknown[]) => np('alpha', 'to-ext', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [{ ipBlock: { cidr } }], ...(ports ? { ports } : {}) }] });
      return [
        {
          what: 'v4 TCP 80 to external; pods unreachable from a1',
          policies: [pol('172.31.0.200/32', [{ port: 80 }])],
          expect: egress(A1, none),
          toExternal: (x: Cell) => x.source !== A1 || (x.family === 4 && tcp(80)(x)),
        },
        { what: 'v6 to external', policies: [pol('fd00:172:31::/64')], toExternal: (x: Cell) => x.source !== A1 || x.family === 6 },
      ];
    })(),
  },
];

export const INVALID_POLICY_SCENARIOS: readonly Scenario[] = [
  {
    name: 'an invalid policy is skipped whole, keeps the pods it selects isolated, and valid ones still apply',
    steps: (() => {
      const valid = np('alpha', 'web-80', { podSelector: WEB, ingress: [{ ports: [{ port: 80 }] }] });
      // Half-applying these would open everything through the `{}` rule.
      const badCidr = (ns: string, app: string) => np(ns, 'bad-cidr', { podSelector: { matchLabels: { app } }, ingress: [{}, { from: [{ ipBlock: { cidr: 'nonsense' } }] }] });
      // An unreadable podSelector isolates every pod of its namespace, in its declared direction.
      const badOp = (operator: string) => np('alpha', 'bad-op', { podSelector: { matchExpressions: [{ key: 'app', operator, values: ['web'] }] }, policyTypes: ['Ingress'], ingress: [{}] });
      return [
        { what: 'bad cidr', policies: [valid, badCidr('alpha', 'web'), badCidr('beta', 'db')], expect: ingress({ [A1]: tcp(80), [B2]: none }) },
        { what: 'operator "in"', policies: [valid, badOp('in')], expect: ingress({ [A1]: tcp(80), [A2]: none }) },
        { what: 'operator fixed', policies: [valid, badOp('In')], expect: ingress({ [A1]: () => true }) },
      ];
    })(),
  },
];

// A real hostNetwork pod sends from the node's own address (node-traffic.test.ts: always
// allowed, never policed). The simulated pod keeps its bridged namespace and IP, which then
// belongs to no pod Weir polices: its traffic fails closed both ways, and it is in no peer set.
export const HOST_NETWORK_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a hostNetwork pod is never a policy target, and a bridged address claimed by one belongs to no pod (impl)',
    steps: (() => {
      const policies = [np('alpha', 'deny', { podSelector: {} }), np('alpha', 'from-web', { podSelector: DB, ingress: [{ from: [{ namespaceSelector: {}, podSelector: WEB }] }] })];
      const unknownA1: Verdict = (x) => x.source === x.target || (x.source !== A1 && x.target !== A1);
      return [
        { what: 'a1 a normal pod', policies, expect: ingress({ [A1]: none, [A2]: from(A1, B1, G1) }) },
        { what: 'a1 on the host network', hostNetwork: { [A1]: true }, expect: and(unknownA1, ingress({ [A2]: from(B1, G1) })) },
        { what: 'a1 back on the pod network', hostNetwork: { [A1]: false }, expect: ingress({ [A1]: none, [A2]: from(A1, B1, G1) }) },
      ];
    })(),
  },
];

// ---- allow-action.test.ts, smoke.test.ts, fail-closed.test.ts ---------------------------------

export const ALLOW_ACTION_SCENARIOS: readonly Scenario[] = [
  {
    // What Weir decides; the test adds the drops of the administrator's rule after its hook.
    name: "an administrator's FORWARD rule after Weir's still applies to traffic policy allows",
    agentArgs: ['--allow-action', 'RETURN'],
    steps: [
      { what: 'no policy', expect: () => true },
      // Policy still decides first: a1 isolated for ingress with nothing allowed.
      { what: 'policy denies', policies: [np('alpha', 'deny-a1', { podSelector: WEB })], expect: (x) => x.target !== A1 || x.source === A1 },
    ],
  },
];

export const SMOKE_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a default-deny ingress policy isolates only the pods of its namespace it selects',
    steps: [{ what: 'a1 isolated', policies: [np('alpha', 'deny', { podSelector: WEB })], expect: (x) => x.target !== A1 || x.source === A1 }],
  },
];

/** A pod in the cluster (its veth on cni0, its IP routed) that no manifest names. */
export const LATE_POD: PodDef = { namespace: 'alpha', name: 'late', node: 'node-a', ips: ['10.244.1.51', 'fd00:10:244:1::51'], labels: { app: 'late' }, ports: [] };
const LATE = 'alpha/late';

export const FAIL_CLOSED_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a pod whose IP Weir does not know can neither send nor receive, same-node or cross-node',
    steps: [
      {
        what: 'unknown pod isolated',
        unknownPods: [LATE_POD],
        expect: (x) => x.source === x.target || (x.source !== LATE && x.target !== LATE),
        toExternal: (x) => x.source !== LATE,
      },
    ],
  },
];

// ---- large-ipblock.test.ts ----------------------------------------------------------------------

/** Host prefixes scattered over the IPv6 space, none in the simulated cluster (fd00::/16). */
function* v6Hosts(): Generator<string> {
  for (let i = 1; ; i++) {
    const h = Math.imul(i, 2654435761) >>> 0;
    if (h >>> 16 === 0xfd00) continue;
    yield `${(h >>> 16).toString(16)}:${(h & 0xffff).toString(16)}:${i.toString(16)}::${(i & 0xfff).toString(16)}/128`;
  }
}

function* v4Hosts(): Generator<string> {
  for (let i = 1; ; i++) {
    const h = Math.imul(i, 2654435761) >>> 0;
    yield `${(h >>> 24) & 255 || 1}.${(h >>> 16) & 255}.${(h >>> 8) & 255}.${h & 255}/32`;
  }
}

const MB = 1 << 20;

/** n excepts, or as many as keep the policy under `bytes` of JSON. */
function excepts(gen: Generator<string>, fixed: string[], n: number, bytes = Infinity): string[] {
  const out = [...fixed];
  let size = JSON.stringify(out).length + 200;
  while (out.length < n) {
    const e = gen.next().value as string;
    size += e.length + 3;
    if (size > bytes) break;
    out.push(e);
  }
  return out;
}

/** The issue's shape: every pod of alpha gets ingress only from this one block. */
const huge = (cidr: string, except: string[]) => np('alpha', 'huge', { podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: [{ ipBlock: { cidr, except } }] }] });

/** b1's and the external host's IPv6 addresses: excepted, so they stay out. */
const B1_V6 = 'fd00:10:244:1::21/128';
const EXTERNAL_V6 = 'fd00:172:31::200/128';
const isolatedButV6 = (...excepted: string[]) => and(v(6), not(from(...excepted)));
const web80 = np('alpha', 'web-80', { podSelector: WEB, ingress: [{ ports: [{ port: 80 }] }] });

export const LARGE_IPBLOCK_SCENARIOS: readonly Scenario[] = (() => {
  const except400k = excepts(v6Hosts(), [B1_V6, EXTERNAL_V6], 15_002);
  const within = huge('::/0', excepts(v6Hosts(), [EXTERNAL_V6, B1_V6], Infinity, MB));
  const over = huge('0.0.0.0/0', excepts(v4Hosts(), [], Infinity, MB));
  const betaDeny = np('beta', 'deny', { podSelector: {} });
  return [
    {
      name: '::/0 except 15,000 scattered /128s (400 KB): alpha stays isolated on IPv4 and IPv6, and later changes apply',
      steps: [
        { what: 'huge policy', policies: [huge('::/0', except400k)], expect: ingress({ [A1]: isolatedButV6(B1, EXTERNAL), [A2]: isolatedButV6(B1, EXTERNAL) }) },
        // A small change to another policy still applies...
        {
          what: 'beta denies all too',
          policies: [huge('::/0', except400k), betaDeny],
          expect: ingress({ [A1]: isolatedButV6(B1, EXTERNAL), [A2]: isolatedButV6(B1, EXTERNAL), [B1]: none, [B2]: none }),
        },
        // ...and so does an edit of the huge one: b1 is no longer excepted.
        {
          what: 'b1 no longer excepted',
          policies: [
            huge(
              '::/0',
              except400k.filter((e) => e !== B1_V6),
            ),
            betaDeny,
          ],
          expect: ingress({ [A1]: isolatedButV6(EXTERNAL), [A2]: isolatedButV6(EXTERNAL), [B1]: none, [B2]: none }),
        },
      ],
    },
    {
      name: 'a 1 MB policy within the limits is enforced, and the agents stay within their memory budget',
      steps: [
        { what: '1 MB policy', policies: [within], expect: ingress({ [A1]: isolatedButV6(B1, EXTERNAL), [A2]: isolatedButV6(B1, EXTERNAL) }) },
        { what: 'plus a small policy', policies: [within, web80], expect: ingress({ [A1]: (x) => isolatedButV6(B1, EXTERNAL)(x) || tcp(80)(x), [A2]: isolatedButV6(B1, EXTERNAL) }) },
      ],
    },
    {
      name: 'a 1 MB policy over the limits is rejected with its reason and fails closed; later changes apply',
      steps: [
        // Invalid: it allows nothing, and alpha's pods stay isolated for ingress in both families.
        { what: 'rejected policy', policies: [over], expect: ingress({ [A1]: none, [A2]: none }) },
        { what: 'plus a small valid policy', policies: [over, web80], expect: ingress({ [A1]: tcp(80), [A2]: none }) },
        { what: 'the large one deleted', policies: [web80], expect: ingress({ [A1]: tcp(80) }) },
      ],
    },
  ];
})();

// ---- manifest-faults.test.ts ------------------------------------------------------------------

/** A raw NetworkPolicy manifest: `metadata` and `apiVersion` lines are written as given. */
function rawPolicy(apiVersion: string, metadata: string[], spec: string[]): string {
  return [`apiVersion: ${apiVersion}`, 'kind: NetworkPolicy', 'metadata:', ...metadata.map((l) => `  ${l}`), 'spec:', ...spec.map((l) => `  ${l}`), ''].join('\n');
}
const RAW = '40-raw.yaml';

export const MANIFEST_FAULT_SCENARIOS: readonly Scenario[] = [
  {
    name: 'a policy with a label written as an unquoted number isolates its pods both ways and allows nothing; quoting it applies its rules',
    steps: (() => {
      const spec = [
        'podSelector: {matchLabels: {app: db}}',
        'policyTypes: [Ingress, Egress]',
        'ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]',
        'egress: [{to: [{namespaceSelector: {}}]}]',
      ];
      const policy = (version: string) => rawPolicy('networking.k8s.io/v1', ['name: db', 'namespace: alpha', 'labels:', `  version: ${version}`], spec);
      return [
        { what: 'label version: 2', files: { [RAW]: policy('2') }, expect: (x: Cell) => self(x) || (x.source !== A2 && x.target !== A2) },
        // Egress to every pod of every namespace: all the targets the matrix probes.
        { what: 'label version: "2"', files: { [RAW]: policy('"2"') }, expect: ingress({ [A2]: from(A1) }) },
      ];
    })(),
  },
  {
    name: 'a NetworkPolicy of apiVersion networking.k8s.io/v2 or v1beta1 isolates its pods and allows nothing; v1 applies its rules',
    steps: (() => {
      const spec = ['podSelector: {matchLabels: {app: web}}', 'ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}}]}]'];
      const file = (version: string) => ({ [RAW]: rawPolicy(`networking.k8s.io/${version}`, ['name: web', 'namespace: beta'], spec) });
      return [
        { what: 'v2', files: file('v2'), expect: ingress({ [B1]: none }) },
        { what: 'v1beta1', files: file('v1beta1'), expect: ingress({ [B1]: none }) },
        { what: 'v1', files: file('v1'), expect: ingress({ [B1]: from(A1, A2) }) },
      ];
    })(),
  },
  {
    name: 'a policy whose namespace cannot be read isolates what it selects in every namespace; a readable one only in its own',
    steps: (() => {
      const spec = ['podSelector: {matchLabels: {app: web}}', 'ingress: [{from: [{podSelector: {}}]}]'];
      return [
        { what: 'namespace: [alpha]', files: { [RAW]: rawPolicy('networking.k8s.io/v1', ['name: web', 'namespace: [alpha]'], spec) }, expect: ingress({ [A1]: none, [B1]: none, [G1]: none }) },
        { what: 'namespace: alpha', files: { [RAW]: rawPolicy('networking.k8s.io/v1', ['name: web', 'namespace: alpha'], spec) }, expect: ingress({ [A1]: from(A2) }) },
      ];
    })(),
  },
  {
    name: 'the pods of a Namespace whose labels cannot be read gain nothing through selectors, and stay isolated',
    steps: (() => {
      const readable = ingress({ [A2]: from(B1, B2, G1), [B1]: from(B2) });
      // A later file redefines beta with a label that is a number: that definition wins.
      const nsFile = '50-namespace.yaml';
      return [
        {
          what: 'beta readable',
          policies: [
            // team NotIn [a]: beta (team b) and gamma (no team) match while their labels are known.
            np('alpha', 'not-team-a', { podSelector: DB, ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'NotIn', values: ['a'] }] } }] }] }),
            np('beta', 'same-namespace', { podSelector: WEB, ingress: [{ from: [{ podSelector: {} }] }] }),
          ],
          expect: readable,
        },
        {
          what: 'beta unreadable',
          files: { [nsFile]: ['apiVersion: v1', 'kind: Namespace', 'metadata:', '  name: beta', '  labels:', '    team: 7', ''].join('\n') },
          expect: ingress({ [A2]: from(G1), [B1]: none }),
        },
        { what: 'beta readable again', files: { [nsFile]: null }, expect: readable },
      ];
    })(),
  },
];

export const EXPLAIN_SCENARIOS: readonly Scenario[] = [
  ...CLUSTER_NETWORK_POLICY_SCENARIOS,
  ...ISOLATION_PEERS_SCENARIOS,
  ...PORT_SCENARIOS,
  ...IPBLOCK_SCENARIOS,
  ...INVALID_POLICY_SCENARIOS,
  ...HOST_NETWORK_SCENARIOS,
  ...ALLOW_ACTION_SCENARIOS,
  ...SMOKE_SCENARIOS,
  ...FAIL_CLOSED_SCENARIOS,
  ...LARGE_IPBLOCK_SCENARIOS,
  ...MANIFEST_FAULT_SCENARIOS,
];

/** The scenario of that name (a test reads its tables by the name it carries). */
export function scenario(name: string): Scenario {
  const s = EXPLAIN_SCENARIOS.find((x) => x.name === name);
  if (!s) throw new Error(`no scenario named "${name}" in explain-scenarios.ts`);
  return s;
}

/** Sets a step's state on the conformance cluster, and waits until every agent holds it. */
export async function applyStep(c: Conformance, step: Step): Promise<void> {
  for (const p of step.unknownPods ?? []) await c.cluster.addPod({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips });
  for (const key of step.removePods ?? []) await c.removePod(key);
  for (const pod of step.addPods ?? []) await c.addPod({ ...pod, labels: { ...pod.labels } });
  for (const [key, labels] of Object.entries(step.podLabels ?? {})) await c.setPodLabels(key, labels);
  for (const [ns, labels] of Object.entries(step.namespaceLabels ?? {})) await c.setNamespaceLabels(ns, labels);
  for (const [key, phase] of Object.entries(step.podPhases ?? {})) await c.setPodPhase(key, phase);
  for (const [name, content] of Object.entries(step.files ?? {})) await (content === null ? c.removeRaw(name) : c.writeRaw(name, content));
  for (const [key, on] of Object.entries(step.hostNetwork ?? {})) {
    const pod = c.pods.get(key);
    if (!pod) throw new Error(`${step.what}: no pod ${key} to set hostNetwork on`);
    pod.hostNetwork = on;
    await c.writeManifests();
  }
  if (step.policies) await c.setPolicies(...step.policies);
}

/** Probes a step's tables with real packets (each through `beside`: what the packets meet
 *  besides Weir), throwing with every cell that differs; the matrices probed. */
export async function probeStep(c: Conformance, step: Step, beside: (v: Verdict) => Verdict = (v) => v): Promise<Matrix[]> {
  const probed: Matrix[] = [];
  if (step.expect) probed.push(await c.expect(beside(step.expect), step.what));
  if (step.toExternal) probed.push(await c.expectToExternal(beside(step.toExternal), step.what));
  if (probed.length === 0) throw new Error(`${step.what}: the step states no table`);
  return probed;
}

/** Takes away what a scenario put beside the harness's own state, which reset() keeps: pods
 *  behind the manifests' back, raw manifest files. */
export async function cleanUp(c: Conformance, s: Scenario): Promise<void> {
  for (const p of s.steps.flatMap((step) => step.unknownPods ?? [])) {
    const key = `${p.namespace}/${p.name}`;
    if (c.cluster.endpoint(key)) await c.cluster.removePod(key);
  }
  for (const name of new Set(s.steps.flatMap((step) => Object.keys(step.files ?? {})))) await c.removeRaw(name);
}

/** A scenario from the fixed cast with no policy: each step set, then probed. */
export async function playScenario(c: Conformance, s: Scenario): Promise<void> {
  await c.reset();
  try {
    for (const step of s.steps) {
      await applyStep(c, step);
      await probeStep(c, step);
    }
  } finally {
    await cleanUp(c, s);
  }
}

/** What explain is given for a scenario: the agents' flags, read as the agent reads them. */
export function explainConfigOf(s: Scenario): ExplainConfig {
  return explainConfig(toConfig(parse(['agent', ...(s.agentArgs ?? [])], {}).values, { nodeName: false, manifestsDir: false }));
}

/** The address the probes of a cell use for an end (the external host's too). */
export function cellAddress(ipsOf: (key: string) => readonly string[], key: string, family: 4 | 6): string {
  if (key === EXTERNAL) return underlayIp(family, EXTERNAL_HOST);
  const ip = ipsOf(key).find((a) => familyOf(a) === family);
  if (ip === undefined) throw new Error(`${key} has no IPv${family} address, yet a cell names it`);
  return ip;
}

/** What explain says of a cell's packet, named by its addresses as the probe sends it, with
 *  every disagreement between the chains and the policies it saw on the way; a refusal to
 *  answer (no verdict) is one too: every cell the harness probes has an answer. */
export function explainCell(ex: (req: ExplainRequest) => Explanation, ipsOf: (key: string) => readonly string[], cell: Cell): { allowed: boolean | undefined; why: string; disagreements: string[] } {
  let x: Explanation;
  try {
    x = ex({
      source: cellAddress(ipsOf, cell.source, cell.family),
      destination: cellAddress(ipsOf, cell.target, cell.family),
      protocol: cell.proto === 'tcp' ? 'TCP' : 'UDP',
      port: cell.port,
      family: cell.family,
    });
  } catch (err) {
    if (!(err instanceof ExplainInputError)) throw err;
    return { allowed: undefined, why: `refused: ${err.message}`, disagreements: [`explain refused it: ${err.message}`] };
  }
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
