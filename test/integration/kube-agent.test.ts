// Weir against a real kube-apiserver, driven with real kubectl; assertions by real packets.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { A1, A2, B1, B2, G1 } from '../conformance/harness.ts';
import { eventually } from '../support/eventually.ts';
import { KubeIntegration, policyObject, type Cell } from './kube-harness.ts';

describe('weir agent --kubeconfig against a real API server', () => {
  let k: KubeIntegration;
  before(async () => {
    k = await KubeIntegration.start();
  });
  after(async () => {
    await k?.stop();
  });

  test('pods created through the API are policed: default allow, then a policy applied with kubectl', async () => {
    await k.expect(() => true, 'no policy');
    await k.apply(
      policyObject('alpha', 'web-from-beta', {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ port: 80 }] }],
      }),
    );
    const fromBetaOn80 = (c: Cell) => c.target !== A1 || c.source === A1 || ((c.source === B1 || c.source === B2) && c.proto === 'tcp' && c.port === 80);
    await k.expect(fromBetaOn80, 'web-from-beta');
  });

  test('a policy edited in place is enforced as edited (the API server raises its generation); a label on it changes nothing', async () => {
    const webFromBeta = (port: number) =>
      policyObject('alpha', 'web-from-beta', {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ port }] }],
      });
    const fromBetaOn = (port: number) => (c: Cell) => c.target !== A1 || c.source === A1 || ((c.source === B1 || c.source === B2) && c.proto === 'tcp' && c.port === port);
    await k.apply(webFromBeta(81));
    await k.expect(fromBetaOn(81), 'web-from-beta edited to port 81');
    const generation = async () => Number(await k.kubectl(['get', 'networkpolicy', 'web-from-beta', '-n', 'alpha', '-o', 'jsonpath={.metadata.generation}']));
    assert.equal(await generation(), 2);
    await k.kubectl(['label', 'networkpolicy', 'web-from-beta', '-n', 'alpha', 'edited=yes']);
    assert.equal(await generation(), 2, 'metadata alone keeps the generation');
    await k.expect(fromBetaOn(81), 'labelled: unchanged');
    await k.apply(webFromBeta(80));
    await k.expect(fromBetaOn(80), 'web-from-beta back on port 80');
  });

  test('kubectl label moves pods and namespaces in and out of peer sets and targets', async () => {
    // gamma joins team b: g1 (IPv6 only) may now reach a1 on 80.
    await k.kubectl(['label', 'namespace', 'gamma', 'team=b']);
    const allowed = (srcs: string[]) => (c: Cell) => c.target !== A1 || c.source === A1 || (srcs.includes(c.source) && c.proto === 'tcp' && c.port === 80);
    await k.expect(allowed([B1, B2, G1]), 'gamma labelled team=b');
    // a2 becomes a web pod of alpha: now isolated by the same policy.
    await k.kubectl(['label', 'pod', 'a2', '-n', 'alpha', 'app=web', '--overwrite']);
    const both = (c: Cell) => (c.target !== A1 && c.target !== A2) || c.source === c.target || ([B1, B2, G1].includes(c.source) && c.proto === 'tcp' && c.port === 80);
    await k.expect(both, 'a2 relabelled app=web');
    await k.kubectl(['label', 'namespace', 'gamma', 'team-']);
    await k.kubectl(['label', 'pod', 'a2', '-n', 'alpha', 'app=db', '--overwrite']);
    await k.expect(allowed([B1, B2]), 'labels restored');
  });

  test('a pod that stops running leaves its peer sets; a new pod joins them at once', async () => {
    await k.setPodStatus('beta', 'b2', 'Succeeded', ['10.244.2.22']);
    const allowed = (srcs: string[]) => (c: Cell) => c.target !== A1 || c.source === A1 || (srcs.includes(c.source) && c.proto === 'tcp' && c.port === 80);
    // A finished pod's address belongs to no pod any more: its node fails closed both ways.
    const b2Gone = (c: Cell) => c.source === c.target || (c.source !== B2 && c.target !== B2);
    await k.expect((c) => b2Gone(c) && allowed([B1])(c), 'b2 Succeeded');
    await k.setPodStatus('beta', 'b2', 'Running', ['10.244.2.22']);
    await k.expect(allowed([B1, B2]), 'b2 Running again');
  });

  test('kubectl delete of the policy restores default allow; egress deny-all holds for the external host too', async () => {
    await k.kubectl(['delete', 'networkpolicy', 'web-from-beta', '-n', 'alpha']);
    await k.expect(() => true, 'policy deleted');
    await k.apply(policyObject('beta', 'no-egress', { podSelector: {}, policyTypes: ['Egress'] }));
    await k.expect((c) => c.source === c.target || (c.source !== B1 && c.source !== B2), 'beta egress denied');
    assert.ok(
      k.agents.every((a) => a.errors.length === 0),
      k.agents.flatMap((a) => a.errors).join('\n'),
    );
    await k.kubectl(['delete', 'networkpolicy', 'no-egress', '-n', 'beta']);
    await k.expect(() => true, 'all policies deleted');
  });
});

