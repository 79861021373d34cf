// Pods and Namespaces read from the API server's protobuf answers (k8s.io/api core/v1 and
// apimachinery meta/v1 generated.proto; field numbers below). Each decoder builds the JSON shape
// of the object with only the fields Weir reads (../sources/convert.ts), so the one conversion
// serves both encodings. A string field the API server leaves empty is left out, as its JSON
// `omitempty` would, so both encodings convert alike.

import { ANNOTATION_PREFIX } from '../model/annotations.ts';
import { ProtoReader } from './protobuf.ts';

type Json = Record<string, unknown>;

function set(o: Json, key: string, value: string): void {
  if (value !== '') o[key] = value;
}

/** meta/v1 Time {seconds 1, nanos 2} as RFC 3339 text, as JSON carries it. */
function time(r: ProtoReader): string {
  let seconds = 0;
  while (r.next()) {
    if (r.field === 1) seconds = r.number();
    else r.skip();
  }
  return new Date(seconds * 1000).toISOString().replace('.000Z', 'Z');
}

/** One entry of a map<string, string> {key 1, value 2}; `keep` decides, by key, whether the
 *  value is decoded at all (a pod's annotations can be large, and only weir.dev/ ones count). */
function mapEntry(r: ProtoReader, into: Record<string, string>, keep: (key: string) => boolean): void {
  let key = '';
  let value: [number, number] = [0, 0];
  while (r.next()) {
    if (r.field === 1) key = r.string();
    else if (r.field === 2) value = r.span();
    else r.skip();
  }
  if (keep(key)) into[key] = r.buf.toString('utf8', value[0], value[1]);
}

const everyKey = () => true;
const weirKey = (key: string) => key.startsWith(ANNOTATION_PREFIX);

/** meta/v1 ObjectMeta: name 1, namespace 3, uid 5, resourceVersion 6, deletionTimestamp 9,
 *  labels 11, annotations 12 (weir.dev/ keys only). */
function objectMeta(r: ProtoReader): Json {
  const md: Json = {};
  let labels: Record<string, string> | undefined;
  let annotations: Record<string, string> | undefined;
  while (r.next()) {
    switch (r.field) {
      case 1:
        set(md, 'name', r.string());
        break;
      case 3:
        set(md, 'namespace', r.string());
        break;
      case 5:
        set(md, 'uid', r.string());
        break;
      case 6:
        set(md, 'resourceVersion', r.string());
        break;
      case 9:
        md.deletionTimestamp = time(r.message());
        break;
      case 11:
        mapEntry(r.message(), (labels ??= {}), everyKey);
        break;
      case 12:
        mapEntry(r.message(), (annotations ??= {}), weirKey);
        break;
      default:
        r.skip();
    }
  }
  if (labels !== undefined) md.labels = labels;
  if (annotations !== undefined && Object.keys(annotations).length > 0) md.annotations = annotations;
  return md;
}

/** core/v1 ContainerPort: name 1, containerPort 3, protocol 4. */
function containerPort(r: ProtoReader): Json {
  const p: Json = {};
  while (r.next()) {
    if (r.field === 1) set(p, 'name', r.string());
    else if (r.field === 3) p.containerPort = r.number();
    else if (r.field === 4) set(p, 'protocol', r.string());
    else r.skip();
  }
  return p;
}

/** core/v1 Container: ports 6, restartPolicy 24 (what makes an init container a sidecar). */
function container(r: ProtoReader): Json {
  const c: Json = {};
  const ports: Json[] = [];
  while (r.next()) {
    if (r.field === 6) ports.push(containerPort(r.message()));
    else if (r.field === 24) set(c, 'restartPolicy', r.string());
    else r.skip();
  }
  if (ports.length > 0) c.ports = ports;
  return c;
}

/** core/v1 PodSpec: containers 2, nodeName 10, hostNetwork 11, initContainers 20. */
function podSpec(r: ProtoReader): Json {
  const spec: Json = {};
  const containers: Json[] = [];
  const initContainers: Json[] = [];
  while (r.next()) {
    switch (r.field) {
      case 2:
        containers.push(container(r.message()));
        break;
      case 10:
        set(spec, 'nodeName', r.string());
        break;
      case 11:
        if (r.number() !== 0) spec.hostNetwork = true;
        break;
      case 20:
        initContainers.push(container(r.message()));
        break;
      default:
        r.skip();
    }
  }
  spec.containers = containers;
  if (initContainers.length > 0) spec.initContainers = initContainers;
  return spec;
}

/** core/v1 PodStatus: phase 1, podIP 6, podIPs 12 (PodIP {ip 1}). */
function podStatus(r: ProtoReader): Json {
  const status: Json = {};
  const podIPs: Json[] = [];
  while (r.next()) {
    if (r.field === 1) set(status, 'phase', r.string());
    else if (r.field === 6) set(status, 'podIP', r.string());
    else if (r.field === 12) {
      const ip = r.message();
      const entry: Json = {};
      while (ip.next()) {
        if (ip.field === 1) set(entry, 'ip', ip.string());
        else ip.skip();
      }
      podIPs.push(entry);
    } else r.skip();
  }
  if (podIPs.length > 0) status.podIPs = podIPs;
  return status;
}

/** core/v1 Pod {metadata 1, spec 2, status 3}, in the JSON shape convert.ts reads. */
export function decodePod(item: Buffer): Json {
  const r = new ProtoReader(item);
  const pod: Json = { apiVersion: 'v1', kind: 'Pod' };
  while (r.next()) {
    if (r.field === 1) pod.metadata = objectMeta(r.message());
    else if (r.field === 2) pod.spec = podSpec(r.message());
    else if (r.field === 3) pod.status = podStatus(r.message());
    else r.skip();
  }
  return pod;
}

/** core/v1 Namespace {metadata 1, ...}: Weir reads only its metadata. */
export function decodeNamespace(item: Buffer): Json {
  const r = new ProtoReader(item);
  const ns: Json = { apiVersion: 'v1', kind: 'Namespace' };
  while (r.next()) {
    if (r.field === 1) ns.metadata = objectMeta(r.message());
    else r.skip();
  }
  return ns;
}
