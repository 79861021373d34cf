// Conformance: isolation, policyTypes defaulting, rule matching, peers (OR/AND), label
// selectors and run-time changes, proved with real packets over the full truth table.
// Every predicate is written by hand from design/semantics.md; the tables that explain-scenarios.ts
// holds (where weir explain is checked over them too) are played from there.

import { after, before, describe, test } from 'node:test';
import { playScenario, scenario } from './explain-scenarios.ts';
import { A1, A2, B1, B2, Conformance, G1, np, type PodDef } from './harness.ts';
import { allow, always, from, fromAnyPod, fromNs, nothing, toNs } from './predicates.ts';

const WEB = { matchLabels: { app: 'web' } };
const DB = { matchLabels: { app: 'db' } };
const TEAM_A = { matchLabels: { team: 'a' } };
const TEAM_B = { matchLabels: { team: 'b' } };

const podDef = (key: string, node: PodDef['node'], ips: string[], labels: Record<string, string>): PodDef => {
  const [namespace, name] = key.split('/');
  return { namespace, name, node, ips, labels, ports: [] };
};
const A3 = 'alpha/a3',
  G2 = 'gamma/g2';
const NEW_A_IPS = ['10.244.1.50', 'fd00:10:244:1::50'];

describe('conformance: isolation, policyTypes, rules, peers, selectors, run-time changes', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wcisp');
  });
  after(async () => {
    await c?.stop();
  });
  /** A test whose table is explain-scenarios.ts's scenario of the same name. */
  const played = (name: string) => test(name, () => playScenario(c, scenario(name)));

  describe('isolation', () => {
    test('a pod selected by no policy accepts everything and sends everywhere, the external host included', () =>
      playScenario(c, scenario('a pod selected by no policy accepts everything and sends everywhere')));

    test('ingress isolation comes only from a policy in the pod own namespace, not from a matching podSelector elsewhere', async () => {
      await c.reset();
      // app=web also matches alpha/a1 and gamma/g1, but the policy lives in beta.
      await c.setPolicies(np('beta', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [B1]: nothing } }), 'beta policy isolates b1 only');
      await c.setPolicies(np('beta', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] }), np('gamma', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [B1]: nothing, [G1]: nothing } }), 'a gamma policy now isolates g1 as well');
    });

    test('egress isolation comes only from a policy in the pod own namespace with Egress in its types', async () => {
      await c.reset();
      await c.setPolicies(
        np('alpha', 'web-no-egress', { podSelector: WEB, policyTypes: ['Egress'] }),
        // app=db matches alpha/a2 and beta/b2, but gamma has no such pod: it isolates nobody.
        np('gamma', 'db-no-egress', { podSelector: DB, policyTypes: ['Egress'] }),
      );
      await c.expect(allow({ egress: { [A1]: nothing } }), 'only a1 is egress-isolated');
    });

    test('a pod isolated by several policies accepts the union of what each allows, and loses a source when its policy goes', async () => {
      await c.reset();
      const fromDb = np('alpha', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] });
      const fromBetaWeb = np('alpha', 'from-beta-web', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_B, podSelector: WEB }] }] });
      await c.setPolicies(fromDb, fromBetaWeb);
      await c.expect(allow({ ingress: { [A1]: from(A2, B1) } }), 'a2 (cross-node) and b1 (same node) both allowed');
      await c.setPolicies(fromBetaWeb);
      await c.expect(allow({ ingress: { [A1]: from(B1) } }), 'after deleting from-db only b1 remains');
    });

    played('a connection needs the source egress and the destination ingress to allow it, same-node and cross-node');

    test('replies of allowed TCP and UDP connections pass although the reverse direction is denied', async () => {
      await c.reset();
      await c.setPolicies(
        np('alpha', 'a1-in', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }, { namespaceSelector: TEAM_B, podSelector: WEB }] }] }),
        np('alpha', 'a2-deny-in', { podSelector: DB, policyTypes: ['Ingress'] }),
        np('beta', 'b1-deny-in', { podSelector: WEB, ingress: [] }),
        np('gamma', 'g1-deny-out', { podSelector: {}, policyTypes: ['Egress'] }),
      );
      // b1 -> a1 and a2 -> a1 need a1's replies to enter b1 / a2, which deny all ingress;
      // a1, b1, external -> g1 need g1's replies to leave g1, which denies all egress.
      await c.expect(allow({ ingress: { [A1]: from(A2, B1), [A2]: nothing, [B1]: nothing }, egress: { [G1]: nothing } }), 'replies pass, reverse direction dropped');
    });

    played('a pod always reaches itself, even when every pod denies all ingress and all egress');
  });

  describe('policyTypes defaulting', () => {
    played('given policyTypes are authoritative: rules of a direction not listed isolate nothing');

    played('without policyTypes an egress rule isolates egress, and ingress [{}] allows every source');

    test('without policyTypes Ingress is always implied, and egress [] does not isolate egress', async () => {
      await c.reset();
      await c.setPolicies(np('beta', 'no-rules', { podSelector: {}, egress: [] }));
      await c.expect(allow({ ingress: { [B1]: nothing, [B2]: nothing } }), 'beta ingress denied, egress free');
      await c.expectToExternal(always, 'egress [] isolates nothing');

      await c.setPolicies(np('beta', 'no-rules', { podSelector: {}, egress: [{ to: [{ namespaceSelector: TEAM_A }] }] }));
      await c.expect(
        allow({ ingress: { [B1]: nothing, [B2]: nothing }, egress: { [B1]: toNs('alpha'), [B2]: toNs('alpha') } }),
        'only an egress rule given: ingress still denied, egress to alpha only',
      );
    });

    test('policyTypes [Egress] with no egress rules denies all egress, to the external host too', async () => {
      await c.reset();
      await c.setPolicies(np('beta', 'web-no-egress', { podSelector: WEB, policyTypes: ['Egress'] }));
      await c.expect(allow({ egress: { [B1]: nothing } }), 'b1 sends nothing, still accepts everything');
      await c.expectToExternal((x) => x.source !== B1, 'b1 cannot reach the external host');
    });

    test('Ingress type with ingress missing or [] denies all ingress; ingress [{}] allows all', async () => {
      await c.reset();
      await c.setPolicies(np('gamma', 'in', { podSelector: {}, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [G1]: nothing } }), 'ingress missing');
      await c.setPolicies(np('gamma', 'in', { podSelector: {}, policyTypes: ['Ingress'], ingress: [] }));
      await c.expect(allow({ ingress: { [G1]: nothing } }), 'ingress []');
      await c.setPolicies(np('gamma', 'in', { podSelector: {}, policyTypes: ['Ingress'], ingress: [{}] }));
      await c.expect(always, 'ingress [{}] allows every source, the external host included');
    });
  });

  describe('rules', () => {
    played('a rule allows only traffic matching one of its peers and one of its ports');

    played('a rule with missing or empty from/to matches every address, the external host included');

    test('a rule with missing or empty ports matches every port of every protocol', async () => {
      await c.reset();
      await c.setPolicies(
        np('alpha', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] }),
        np('beta', 'db-to-alpha', { podSelector: DB, egress: [{ to: [{ namespaceSelector: TEAM_A }], ports: [] }] }),
      );
      await c.expect(allow({ ingress: { [A1]: from(A2), [B2]: nothing }, egress: { [B2]: toNs('alpha') } }), 'a2 -> a1 and b2 -> a2 on tcp/udp 80/81');
    });
  });

  describe('peers', () => {
    played('separate peer items are OR while selectors in one item are AND');

    test('a podSelector alone selects pods of the policy namespace only', async () => {
      await c.reset();
      await c.setPolicies(
        np('beta', 'from-db', { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] }),
        np('alpha', 'from-own-ns', { podSelector: DB, ingress: [{ from: [{ podSelector: {} }] }] }),
      );
      // alpha/a2 is app=db too, but not in beta; gamma/g1 and beta pods are not in alpha.
      await c.expect(allow({ ingress: { [B1]: from(B2), [A2]: from(A1) } }), 'own namespace only');
    });

    test('a namespaceSelector alone selects every pod of matching namespaces; {} matches every pod but not the external host', async () => {
      await c.reset();
      await c.setPolicies(
        np('beta', 'from-team-a', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] }),
        np('gamma', 'from-all-pods', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {} }] }] }),
        np('beta', 'db-from-web-anywhere', { podSelector: DB, ingress: [{ from: [{ namespaceSelector: {}, podSelector: WEB }] }] }),
      );
      await c.expect(allow({ ingress: { [B1]: fromNs('alpha'), [G1]: fromAnyPod, [B2]: from(A1, B1, G1) } }), 'namespace-wide peers');
    });
  });

  describe('label selectors', () => {
    played('matchLabels and matchExpressions must all hold, and pod label changes move pods in and out of the peer set');

    played('In and NotIn select namespaces, NotIn holding when the label is absent');

    test('Exists and DoesNotExist select by key presence, DoesNotExist holding when the label is absent', async () => {
      await c.reset();
      await c.setPolicies(
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
      );
      await c.expect(allow({ ingress: { [A1]: fromNs('gamma'), [B1]: fromNs('alpha', 'beta') } }), 'no pod has a role label');
      await c.setPodLabels(A2, { app: 'db', role: 'x' });
      await c.expect(allow({ ingress: { [A1]: fromNs('gamma'), [B1]: from(A1, B2) } }), 'a2 gains a role label');
    });

    test('a NotIn target selector selects pods lacking the label, so removing a label can isolate a pod', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'isolate-non-web', { podSelector: { matchExpressions: [{ key: 'app', operator: 'NotIn', values: ['web'] }] }, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [A2]: nothing } }), 'a2 (app=db) isolated, a1 (app=web) not');
      await c.setPodLabels(A1, {});
      await c.expect(allow({ ingress: { [A1]: nothing, [A2]: nothing } }), 'a1 without app label now isolated');
    });
  });

  describe('run-time changes', () => {
    test('namespace label changes move all its pods in and out of peer sets', async () => {
      await c.reset();
      await c.setPolicies(np('beta', 'from-team-a', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] }));
      await c.expect(allow({ ingress: { [B1]: fromNs('alpha'), [B2]: fromNs('alpha') } }), 'alpha is team=a');
      await c.setNamespaceLabels('gamma', { team: 'a' });
      await c.expect(allow({ ingress: { [B1]: fromNs('alpha', 'gamma'), [B2]: fromNs('alpha', 'gamma') } }), 'gamma joins');
      await c.setNamespaceLabels('alpha', {});
      await c.expect(allow({ ingress: { [B1]: fromNs('gamma'), [B2]: fromNs('gamma') } }), 'alpha leaves');
    });

    test('a peer set made again after a namespace relabel holds the pods the namespace selects now', async () => {
      await c.reset();
      const fromTeamA = np('beta', 'from-team-a', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: TEAM_A }] }] });
      await c.setPolicies(fromTeamA);
      await c.expect(allow({ ingress: { [B1]: fromNs('alpha'), [B2]: fromNs('alpha') } }), 'alpha is team=a');
      // The set goes with its only policy; the namespace changes while no set follows it.
      await c.setPolicies();
      await c.setNamespaceLabels('gamma', { team: 'a' });
      await c.setPolicies(fromTeamA);
      await c.expect(allow({ ingress: { [B1]: fromNs('alpha', 'gamma'), [B2]: fromNs('alpha', 'gamma') } }), 'the policy back after gamma joined');
    });

    test('pod label changes move pods in and out of a policy target selection', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'deny-web', { podSelector: WEB, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [A1]: nothing } }), 'a1 isolated');
      await c.setPodLabels(A2, { app: 'web' });
      await c.expect(allow({ ingress: { [A1]: nothing, [A2]: nothing } }), 'a2 relabelled web: isolated too');
      await c.setPodLabels(A1, { app: 'other' });
      await c.expect(allow({ ingress: { [A2]: nothing } }), 'a1 relabelled: isolation gone');
    });

    played('a new pod is at once in the peer sets and isolated as its labels say, on either node');

    test('a pod that goes away leaves the peer sets, and a new pod reusing its IPs gets only its own allowances', async () => {
      await c.reset();
      await c.setPolicies(np('beta', 'web-from-alpha-db', { podSelector: WEB, ingress: [{ from: [{ namespaceSelector: TEAM_A, podSelector: DB }] }] }));
      await c.addPod(podDef(A3, 'node-a', NEW_A_IPS, { app: 'db' }));
      await c.expect(allow({ ingress: { [B1]: from(A2, A3) } }), 'a3 allowed to b1');
      await c.removePod(A3);
      await c.expect(allow({ ingress: { [B1]: from(A2) } }), 'a3 gone');
      await c.addPod(podDef(G2, 'node-a', NEW_A_IPS, { app: 'db' }));
      await c.expect(allow({ ingress: { [B1]: from(A2) } }), 'gamma/g2 on a3 old IPs is not allowed to b1');
    });

    played('a Pending or Succeeded pod is in no peer set, and rejoins when Running again');

    test('updating a policy target selector re-isolates pods, and deleting the last policy restores default allow', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'deny', { podSelector: {}, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [A1]: nothing, [A2]: nothing } }), 'all alpha pods isolated');
      await c.setPolicies(np('alpha', 'deny', { podSelector: DB, policyTypes: ['Ingress'] }));
      await c.expect(allow({ ingress: { [A2]: nothing } }), 'selector narrowed to app=db');
      await c.setPolicies();
      await c.expect(always, 'policy deleted');
    });
  });
});
