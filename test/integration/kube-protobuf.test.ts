// Pods and Namespaces are listed as protobuf (src/kube/core-v1-proto.ts). Against a real API
// server, every object of every shape Weir reads must convert exactly as its JSON does, and the
// server's protobuf errors must read as their Status.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { KubeConfig } from '@kubernetes/client-node';
import { createKubeClient, type KubeClient } from '../../src/kube/client.ts';
import { decodeNamespace, decodePod } from '../../src/kube/core-v1-proto.ts';
import { toNamespace, toPod } from '../../src/sources/convert.ts';
import { startControlPlane, type ControlPlane } from './controlplane.ts';

const NS = 'weir-proto';

const OBJECTS = `
apiVersion: v1
kind: Namespace
metadata:
  name: ${NS}
  labels: {team: a, env: prod}
  annotations: {weir.dev/audit: deny, note: "not Weir's"}
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: ${NS}
  labels: {app: web, app.kubernetes.io/part-of: shop}
  annotations: {weir.dev/audit: all, big: "${'x'.repeat(2000)}"}
spec:
  nodeName: node-a
  initContainers:
  - {name: setup, image: registry.invalid/i, ports: [{name: setup-port, containerPort: 7000}]}
  - name: sidecar
    image: registry.invalid/s
    restartPolicy: Always
    ports: [{name: metrics, containerPort: 9100}]
  containers:
  - name: web
    image: registry.invalid/w
    ports:
    - {name: http, containerPort: 8080}
    - {containerPort: 9090}
    - {name: dns, containerPort: 53, protocol: UDP}
    - {name: assoc, containerPort: 3868, protocol: SCTP}
---
apiVersion: v1
kind: Pod
metadata: {name: host, namespace: ${NS}}
spec:
  nodeName: node-b
  hostNetwork: true
  containers: [{name: h, image: registry.invalid/h}]
---
apiVersion: v1
kind: Pod
metadata: {name: pending, namespace: ${NS}, labels: {app: db}}
spec:
  containers: [{name: p, image: registry.invalid/p}]
---
apiVersion: v1
kind: Pod
metadata: {name: leaving, namespace: ${NS}, finalizers: [weir.dev/test-hold]}
spec:
  nodeName: node-a
  containers: [{name: l, image: registry.invalid/l}]
`;

