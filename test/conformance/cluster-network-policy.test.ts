// Conformance: ClusterNetworkPolicy tiers (policy.networking.k8s.io/v1beta1) with and against
// NetworkPolicies, proved with real packets in both families. Each predicate is written by
// hand from the API's evaluation order: Admin tier by priority (first match decides; Pass
// leaves the tier), then NetworkPolicy, then the Baseline tier (only for pods no
// NetworkPolicy isolates), then allow; its protocols (port numbers, ranges, named ports); and
// from docs/behaviour.md for what the API leaves open (an invalid policy fails closed).

import { after, before, describe, test } from 'node:test';
import { A1, A2, B1, B2, Conformance, cnp, EXTERNAL, G1, np } from './harness.ts';
import { allow, and, egress, from, fromAnyPod, fromNs, ingress, none, not, or, self, tcp, to, toNs, udp, type Verdict } from './predicates.ts';

const ALPHA = { matchLabels: { team: 'a' } };
const BETA = { matchLabels: { team: 'b' } };
const GAMMA = { matchExpressions: [{ key: 'kubernetes.io/metadata.name', operator: 'In', values: ['gamma'] }] };
const WEB = { matchLabels: { app: 'web' } };
// The cast's named ports, copied from the harness header: http is TCP everywhere (80, but 81 on
// a2), b1 declares none, and g1's dns is UDP 81.
const HTTP: Readonly<Record<string, number>> = { [A1]: 80, [A2]: 81, [B2]: 80, [G1]: 80 };
const toHttp: Verdict = (x) => x.target in HTTP && tcp(HTTP[x.target])(x);
// node-b's pod CIDRs: a2 (both families) and b2 (IPv4).
const NODE_B = ['10.244.2.0/24', 'fd00:10:244:2::/64'];
const allPods = (...keys: string[]) => [A1, A2, B1, B2, G1].filter((k) => !keys.includes(k));
const onlyFrom =
  (...sources: string[]): Verdict =>
  (x) =>
    sources.includes(x.source);

