// Conformance: ClusterNetworkPolicy tiers (policy.networking.k8s.io/v1beta1) with and against
// NetworkPolicies, proved with real packets in both families. Each predicate is written by
// hand from the API's evaluation order: Admin tier by priority (first match decides; Pass
// leaves the tier), then NetworkPolicy, then the Baseline tier (only for pods no
// NetworkPolicy isolates), then allow.

import { after, before, describe, test } from 'node:test';
import { A1, A2, B1, B2, Conformance, cnp, EXTERNAL, G1, np } from './harness.ts';
import { and, egress, from, ingress, not, or, tcp, type Verdict } from './predicates.ts';

const ALPHA = { matchLabels: { team: 'a' } };
const BETA = { matchLabels: { team: 'b' } };
const GAMMA = { matchExpressions: [{ key: 'kubernetes.io/metadata.name', operator: 'In', values: ['gamma'] }] };
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
});
