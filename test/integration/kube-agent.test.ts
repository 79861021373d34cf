// Weir against a real kube-apiserver, driven with real kubectl; assertions by real packets.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { A1, A2, B1, B2, G1 } from '../conformance/harness.ts';
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
    await k.apply(policyObject('alpha', 'web-from-beta', {
      podSelector: { matchLabels: { app: 'web' } },
      ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ port: 80 }] }],
    }));
    const fromBetaOn80 = (c: Cell) => c.target !== A1 || c.source === A1 || ((c.source === B1 || c.source === B2) && c.proto === 'tcp' && c.port === 80);
    await k.expect(fromBetaOn80, 'web-from-beta');
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
    await k.expect(allowed([B1]), 'b2 Succeeded');
    await k.setPodStatus('beta', 'b2', 'Running', ['10.244.2.22']);
    await k.expect(allowed([B1, B2]), 'b2 Running again');
  });

  test('kubectl delete of the policy restores default allow; egress deny-all holds for the external host too', async () => {
    await k.kubectl(['delete', 'networkpolicy', 'web-from-beta', '-n', 'alpha']);
    await k.expect(() => true, 'policy deleted');
    await k.apply(policyObject('beta', 'no-egress', { podSelector: {}, policyTypes: ['Egress'] }));
    await k.expect((c) => c.source === c.target || (c.source !== B1 && c.source !== B2), 'beta egress denied');
    assert.ok(k.agents.every((a) => a.errors.length === 0), k.agents.flatMap((a) => a.errors).join('\n'));
    await k.kubectl(['delete', 'networkpolicy', 'no-egress', '-n', 'beta']);
    await k.expect(() => true, 'all policies deleted');
  });
});
