import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decodeNamespace, decodePod } from '../../../src/kube/core-v1-proto.ts';
import { decodeProtoStatus, ProtoListSplitter } from '../../../src/kube/proto-list.ts';
import { ProtoError } from '../../../src/kube/protobuf.ts';
import { toNamespace, toPod } from '../../../src/sources/convert.ts';
import { bytes, entry, fixed32, fixed64, msg, num, protoList, str } from '../../support/protobuf-encoder.ts';

const port = (name: string, containerPort: number, protocol: string) => msg(6, str(1, name), num(2, 0), num(3, containerPort), str(4, protocol), str(5, ''));

/** A pod as the API server encodes it, with fields Weir skips of every wire type in between. */
const POD = Buffer.concat([
  msg(
    1,
    str(1, 'web-1'),
    str(2, ''),
    str(3, 'shop'),
    str(5, 'uid-1'),
    str(6, '4711'),
    num(7, 3),
    msg(8, num(1, 1_700_000_000)),
    msg(9, num(1, 1_800_000_000), num(2, 0)),
    entry(11, 'app', 'web'),
    entry(11, 'app.kubernetes.io/part-of', 'shop'),
    entry(12, 'kubectl.kubernetes.io/last-applied-configuration', '{"big":"x"}'.repeat(100)),
    entry(12, 'weir.dev/audit', 'deny'),
    msg(17, str(1, 'kubectl'), str(2, 'Update')),
  ),
  msg(
    2,
    msg(1, str(1, 'data')),
    msg(2, str(1, 'web'), str(2, 'registry.invalid/web'), port('http', 8080, 'TCP'), port('', 9090, 'TCP'), port('dns', 53, 'UDP'), msg(8, str(1, 'x'))),
    msg(20, str(1, 'init'), port('ignored', 7000, 'TCP')),
    msg(20, str(1, 'sidecar'), port('metrics', 9100, 'TCP'), str(24, 'Always')),
    str(10, 'node-a'),
    num(11, 0),
    fixed64(999),
    fixed32(998),
  ),
  msg(3, str(1, 'Running'), msg(2, str(1, 'Ready')), str(5, '192.0.2.1'), str(6, '10.0.0.5'), msg(12, str(1, '10.0.0.5')), msg(12, str(1, 'fd00::5'))),
]);

const POD_JSON = {
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: {
    name: 'web-1',
    namespace: 'shop',
    uid: 'uid-1',
    resourceVersion: '4711',
    deletionTimestamp: '2027-01-15T08:00:00Z',
    labels: { app: 'web', 'app.kubernetes.io/part-of': 'shop' },
    annotations: { 'weir.dev/audit': 'deny' },
  },
  spec: {
    nodeName: 'node-a',
    containers: [
      {
        ports: [
          { name: 'http', containerPort: 8080, protocol: 'TCP' },
          { containerPort: 9090, protocol: 'TCP' },
          { name: 'dns', containerPort: 53, protocol: 'UDP' },
        ],
      },
    ],
    initContainers: [{ ports: [{ name: 'ignored', containerPort: 7000, protocol: 'TCP' }] }, { restartPolicy: 'Always', ports: [{ name: 'metrics', containerPort: 9100, protocol: 'TCP' }] }],
  },
  status: { phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }, { ip: 'fd00::5' }] },
};

test('a protobuf pod decodes to the JSON shape Weir reads, skipping every other field', () => {
  assert.deepEqual(decodePod(POD), POD_JSON);
  const pod = toPod(decodePod(POD));
  assert.deepEqual(pod.ports, [
    { name: 'http', port: 8080, protocol: 'TCP' },
    { name: 'dns', port: 53, protocol: 'UDP' },
    { name: 'metrics', port: 9100, protocol: 'TCP' },
  ]);
  assert.equal(pod.terminating, true);
  assert.deepEqual(pod.ips, ['10.0.0.5', 'fd00::5']);
});