describe('status written back to the cluster (the agents: their nodes; the controller: the policies)', () => {
  let k: KubeIntegration;
  before(async () => {
    k = await KubeIntegration.start({ controller: true });
  });
  after(async () => {
    await k?.stop();
  });

  // biome-ignore lint/suspicious/noExplicitAny: kubectl's JSON is read loosely, field by field, in assertions
  type Json = Record<string, any>;
  const getJson = async (args: string[]) => JSON.parse(await k.kubectl([...args, '-o', 'json'])) as Json;
  const cond = (obj: Json, type: string) => (obj.status?.conditions ?? []).find((c: { type: string }) => c.type === type);

  test('each node reports Ready and Programmed; a policy reports Accepted and Enforced on the nodes that run its pods', async () => {
    for (const node of ['node-a', 'node-b']) {
      const s = await eventually(
        `NodePolicyStatus ${node}`,
        () => getJson(['get', 'nodepolicystatus', node]),
        (o) => cond(o, 'Ready')?.status === 'True' && cond(o, 'Programmed')?.status === 'True',
      );
      assert.equal(s.metadata.ownerReferences[0].kind, 'Node');
      assert.equal(s.status.counts.localPods, node === 'node-a' ? 3 : 2);
    }
    await k.apply(policyObject('alpha', 'web-ingress', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: {} }] }] }));
    const np = await eventually(
      'NetworkPolicyStatus alpha/web-ingress',
      () => getJson(['get', 'networkpolicystatus', 'web-ingress', '-n', 'alpha']),
      (o) => cond(o, 'Enforced')?.status === 'True',
    );
    assert.equal(cond(np, 'Accepted').status, 'True');
    assert.equal(np.status.nodesDesired, 1, 'only node-a runs alpha web pods');
    assert.equal(np.status.nodesRealized, 1);
    const table = await k.kubectl(['get', 'networkpolicystatuses', '-n', 'alpha']);
    assert.match(table, /web-ingress\s+True\s+True\s+enforce\s+1\/1/);
    const nodes = await k.kubectl(['get', 'nodepolicystatuses']);
    assert.match(nodes, /node-a\s+True\s+True\s+False/);
    // The agents and the controller run with deploy/rbac.yaml: nothing they do may be forbidden.
    const forbidden = [...k.agents, ...k.controllers].flatMap((a) => a.log.filter((l) => /forbid|\b403\b/i.test(l)));
    assert.deepEqual(forbidden, []);
  });

  test('a policy the API server admits but Weir cannot enforce as written is reported with a precise reason, and isolates', async () => {
    // Leading zeros: the API server still parses "010.0.0.0/8" as decimal (with a warning);
    // Weir refuses to guess between octal and decimal.
    await k.apply(policyObject('beta', 'ambiguous', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ ipBlock: { cidr: '010.244.0.0/16' } }] }] }));
    const np = await eventually(
      'NetworkPolicyStatus beta/ambiguous',
      () => getJson(['get', 'networkpolicystatus', 'ambiguous', '-n', 'beta']),
      (o) => cond(o, 'Accepted')?.status === 'False',
    );
    assert.match(cond(np, 'Accepted').message, /spec\.ingress\[0\]\.from\[0\]\.ipBlock\.cidr/);
    assert.match(cond(np, 'Accepted').reason, /^[A-Z][A-Za-z]+$/);
    // a1 still allows only alpha's pods (the previous test's policy); b1 allows nothing.
    const a1 = (c: Cell) => c.target !== A1 || c.source === A1 || c.source === A2;
    await k.expect((c) => a1(c) && (c.target !== B1 || c.source === B1), 'b1 isolated by the rejected policy');
    const events = await eventually(
      'a PolicyRejected event',
      () => k.kubectl(['get', 'events', '-n', 'beta', '--field-selector', 'involvedObject.name=ambiguous']),
      (t) => /PolicyRejected/.test(t),
    );
    assert.match(events, /PolicyRejected/);
  });

  test('an audit-only policy shows mode audit and never Enforced, changes no verdict, and is enforced once kubectl removes the annotation', async () => {
    const open = (c: Cell) => (c.target !== A1 || c.source === A1 || c.source === A2) && (c.target !== B1 || c.source === B1);
    const body = policyObject('gamma', 'g-audit', { podSelector: {}, policyTypes: ['Ingress'] }) as { metadata: Json };
    await k.apply({ ...body, metadata: { ...body.metadata, annotations: { 'weir.dev/enforcement': 'audit' } } });
    const np = await eventually(
      'NetworkPolicyStatus gamma/g-audit',
      () => getJson(['get', 'networkpolicystatus', 'g-audit', '-n', 'gamma']),
      (o) => o.status?.mode === 'audit' && cond(o, 'Enforced')?.reason === 'AuditOnly' && o.status?.nodesRealized === 1,
    );
    assert.equal(cond(np, 'Enforced').status, 'False');
    assert.match(await k.kubectl(['get', 'networkpolicystatuses', '-n', 'gamma']), /g-audit\s+True\s+False\s+audit\s+1\/1/);
    await k.expect(open, 'audit-only: g1 stays open');
    await k.kubectl(['annotate', 'networkpolicy', 'g-audit', '-n', 'gamma', 'weir.dev/enforcement-']);
    await k.expect((c) => open(c) && (c.target !== G1 || c.source === G1), 'annotation removed: g1 isolated');
    await eventually(
      'NetworkPolicyStatus gamma/g-audit enforced',
      () => getJson(['get', 'networkpolicystatus', 'g-audit', '-n', 'gamma']),
      (o) => o.status?.mode === 'enforce' && cond(o, 'Enforced')?.status === 'True',
    );
    await k.kubectl(['delete', 'networkpolicy', 'g-audit', '-n', 'gamma']);
  });

  test('a NodePolicyStatus the controller cannot read, or naming a policy the cluster does not hold, is logged and changes nothing; a known one becomes an ApplyFailed Event', async () => {
    const web = await getJson(['get', 'networkpolicy', 'web-ingress', '-n', 'alpha']);
    const before = await getJson(['get', 'networkpolicystatus', 'web-ingress', '-n', 'alpha']);
    const controller = k.controllers[0]!;
    const unreadable = controller.waitFor((r) => /NodePolicyStatus node-x: its status\.policyDigest cannot be read/.test(r.msg ?? ''), 20_000, 'the unreadable digest named');
    const unknown = controller.waitFor((r) => /policy uid the cluster does not hold/.test(r.msg ?? '') && r.uid === 'no-such-uid', 20_000, 'the unknown uid named');
    // Written as an admin would (no agent can write another node's status).
    await k.apply({ apiVersion: 'weir.dev/v1alpha1', kind: 'NodePolicyStatus', metadata: { name: 'node-x' } });
    const status = {
      // Hex, as the CRD demands, but not 16 characters a bucket.
      policyDigest: { buckets: 2, digests: 'abcd' },
      applyFailures: [
        { namespace: 'alpha', name: 'web-ingress', uid: web.metadata.uid, generation: web.metadata.generation, error: 'iptables-restore: line 4 failed' },
        { namespace: 'alpha', name: 'ghost', uid: 'no-such-uid', generation: 1, error: 'iptables-restore: line 5 failed' },
      ],
    };
    await k.kubectl(['patch', 'nodepolicystatus', 'node-x', '--subresource=status', '--type=merge', '-p', JSON.stringify({ status })]);
    await Promise.all([unreadable, unknown]);
    const events = await eventually(
      'an ApplyFailed event on alpha/web-ingress',
      () => k.kubectl(['get', 'events', '-n', 'alpha', '--field-selector', 'involvedObject.name=web-ingress,reason=ApplyFailed', '-o', 'jsonpath={.items[*].message}']),
      (t) => t.includes('node node-x: iptables-restore: line 4 failed'),
    );
    assert.doesNotMatch(events, /line 5/);
    assert.equal((await k.kubectl(['get', 'events', '-n', 'alpha', '--field-selector', 'involvedObject.name=ghost', '-o', 'name'])).trim(), '');
    const after = await getJson(['get', 'networkpolicystatus', 'web-ingress', '-n', 'alpha']);
    assert.deepEqual(after.status, before.status, 'the policy status is as it was');
    await k.kubectl(['delete', 'nodepolicystatus', 'node-x']);
  });

  test('with no controller running, enforcement is untouched and status goes stale, never wrong; a new controller catches up', async () => {
    const [old] = k.controllers;
    await old!.stop();
    const before = await getJson(['get', 'networkpolicystatus', 'web-ingress', '-n', 'alpha']);
    await k.apply(policyObject('gamma', 'while-away', { podSelector: {}, policyTypes: ['Ingress'] }));
    const open = (c: Cell) => (c.target !== A1 || c.source === A1 || c.source === A2) && (c.target !== B1 || c.source === B1);
    await k.expect((c) => open(c) && (c.target !== G1 || c.source === G1), 'no controller: g1 isolated all the same');
    await new Promise((r) => setTimeout(r, 3_000));
    await assert.rejects(k.kubectl(['get', 'networkpolicystatus', 'while-away', '-n', 'gamma']), /NotFound|not found/, 'no status rather than a guess');
    assert.deepEqual((await getJson(['get', 'networkpolicystatus', 'web-ingress', '-n', 'alpha'])).metadata.resourceVersion, before.metadata.resourceVersion);

    await k.startController('c1');
    await eventually(
      'NetworkPolicyStatus gamma/while-away from the new controller',
      () => getJson(['get', 'networkpolicystatus', 'while-away', '-n', 'gamma']),
      (o) => cond(o, 'Enforced')?.status === 'True' && o.status?.nodesRealized === 1,
    );
    await k.kubectl(['delete', 'networkpolicy', 'while-away', '-n', 'gamma']);
    await k.expect(open, 'while-away deleted');
  });
});
