// The examples/ directory is the demo cluster and the README's walk-through: it must load
// without a single warning and describe a consistent cluster.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { cidrContains, parseCidr } from '../../../src/model/cidr.ts';
import { compilePolicy } from '../../../src/model/policy.ts';
import type { Namespace, Node, Pod, RawNetworkPolicy } from '../../../src/model/types.ts';
import { createManifestSource } from '../../../src/sources/index.ts';
import type { SourceBatch } from '../../../src/sources/index.ts';

const EXAMPLES = fileURLToPath(new URL('../../../examples/', import.meta.url));

test('examples/ loads without warnings into a consistent demo cluster', async () => {
  const messages: { level: number; msg: string }[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void messages.push(JSON.parse(s) as { level: number; msg: string }) });
  const source = createManifestSource({ dir: EXAMPLES, log });
  const batches: SourceBatch[] = [];
  await source.start((b) => batches.push(b));
  await source.stop();

  assert.deepEqual(
    messages.filter((m) => m.level >= 30),
    [],
    'no info, warning or error',
  );
  assert.equal(batches.length, 1);
  const pods: Pod[] = [];
  const namespaces: Namespace[] = [];
  const nodes: Node[] = [];
  const policies: RawNetworkPolicy[] = [];
  for (const e of batches[0].events) {
    assert.equal(e.op, 'upsert');
    if (e.op !== 'upsert') continue;
    if (e.kind === 'Pod') pods.push(e.object);
    else if (e.kind === 'Namespace') namespaces.push(e.object);
    else if (e.kind === 'Node') nodes.push(e.object);
    else if (e.kind === 'NetworkPolicy') policies.push(e.object);
  }

  assert.deepEqual(namespaces.map((n) => n.name).sort(), ['backend', 'db', 'frontend']);
  assert.deepEqual(nodes.map((n) => n.name).sort(), ['node-a', 'node-b']);
  assert.ok(pods.length >= 6, `${pods.length} pods`);
  assert.ok(policies.length >= 4, `${policies.length} policies`);

  for (const pod of pods) {
    const where = `${pod.namespace}/${pod.name}`;
    assert.ok(
      namespaces.some((n) => n.name === pod.namespace),
      `${where}: namespace exists`,
    );
    assert.equal(pod.phase, 'Running', where);
    const node = nodes.find((n) => n.name === pod.nodeName);
    assert.ok(node !== undefined, `${where}: node ${pod.nodeName} exists`);
    assert.deepEqual(
      pod.ips.map((ip) => (ip.includes(':') ? 6 : 4)),
      [4, 6],
      `${where}: one IPv4 and one IPv6 address`,
    );
    for (const ip of pod.ips) {
      const inside = node.podCIDRs.some((c) => {
        const cidr = parseCidr(c);
        return !('error' in cidr) && cidrContains(cidr, ip);
      });
      assert.ok(inside, `${where}: ${ip} is inside a podCIDR of ${node.name}`);
    }
    // The demo server listens on 80 and 81 over TCP and UDP; every socket has a port name.
    const sockets = pod.ports.map((p) => `${p.port}/${p.protocol}`).sort();
    assert.deepEqual(sockets, ['80/TCP', '80/UDP', '81/TCP', '81/UDP'], where);
  }
  const allIps = pods.flatMap((p) => p.ips);
  assert.equal(new Set(allIps).size, allIps.length, 'pod IPs are unique');

  for (const raw of policies) {
    assert.deepEqual(compilePolicy(raw).errors, [], `${raw.namespace}/${raw.name} compiles`);
  }
  const compiled = policies.map(compilePolicy);
  assert.ok(
    compiled.some((p) => p.egress !== null),
    'an egress policy',
  );
  assert.ok(
    compiled.some((p) => p.ingress?.some((r) => r.peers?.some((peer) => peer.kind === 'pods' && peer.namespaceSelector !== null && peer.podSelector.key !== ''))),
    'a namespaceSelector AND podSelector peer',
  );
});
