// ClusterNetworkPolicy through a real kube-apiserver: the kube source syncs while the CRD is
// not installed (the server's 404 reads as "none"), finds the vendored CRD once it is applied,
// and sends each policy as the model's event; and the model refuses what the CRD refuses and
// accepts what it accepts, for the checks both make (its schema, maxItems and CEL rules).

import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { pino } from 'pino';
import { compileClusterNetworkPolicy } from '../../src/model/cluster-network-policy.ts';
import type { ModelEvent } from '../../src/model/types.ts';
import { createKubeSource } from '../../src/sources/kube/index.ts';
import type { Source, SourceBatch } from '../../src/sources/types.ts';
import { eventually } from '../support/eventually.ts';
import { type ControlPlane, startControlPlane } from './controlplane.ts';

const CRD = fileURLToPath(new URL('../../crds/policy.networking.k8s.io_clusternetworkpolicies.yaml', import.meta.url));
const CRD_NAME = 'clusternetworkpolicies.policy.networking.k8s.io';

const object = (name: string, spec: unknown) => ({ apiVersion: 'policy.networking.k8s.io/v1beta1', kind: 'ClusterNetworkPolicy', metadata: { name }, spec });
const HEAD = { tier: 'Admin', priority: 10, subject: { namespaces: {} } };
const ANY_NS = { namespaces: {} };
const deny = (more: object) => ({ ...HEAD, ingress: [{ action: 'Deny', from: [ANY_NS], ...more }] });
const denyTo = (to: unknown[], more: object = {}) => ({ ...HEAD, egress: [{ action: 'Deny', to, ...more }] });

/** From the API's conformance manifests (admin_tier, baseline_tier), and the protocols' forms. */
const VALID: Record<string, unknown> = {
  'pods subject, networks 0.0.0.0/0 and ::/0': {
    tier: 'Admin',
    priority: 85,
    subject: { pods: { namespaceSelector: { matchLabels: { 'conformance-house': 'gryffindor' } }, podSelector: { matchLabels: { 'conformance-house': 'gryffindor' } } } },
    egress: [{ name: 'deny-egress-to-internet', action: 'Deny', to: [{ networks: ['0.0.0.0/0', '::/0'] }] }],
  },
  'Baseline, Pass, a port range of each protocol': {
    tier: 'Baseline',
    priority: 0,
    subject: { namespaces: { matchExpressions: [{ key: 'conformance-house', operator: 'Exists' }] } },
    ingress: [
      {
        action: 'Pass',
        from: [{ pods: { podSelector: {} } }],
        protocols: [
          { tcp: { destinationPort: { range: { start: 80, end: 8080 } } } },
          { udp: { destinationPort: { number: 53 } } },
          { sctp: { destinationPort: { range: { start: 9003, end: 9005 } } } },
        ],
      },
    ],
  },
  '25 rules, priority 1000': { ...HEAD, priority: 1000, ingress: Array.from({ length: 25 }, () => ({ action: 'Accept', from: [ANY_NS] })) },
};

/** What the standard CRD refuses; each is an error of the model too (test/unit/model has its path). */
const INVALID: Record<string, unknown> = {
  'tier Developer': { ...HEAD, tier: 'Developer' },
  'priority 1001': { ...HEAD, priority: 1001 },
  'subject with both kinds': { ...HEAD, subject: { namespaces: {}, pods: { podSelector: {} } } },
  'subject pods without podSelector': { ...HEAD, subject: { pods: { namespaceSelector: {} } } },
  'action Allow': { ...HEAD, ingress: [{ action: 'Allow', from: [ANY_NS] }] },
  'from empty': { ...HEAD, ingress: [{ action: 'Deny', from: [] }] },
  '26 rules': { ...HEAD, ingress: Array.from({ length: 26 }, () => ({ action: 'Deny', from: [ANY_NS] })) },
  'a rule name of 101 characters': deny({ name: 'n'.repeat(101) }),
  'a peer with two kinds': denyTo([{ namespaces: {}, networks: ['10.0.0.0/8'] }]),
  'a peer with none': denyTo([{}]),
  'networks with host bits set': denyTo([{ networks: ['10.1.2.3/16'] }]),
  'networks with a bare address': denyTo([{ networks: ['10.0.0.1'] }]),
  'networks empty': denyTo([{ networks: [] }]),
  'a CIDR written twice': denyTo([{ networks: ['10.0.0.0/8', '10.0.0.0/8'] }]),
  'protocols empty': deny({ protocols: [] }),
  'tcp without destinationPort': deny({ protocols: [{ tcp: {} }] }),
  'port 0': deny({ protocols: [{ tcp: { destinationPort: { number: 0 } } }] }),
  'number and range together': deny({ protocols: [{ tcp: { destinationPort: { number: 80, range: { start: 1, end: 2 } } } }] }),
  'a range of one port': deny({ protocols: [{ tcp: { destinationPort: { range: { start: 80, end: 80 } } } }] }),
  'two protocols in one entry': deny({ protocols: [{ tcp: { destinationPort: { number: 80 } }, udp: { destinationPort: { number: 80 } } }] }),
};