describe('protobuf lists from a real API server', () => {
  let cp: ControlPlane;
  let client: KubeClient;

  before(async () => {
    cp = await startControlPlane();
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
    client = createKubeClient(kc);
    await cp.kubectl(['apply', '-f', '-'], OBJECTS);
    const status = (ips: string[]) => JSON.stringify({ status: { phase: 'Running', podIP: ips[0], podIPs: ips.map((ip) => ({ ip })) } });
    await cp.kubectl(['patch', 'pod', 'web', '-n', NS, '--subresource=status', '--type=merge', '-p', status(['10.244.1.5', 'fd00:10:244:1::5'])]);
    await cp.kubectl(['patch', 'pod', 'host', '-n', NS, '--subresource=status', '--type=merge', '-p', status(['192.168.0.2'])]);
    await cp.kubectl(['patch', 'pod', 'leaving', '-n', NS, '--subresource=status', '--type=merge', '-p', status(['10.244.1.6'])]);
    await cp.kubectl(['delete', 'pod', 'leaving', '-n', NS, '--wait=false']);
  });
  after(async () => {
    if (cp !== undefined) {
      await cp.kubectl(['patch', 'pod', 'leaving', '-n', NS, '--type=json', '-p', '[{"op":"remove","path":"/metadata/finalizers"}]']).catch(() => {});
      await client?.close();
      await cp.stop();
    }
  });

  /** The list's items, read as JSON and as protobuf; `decoded` counts protobuf items. */
  async function bothWays(path: string, query: Record<string, string>, decode: (b: Buffer) => unknown) {
    const json: unknown[] = [];
    const jsonRest = await client.list({ method: 'GET', path, query }, (i) => json.push(i));
    const proto: unknown[] = [];
    let decoded = 0;
    const protoRest = await client.list(
      {
        method: 'GET',
        path,
        query,
        protobuf: (b) => {
          decoded++;
          return decode(b);
        },
      },
      (i) => proto.push(i),
    );
    return { json, proto, decoded, jsonRest: jsonRest as { metadata: Record<string, string> }, protoRest: protoRest as { metadata: Record<string, string> } };
  }

  it('pods of every shape convert from protobuf exactly as from JSON', async () => {
    for (const query of [{ resourceVersion: '0' }, { limit: '2' }] as Record<string, string>[]) {
      const { json, proto, decoded } = await bothWays(`/api/v1/namespaces/${NS}/pods`, query, decodePod);
      assert.equal(decoded, proto.length, 'every item came as protobuf');
      assert.ok(proto.length >= 2);
      assert.deepEqual(
        proto.map((p) => toPod(p)),
        json.map((p) => toPod(p)),
      );
    }
    const { proto } = await bothWays(`/api/v1/namespaces/${NS}/pods`, {}, decodePod);
    const byName = new Map(proto.map((p) => toPod(p)).map((p) => [p.name, p]));
    assert.equal(byName.size, 4);
    const web = byName.get('web');
    assert.deepEqual(web?.ips, ['10.244.1.5', 'fd00:10:244:1::5']);
    assert.deepEqual(web?.labels, { app: 'web', 'app.kubernetes.io/part-of': 'shop' });
    assert.deepEqual(
      web?.ports.map((p) => `${p.name}/${p.port}/${p.protocol}`),
      ['http/8080/TCP', 'dns/53/UDP', 'assoc/3868/SCTP', 'metrics/9100/TCP'],
    );
    assert.equal(byName.get('host')?.hostNetwork, true);
    assert.equal(byName.get('pending')?.phase, 'Pending');
    assert.equal(byName.get('pending')?.nodeName, '');
    assert.equal(byName.get('leaving')?.terminating, true);
    assert.equal(web?.terminating, false);
  });

  it('a paged protobuf list carries its continue token and resourceVersion', async () => {
    const { jsonRest, protoRest, decoded } = await bothWays(`/api/v1/namespaces/${NS}/pods`, { limit: '1' }, decodePod);
    assert.equal(decoded, 1);
    assert.ok(protoRest.metadata.continue, 'a continue token');
    assert.match(protoRest.metadata.resourceVersion ?? '', /^\d+$/);
    assert.equal(typeof jsonRest.metadata.continue, 'string');
  });

  it('namespaces convert from protobuf exactly as from JSON, audit annotation included', async () => {
    const { json, proto, decoded } = await bothWays('/api/v1/namespaces', { resourceVersion: '0' }, decodeNamespace);
    assert.equal(decoded, proto.length);
    assert.deepEqual(
      proto.map((n) => toNamespace(n)),
      json.map((n) => toNamespace(n)),
    );
    const ours = proto.map((n) => toNamespace(n)).find((n) => n.name === NS);
    assert.deepEqual(ours, { name: NS, labels: { env: 'prod', 'kubernetes.io/metadata.name': NS, team: 'a' }, audit: 'deny' });
  });

  it('an error answered in protobuf reads as the Status the server sent', async () => {
    const list = (protobuf?: (b: Buffer) => unknown) => client.list({ method: 'GET', path: '/api/v1/pods', query: { fieldSelector: 'spec.no-such-field=x' }, protobuf }, () => {});
    const asJson = await list().catch((e: Error) => e);
    const asProto = await list(decodePod).catch((e: Error) => e);
    assert.ok(asProto instanceof Error);
    assert.match(asProto.message, /400/);
    assert.match(asProto.message, /field label not supported/);
    assert.equal(asProto.message, (asJson as Error).message);
  });
});
