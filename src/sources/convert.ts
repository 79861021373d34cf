// Kubernetes JSON objects (from the API server or a manifest) into model objects.
// Shared by the manifest and kube sources so both emit identical events: it applies the
// defaults the API server would, keeps only the fields the model needs, and reports every
// problem of an object at once. No file or network knowledge here.

import { WeirError } from '../errors.ts';
import { canonicalCidr, canonicalIp } from '../model/cidr.ts';
import { NAMESPACE_NAME_LABEL } from '../model/cluster.ts';
import { PROTOCOLS } from '../model/types.ts';
import type { ContainerPort, Labels, Namespace, Node, Pod, Protocol, RawNetworkPolicy } from '../model/types.ts';

/** Receives problems that do not stop the conversion (an invalid IP that is dropped). */
export type ConvertWarning = (message: string) => void;

const DEFAULT_NAMESPACE = 'default';
const ignore: ConvertWarning = () => {};

type Rec = Record<string, unknown>;

function isRecord(v: unknown): v is Rec {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Reads fields of one object, collecting every problem instead of stopping at the first. */
class Reader {
  readonly problems: string[] = [];

  record(v: unknown, path: string): Rec {
    if (v === undefined || v === null) return {};
    if (isRecord(v)) return v;
    this.problems.push(`${path} must be an object`);
    return {};
  }

  array(v: unknown, path: string): readonly unknown[] {
    if (v === undefined || v === null) return [];
    if (Array.isArray(v)) return v;
    this.problems.push(`${path} must be a list`);
    return [];
  }

  string(v: unknown, path: string, fallback: string): string {
    if (v === undefined || v === null) return fallback;
    if (typeof v === 'string') return v;
    this.problems.push(`${path} must be a string`);
    return fallback;
  }

  boolean(v: unknown, path: string): boolean {
    if (v === undefined || v === null) return false;
    if (typeof v === 'boolean') return v;
    this.problems.push(`${path} must be true or false`);
    return false;
  }

  labels(v: unknown, path: string): Record<string, string> {
    const out: Record<string, string> = {};
    const rec = this.record(v, path);
    for (const key of Object.keys(rec).sort()) {
      const value = rec[key];
      if (typeof value === 'string') out[key] = value;
      else this.problems.push(`${path}.${key} must be a string (quote it in YAML)`);
    }
    return out;
  }
}

interface Meta {
  readonly name: string;
  readonly namespace: string;
  readonly uid: string;
  readonly labels: Labels;
}

/** Reads metadata; namespaced kinds default to "default" and to uid namespace/name. */
function readMeta(r: Reader, obj: unknown, namespaced: boolean): { root: Rec; md: Rec; meta: Meta } {
  if (!isRecord(obj)) {
    r.problems.push('the object is not a mapping');
    return { root: {}, md: {}, meta: { name: '', namespace: '', uid: '', labels: {} } };
  }
  if (obj.metadata === undefined || obj.metadata === null) r.problems.push('metadata is missing');
  const md = r.record(obj.metadata, 'metadata');
  let name = '';
  if (md.name === undefined || md.name === null) {
    if (isRecord(obj.metadata)) r.problems.push('metadata.name is missing');
  } else {
    name = r.string(md.name, 'metadata.name', '');
    if (typeof md.name === 'string' && name === '') r.problems.push('metadata.name is empty');
  }
  let namespace = '';
  if (namespaced) {
    namespace = r.string(md.namespace, 'metadata.namespace', '') || DEFAULT_NAMESPACE;
  }
  const uidText = r.string(md.uid, 'metadata.uid', '');
  const uid = uidText !== '' ? uidText : namespaced ? `${namespace}/${name}` : name;
  const labels = r.labels(md.labels, 'metadata.labels');
  return { root: obj, md, meta: { name, namespace, uid, labels } };
}

function fail(kind: string, meta: Meta, problems: readonly string[]): never {
  const ref = meta.name === '' ? '(unnamed)' : meta.namespace === '' ? meta.name : `${meta.namespace}/${meta.name}`;
  throw new WeirError('WEIR_MANIFEST_OBJECT', `${kind} ${ref}: ${problems.join('; ')}`);
}

export function toPod(obj: unknown, warn: ConvertWarning = ignore): Pod {
  const r = new Reader();
  const { root, md, meta } = readMeta(r, obj, true);
  const spec = r.record(root.spec, 'spec');
  const status = r.record(root.status, 'status');
  const ref = `Pod ${meta.namespace}/${meta.name}`;

  const pod: Pod = {
    uid: meta.uid,
    namespace: meta.namespace,
    name: meta.name,
    labels: meta.labels,
    nodeName: r.string(spec.nodeName, 'spec.nodeName', ''),
    hostNetwork: r.boolean(spec.hostNetwork, 'spec.hostNetwork'),
    phase: r.string(status.phase, 'status.phase', '') || 'Pending',
    terminating: md.deletionTimestamp !== undefined && md.deletionTimestamp !== null,
    ips: readPodIps(r, status, (m) => warn(`${ref}: ${m}`)),
    ports: readPorts(r, spec),
  };
  if (r.problems.length > 0) fail('Pod', meta, r.problems);
  return pod;
}

/** status.podIPs[].ip, else status.podIP; canonical text, invalid ones dropped with a warning. */
function readPodIps(r: Reader, status: Rec, warn: ConvertWarning): string[] {
  const listed = r.array(status.podIPs, 'status.podIPs');
  const raw: { path: string; value: unknown }[] = listed.map((entry, i) => ({
    path: `status.podIPs[${i}].ip`,
    value: isRecord(entry) ? entry.ip : entry,
  }));
  if (raw.length === 0 && status.podIP !== undefined && status.podIP !== null && status.podIP !== '') {
    raw.push({ path: 'status.podIP', value: status.podIP });
  }
  const ips: string[] = [];
  for (const { path, value } of raw) {
    const ip = typeof value === 'string' ? canonicalIp(value) : null;
    if (ip === null) warn(`${path} ${JSON.stringify(value)} is not an IP address; ignored`);
    else if (!ips.includes(ip)) ips.push(ip);
  }
  return ips;
}

/** Named ports of the containers and of sidecars (init containers with restartPolicy Always);
 *  unnamed ports cannot be referenced by a policy, so they are not kept. */
function readPorts(r: Reader, spec: Rec): ContainerPort[] {
  const ports: ContainerPort[] = [];
  const groups: [string, readonly unknown[], boolean][] = [
    ['spec.containers', r.array(spec.containers, 'spec.containers'), false],
    ['spec.initContainers', r.array(spec.initContainers, 'spec.initContainers'), true],
  ];
  for (const [base, containers, sidecarsOnly] of groups) {
    containers.forEach((c, ci) => {
      const cpath = `${base}[${ci}]`;
      const container = r.record(c, cpath);
      if (sidecarsOnly && container.restartPolicy !== 'Always') return;
      r.array(container.ports, `${cpath}.ports`).forEach((p, pi) => {
        const ppath = `${cpath}.ports[${pi}]`;
        const port = r.record(p, ppath);
        if (port.name === undefined || port.name === null || port.name === '') return;
        const before = r.problems.length;
        const name = r.string(port.name, `${ppath}.name`, '');
        const number = port.containerPort;
        if (typeof number !== 'number' || !Number.isInteger(number) || number < 1 || number > 65535) {
          r.problems.push(`${ppath}.containerPort must be an integer from 1 to 65535`);
        }
        const protocol = r.string(port.protocol, `${ppath}.protocol`, 'TCP');
        if (!(PROTOCOLS as readonly string[]).includes(protocol)) {
          r.problems.push(`${ppath}.protocol must be one of ${PROTOCOLS.join(', ')}`);
        }
        if (r.problems.length === before) {
          ports.push({ name, port: number as number, protocol: protocol as Protocol });
        }
      });
    });
  }
  return ports;
}

export function toNamespace(obj: unknown): Namespace {
  const r = new Reader();
  const { meta } = readMeta(r, obj, false);
  if (r.problems.length > 0) fail('Namespace', meta, r.problems);
  // The API server always sets this label, overriding any value given.
  const labels: Record<string, string> = { ...meta.labels, [NAMESPACE_NAME_LABEL]: meta.name };
  return { name: meta.name, labels: sortKeys(labels) };
}

export function toNode(obj: unknown, warn: ConvertWarning = ignore): Node {
  const r = new Reader();
  const { root, meta } = readMeta(r, obj, false);
  const spec = r.record(root.spec, 'spec');
  const listed = r.array(spec.podCIDRs, 'spec.podCIDRs');
  const raw: { path: string; value: unknown }[] = listed.map((value, i) => ({ path: `spec.podCIDRs[${i}]`, value }));
  if (raw.length === 0 && spec.podCIDR !== undefined && spec.podCIDR !== null && spec.podCIDR !== '') {
    raw.push({ path: 'spec.podCIDR', value: spec.podCIDR });
  }
  const podCIDRs: string[] = [];
  for (const { path, value } of raw) {
    const cidr = typeof value === 'string' ? canonicalCidr(value) : null;
    if (cidr === null) warn(`Node ${meta.name}: ${path} ${JSON.stringify(value)} is not a CIDR; ignored`);
    else if (!podCIDRs.includes(cidr)) podCIDRs.push(cidr);
  }
  if (r.problems.length > 0) fail('Node', meta, r.problems);
  return { name: meta.name, podCIDRs };
}

export function toNetworkPolicy(obj: unknown): RawNetworkPolicy {
  const r = new Reader();
  const { root, md, meta } = readMeta(r, obj, true);
  let generation = 1;
  if (md.generation !== undefined && md.generation !== null) {
    if (typeof md.generation === 'number' && Number.isInteger(md.generation) && md.generation >= 1) {
      generation = md.generation;
    } else {
      r.problems.push('metadata.generation must be a positive integer');
    }
  }
  if (r.problems.length > 0) fail('NetworkPolicy', meta, r.problems);
  // The spec goes through as received: compilePolicy validates it and reports precise paths.
  return { namespace: meta.namespace, name: meta.name, uid: meta.uid, generation, spec: root.spec };
}

function sortKeys(labels: Record<string, string>): Labels {
  const out: Record<string, string> = {};
  for (const k of Object.keys(labels).sort()) out[k] = labels[k];
  return out;
}