test('a host-network pod with empty strings converts as its JSON would, which omits them', () => {
  const hostPod = Buffer.concat([msg(1, str(1, 'h'), str(3, 'kube-system'), str(5, 'u'), str(6, '1')), msg(2, str(10, ''), num(11, 1)), msg(3, str(1, 'Pending'), str(6, ''))]);
  const json = { metadata: { name: 'h', namespace: 'kube-system', uid: 'u', resourceVersion: '1' }, spec: { hostNetwork: true, containers: [] }, status: { phase: 'Pending' } };
  assert.deepEqual(toPod(decodePod(hostPod)), toPod(json));
  assert.equal(toPod(decodePod(hostPod)).hostNetwork, true);
});

test('a protobuf namespace decodes to its metadata', () => {
  const ns = Buffer.concat([
    msg(1, str(1, 'shop'), str(5, 'u'), str(6, '9'), entry(11, 'team', 'a'), entry(12, 'weir.dev/audit', 'all'), entry(12, 'other', 'x')),
    msg(2, str(1, 'kubernetes')),
    msg(3, str(1, 'Active')),
  ]);
  assert.deepEqual(decodeNamespace(ns), {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: { name: 'shop', uid: 'u', resourceVersion: '9', labels: { team: 'a' }, annotations: { 'weir.dev/audit': 'all' } },
  });
  assert.deepEqual(toNamespace(decodeNamespace(ns)), { name: 'shop', labels: { 'kubernetes.io/metadata.name': 'shop', team: 'a' }, audit: 'all' });
});

function splitAll(body: Buffer, chunkSize: number) {
  const s = new ProtoListSplitter();
  const items: Buffer[] = [];
  for (let i = 0; i < body.length; i += chunkSize) items.push(...s.push(body.subarray(i, i + chunkSize)).map((b) => Buffer.from(b)));
  return { items, rest: s.finish() };
}

test('a protobuf list body is split into its items at every chunk size, with kind and metadata', () => {
  const second = Buffer.concat([msg(1, str(1, 'db-0'), str(3, 'shop'))]);
  const body = protoList('PodList', [str(1, ''), str(2, '123'), str(3, 'next-page'), num(4, 7)], [POD, second, Buffer.alloc(0)]);
  for (let size = 1; size <= body.length; size += size < 64 ? 1 : 97) {
    const { items, rest } = splitAll(body, size);
    assert.deepEqual(items, [POD, second, Buffer.alloc(0)], `chunk size ${size}`);
    assert.deepEqual(rest, { apiVersion: 'v1', kind: 'PodList', metadata: { resourceVersion: '123', continue: 'next-page' }, items: [] }, `chunk size ${size}`);
  }
  assert.deepEqual(splitAll(protoList('NamespaceList', [str(2, '5')], []), 3), { items: [], rest: { apiVersion: 'v1', kind: 'NamespaceList', metadata: { resourceVersion: '5' }, items: [] } });
});

test('a protobuf body cut short, or not protobuf, fails instead of passing as a shorter list', () => {
  const body = protoList('PodList', [str(2, '1')], [POD, POD]);
  for (const cut of [body.length - 1, body.length - 5, Math.floor(body.length / 2), 30, 6, 2]) {
    const s = new ProtoListSplitter();
    s.push(body.subarray(0, cut));
    assert.throws(() => s.finish(), ProtoError, `cut at ${cut}`);
  }
  assert.throws(() => new ProtoListSplitter().push(Buffer.from('{"kind":"PodList"}')), ProtoError);
  // A tag that is not length-delimited where only messages belong.
  assert.throws(() => new ProtoListSplitter().push(Buffer.concat([Buffer.from('k8s\0', 'latin1'), num(1, 5)])), /wire type 0/);
});

test('a protobuf error answer reads as the Status it carries', () => {
  const body = Buffer.concat([
    Buffer.from('k8s\0', 'latin1'),
    msg(1, str(1, 'v1'), str(2, 'Status')),
    msg(2, msg(1), str(2, 'Failure'), str(3, 'too old resource version'), str(4, 'Expired'), num(6, 410)),
  ]);
  assert.deepEqual(decodeProtoStatus(body), { kind: 'Status', message: 'too old resource version', reason: 'Expired', code: 410 });
  assert.equal(decodeProtoStatus(Buffer.from('{"kind":"Status"}')), undefined);
  assert.equal(decodeProtoStatus(Buffer.concat([Buffer.from('k8s\0', 'latin1'), bytes(2, Buffer.from([0x1a, 0x50]))])), undefined);
});