describe('conformance: ClusterNetworkPolicy tiers', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wcnp');
  });
  after(async () => {
    await c?.stop();
  });

  test('an Admin Deny holds over a NetworkPolicy that allows everything', async () => {
    await c.reset();
    await c.setPolicies(
      np('alpha', 'allow-all', { podSelector: {}, ingress: [{}] }),
      cnp('deny-beta-to-alpha-web', {
        tier: 'Admin',
        priority: 10,
        subject: { pods: { namespaceSelector: ALPHA, podSelector: { matchLabels: { app: 'web' } } } },
        ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }],
      }),
    );
    await c.expect(ingress({ [A1]: not(from(B1, B2)) }));
  });

  test('an Admin Accept holds over a NetworkPolicy that denies everything', async () => {
    await c.reset();
    await c.setPolicies(
      np('alpha', 'deny-all', { podSelector: {}, policyTypes: ['Ingress'] }),
      cnp('gamma-to-alpha', { tier: 'Admin', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: GAMMA }] }] }),
    );
    await c.expect(ingress({ [A1]: from(G1), [A2]: from(G1) }));
  });

  test('Pass leaves the Admin tier: NetworkPolicy decides for a pod it isolates, the Baseline tier for one it does not', async () => {
    await c.reset();
    await c.setPolicies(
      cnp('pass-beta', { tier: 'Admin', priority: 1, subject: { namespaces: ALPHA }, ingress: [{ action: 'Pass', from: [{ namespaces: BETA }] }] }),
      cnp('deny-pods', { tier: 'Admin', priority: 2, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
      np('alpha', 'a1-from-b1', {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [{ from: [{ namespaceSelector: BETA, podSelector: { matchLabels: { app: 'web' } } }] }],
      }),
      cnp('baseline-deny-beta', { tier: 'Baseline', priority: 1, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }] }),
    );
    // a1: beta passes to its NetworkPolicy (b1 only); every other pod is denied by the Admin
    // tier, and the external host, which no Admin rule names, by the NetworkPolicy's isolation.
    // a2: beta passes, no NetworkPolicy selects a2, so the Baseline denies it; other pods are
    // denied by the Admin tier; the external host falls through to the default allow.
    await c.expect(ingress({ [A1]: from(B1), [A2]: from(EXTERNAL) }));
  });

  test('a NetworkPolicy that isolates a pod overrides a Baseline Deny; other pods keep it', async () => {
    await c.reset();
    await c.setPolicies(
      cnp('baseline-deny-pods', { tier: 'Baseline', priority: 5, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
      np('beta', 'b1-from-alpha', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: ALPHA }] }] }),
    );
    const rules: Record<string, Verdict> = { [B1]: from(A1, A2) };
    for (const k of allPods(B1)) rules[k] = onlyFrom(EXTERNAL);
    await c.expect(ingress(rules));
  });

  test('networks egress: overlapping CIDRs decide by priority, a narrower Deny inside a wider Accept', async () => {
    await c.reset();
    await c.setPolicies(
      cnp('a1-not-node-b', {
        tier: 'Admin',
        priority: 1,
        subject: { pods: { namespaceSelector: ALPHA, podSelector: { matchLabels: { app: 'web' } } } },
        egress: [
          { action: 'Accept', to: [{ networks: ['10.244.2.12/32', 'fd00:10:244:2::12/128'] }], protocols: [{ tcp: { destinationPort: { number: 80 } } }] },
          { action: 'Deny', to: [{ networks: ['10.244.2.0/24', 'fd00:10:244:2::/64'] }] },
        ],
      }),
      cnp('a1-cluster', {
        tier: 'Admin',
        priority: 2,
        subject: { pods: { namespaceSelector: ALPHA, podSelector: { matchLabels: { app: 'web' } } } },
        egress: [{ action: 'Accept', to: [{ networks: ['10.244.0.0/16', 'fd00:10:244::/48'] }] }],
      }),
      np('alpha', 'a1-egress-nothing', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'] }),
    );
    // node-b's pods (a2, b2): only a2 on TCP 80; node-a's pods: every one (the wider Accept);
    // the external host: no rule names it, so the NetworkPolicy's isolation drops it.
    const nodeB = (x: { target: string }) => x.target === A2 || x.target === B2;
    await c.expect(
      egress(
        A1,
        or(
          and(from(A1), (x) => x.target === A2, tcp(80)),
          (x) => !nodeB(x) && x.target !== EXTERNAL,
        ),
      ),
    );
    await c.expectToExternal(egress(A1, () => false));
  });

  test('a priority change applies live: the Accept moved before the Deny wins', async () => {
    await c.reset();
    const rules = (acceptPriority: number) => [
      np('alpha', 'a1-isolated', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Ingress'] }),
      cnp('deny-beta', { tier: 'Admin', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }] }),
      cnp('accept-beta', { tier: 'Admin', priority: acceptPriority, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: BETA }] }] }),
    ];
    await c.setPolicies(...rules(20));
    await c.expect(ingress({ [A1]: () => false, [A2]: not(from(B1, B2)) }), 'Deny first');
    await c.setPolicies(...rules(5));
    await c.expect(ingress({ [A1]: from(B1, B2) }), 'Accept first');
  });

  // destinationNamedPort is in the experimental channel only (the standard v1beta1 CRD prunes
  // it); Weir reads it from manifests and the experimental CRD, so it is proved here.
  test('a named port Deny drops the port of that name on each pod that declares it, whatever its number or protocol; pods without the name are not matched', async () => {
    await c.reset();
    const denyNamed = (name: string) =>
      cnp(`deny-${name}`, { tier: 'Admin', priority: 10, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }], protocols: [{ destinationNamedPort: name }] }] });
    // The external host is no pod, so no namespaces peer names it.
    await c.setPolicies(denyNamed('http'));
    await c.expect((x) => self(x) || !(fromAnyPod(x) && toHttp(x)), 'ingress to http');
    // The API names no protocol for a named port: it is the container port's own, UDP for dns.
    await c.setPolicies(denyNamed('dns'));
    await c.expect((x) => self(x) || !(fromAnyPod(x) && x.target === G1 && udp(81)(x)), 'ingress to dns');
    // In egress the name is resolved on each destination pod.
    await c.setPolicies(
      cnp('a1-no-http-out', {
        tier: 'Admin',
        priority: 10,
        subject: { pods: { namespaceSelector: ALPHA, podSelector: WEB } },
        egress: [{ action: 'Deny', to: [{ namespaces: {} }], protocols: [{ destinationNamedPort: 'http' }] }],
      }),
    );
    await c.expect(egress(A1, not(toHttp)), 'egress to http');
  });

  test('a Baseline Accept holds over a later Baseline Deny for pods no NetworkPolicy isolates; one that isolates a pod makes the Baseline irrelevant to it', async () => {
    await c.reset();
    // Named so that name order would put the Deny first: only the priority may decide.
    const baseline = [
      cnp('b-accept-beta', { tier: 'Baseline', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: BETA }] }] }),
      cnp('a-deny-pods', { tier: 'Baseline', priority: 20, subject: { namespaces: ALPHA }, ingress: [{ action: 'Deny', from: [{ namespaces: {} }] }] }),
    ];
    // Beta is accepted, other pods denied; the external host, which no rule names, allowed.
    const betaOrOutside = or(fromNs('beta'), not(fromAnyPod));
    await c.setPolicies(...baseline);
    await c.expect(ingress({ [A1]: betaOrOutside, [A2]: betaOrOutside }), 'no NetworkPolicy');
    // a1 isolated for ingress: its NetworkPolicy alone decides (gamma only). a2 is selected for
    // egress only, which leaves its ingress to the Baseline; its egress [{}] allows everything.
    await c.setPolicies(
      ...baseline,
      np('alpha', 'a1-from-gamma', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: GAMMA }] }] }),
      np('alpha', 'a2-egress-open', { podSelector: { matchLabels: { app: 'db' } }, policyTypes: ['Egress'], egress: [{}] }),
    );
    await c.expect(ingress({ [A1]: from(G1), [A2]: betaOrOutside }), 'a1 isolated by a NetworkPolicy');
  });

  test('a Baseline Pass skips the rest of the Baseline tier, its own later rules included, so the default allow applies', async () => {
    await c.reset();
    await c.setPolicies(
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
    );
    // b1 (web) passes before the Deny of web pods, b2 before the later policy's Deny; a1, a2
    // and g1 are denied; the external host, which no rule names, is allowed.
    const betaOrOutside = or(fromNs('beta'), not(fromAnyPod));
    await c.expect(ingress({ [A1]: betaOrOutside, [A2]: betaOrOutside }));
  });

  test('a port range matches every port from its start to its end, in its own protocol only', async () => {
    await c.reset();
    await c.setPolicies(
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
    );
    // a1: TCP 80 and 81 and UDP 81 denied from pods, UDP 80 and the external host allowed.
    // b1: UDP 80 to node-b's pods (a2, b2) denied, UDP 81 and TCP allowed.
    await c.expect(
      allow({
        ingress: { [A1]: not(and(fromAnyPod, or(tcp(80), tcp(81), udp(81)))) },
        egress: { [B1]: not(and(to(A2, B2), udp(80))) },
      }),
    );
  });

  test('an invalid ClusterNetworkPolicy denies everything to its subjects in each direction it names, at its own tier and priority', async () => {
    await c.reset();
    const a1 = { pods: { namespaceSelector: ALPHA, podSelector: WEB } };
    const brokenAdmin = (action: string) => cnp('broken', { tier: 'Admin', priority: 20, subject: a1, ingress: [{ action, from: [{ namespaces: BETA }] }] });
    const around = [
      np('alpha', 'allow-all', { podSelector: {}, ingress: [{}] }),
      cnp('accept-gamma', { tier: 'Admin', priority: 10, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: GAMMA }] }] }),
      cnp('accept-beta', { tier: 'Admin', priority: 30, subject: { namespaces: ALPHA }, ingress: [{ action: 'Accept', from: [{ namespaces: BETA }] }] }),
    ];
    // "Allow" is no action of the API (the CRD's enum refuses it). In the Admin tier no
    // NetworkPolicy reopens it; of the Admin Accepts, the one before it (priority 10) still
    // applies, the one after it (30) no longer does. a1's egress, not named, is untouched.
    await c.setPolicies(...around, brokenAdmin('Allow'));
    await c.expect(ingress({ [A1]: from(G1) }), 'Admin, ingress, action Allow');
    await c.expectToExternal(() => true, 'Admin, ingress, action Allow');
    // Fixed, its one rule applies.
    await c.setPolicies(...around, brokenAdmin('Deny'));
    await c.expect(ingress({ [A1]: not(fromNs('beta')) }), 'Admin, ingress, action Deny');

    // A networks CIDR with host bits set (the CRD's CEL rule refuses it), in the Baseline tier
    // for egress: b1, which a NetworkPolicy isolates for egress, follows it (alpha only); b2
    // reaches nothing, the external host included; every pod's ingress is untouched.
    await c.setPolicies(
      np('beta', 'b1-to-alpha', { podSelector: WEB, policyTypes: ['Egress'], egress: [{ to: [{ namespaceSelector: ALPHA }] }] }),
      cnp('broken', { tier: 'Baseline', priority: 5, subject: { namespaces: BETA }, egress: [{ action: 'Deny', to: [{ networks: ['10.244.2.5/24'] }] }] }),
    );
    await c.expect(allow({ egress: { [B1]: toNs('alpha'), [B2]: none } }), 'Baseline, egress, host bits');
    await c.expectToExternal((x) => x.source !== B1 && x.source !== B2, 'Baseline, egress, host bits');
  });

  test('an invalid ClusterNetworkPolicy whose subject cannot be read denies to every pod; one whose spec cannot be read, in both directions', async () => {
    await c.reset();
    // A label value that is no string: the subject selects nothing readable, so every pod.
    await c.setPolicies(cnp('broken', { tier: 'Admin', priority: 5, subject: { namespaces: { matchLabels: { team: 7 } } }, ingress: [{ action: 'Deny', from: [{ namespaces: BETA }] }] }));
    await c.expect(self, 'unreadable subject, ingress');
    await c.expectToExternal(() => true, 'unreadable subject, ingress');
    await c.setPolicies(cnp('broken', 'deny everything'));
    await c.expect(self, 'unreadable spec');
    await c.expectToExternal(none, 'unreadable spec');
  });
});