describe('ClusterNetworkPolicy through a real API server', () => {
  let cp: ControlPlane;
  let source: Source;
  const batches: SourceBatch[] = [];
  const lines: { level: number; msg: string; kind?: string }[] = [];

  const cnpEvents = (): ModelEvent[] => batches.flatMap((b) => b.events.filter((e) => e.kind === 'ClusterNetworkPolicy'));
  async function until(cond: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!cond()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  before(async () => {
    cp = await startControlPlane();
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
    source = createKubeSource({
      kubeConfig: kc,
      log: pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) }),
      // Listed again every second while it is not served, so that the CRD applied below is found soon.
      timings: { relistMs: [1_000, 1_000] },
    });
  });
  after(async () => {
    await source?.stop();
    await cp?.stop();
  });

  test('without the CRD the source syncs and says so once; the CRD applied, a policy created with kubectl arrives as the event of its spec', async () => {
    await source.start((b) => void batches.push(b));
    assert.equal(batches[0]?.synced, true, 'the first batch is the full state');
    assert.deepEqual(cnpEvents(), []);
    const said = lines.filter((l) => l.kind === 'ClusterNetworkPolicy' && /is not served by the API server \(404 NotFound\)/.test(l.msg));
    assert.equal(said.length, 1, JSON.stringify(lines));

    await cp.kubectl(['apply', '--server-side', '-f', CRD]);
    // Null conditions right after the create read as an error to kubectl wait: retried.
    await eventually(
      'the CRD Established',
      () => cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', `crd/${CRD_NAME}`]),
      () => true,
      60_000,
    );
    const spec = VALID['pods subject, networks 0.0.0.0/0 and ::/0'];
    await cp.kubectl(['create', '-f', '-'], JSON.stringify(object('internet', spec)));
    await until(() => cnpEvents().length > 0, 'the policy arrives');
    const stored = JSON.parse(await cp.kubectl(['get', 'clusternetworkpolicy', 'internet', '-o', 'json']));
    assert.deepEqual(cnpEvents(), [{ kind: 'ClusterNetworkPolicy', op: 'upsert', object: { name: 'internet', uid: stored.metadata.uid, generation: 1, spec } }]);
    assert.ok(lines.some((l) => l.kind === 'ClusterNetworkPolicy' && /is served now/.test(l.msg)));

    await cp.kubectl(['delete', 'clusternetworkpolicy', 'internet']);
    await until(() => cnpEvents().length > 1, 'the delete arrives');
    assert.deepEqual(cnpEvents()[1], { kind: 'ClusterNetworkPolicy', op: 'delete', name: 'internet' });
  });

  test('the API server and the model accept the same valid policies', async () => {
    for (const [name, spec] of Object.entries(VALID)) {
      await cp.kubectl(['create', '--dry-run=server', '-f', '-'], JSON.stringify(object('valid', spec)));
      assert.deepEqual(compileClusterNetworkPolicy({ name: 'valid', uid: 'u', generation: 1, spec }).errors, [], name);
    }
  });

  test('the API server and the model refuse the same invalid policies', async () => {
    const admitted: string[] = [];
    const compiled: string[] = [];
    for (const [name, spec] of Object.entries(INVALID)) {
      const refused = await cp.kubectl(['create', '--dry-run=server', '-f', '-'], JSON.stringify(object('invalid', spec))).then(
        () => false,
        () => true,
      );
      if (!refused) admitted.push(name);
      if (compileClusterNetworkPolicy({ name: 'invalid', uid: 'u', generation: 1, spec }).errors.length === 0) compiled.push(name);
    }
    assert.deepEqual(admitted, [], 'the API server admitted these');
    assert.deepEqual(compiled, [], 'the model accepted these');
  });
});
