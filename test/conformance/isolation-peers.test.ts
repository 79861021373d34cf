// Conformance: isolation, policyTypes defaulting, rule matching, peers (OR/AND), label
// selectors and run-time changes, proved with real packets over the full truth table.
// Every predicate is written by hand from design/semantics.md. The tables are played from
// explain-scenarios.ts, where weir explain is checked over them too, but for the two tests of
// connection tracking (replies, a pod's addresses reused), which explain does not model.

import { after, before, describe, test } from 'node:test';
import { playScenario, scenario } from './explain-scenarios.ts';
import { A1, A2, B1, Conformance, G1, np, type PodDef } from './harness.ts';
import { allow, from, nothing } from './predicates.ts';

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

    played('ingress isolation comes only from a policy in the pod own namespace, not from a matching podSelector elsewhere');

    played('egress isolation comes only from a policy in the pod own namespace with Egress in its types');

    played('a pod isolated by several policies accepts the union of what each allows, and loses a source when its policy goes');

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

    played('without policyTypes Ingress is always implied, and egress [] does not isolate egress');

    played('policyTypes [Egress] with no egress rules denies all egress, to the external host too');

    played('Ingress type with ingress missing or [] denies all ingress; ingress [{}] allows all');
  });

  describe('rules', () => {
    played('a rule allows only traffic matching one of its peers and one of its ports');

    played('a rule with missing or empty from/to matches every address, the external host included');

    played('a rule with missing or empty ports matches every port of every protocol');
  });

  describe('peers', () => {
    played('separate peer items are OR while selectors in one item are AND');

    played('a podSelector alone selects pods of the policy namespace only');

    played('a namespaceSelector alone selects every pod of matching namespaces; {} matches every pod but not the external host');
  });

  describe('label selectors', () => {
    played('matchLabels and matchExpressions must all hold, and pod label changes move pods in and out of the peer set');

    played('In and NotIn select namespaces, NotIn holding when the label is absent');

    played('Exists and DoesNotExist select by key presence, DoesNotExist holding when the label is absent');

    played('a NotIn target selector selects pods lacking the label, so removing a label can isolate a pod');
  });

  describe('run-time changes', () => {
    played('namespace label changes move all its pods in and out of peer sets');

    played('a peer set made again after a namespace relabel holds the pods the namespace selects now');

    played('pod label changes move pods in and out of a policy target selection');

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

    played('updating a policy target selector re-isolates pods, and deleting the last policy restores default allow');
  });
});
