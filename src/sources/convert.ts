// Kubernetes JSON objects (from the API server or a manifest) into model objects.
// Shared by the manifest and kube sources so both emit identical events: it applies the
// defaults the API server would, keeps only the fields the model needs, and reports every
// problem of an object at once. A NetworkPolicy or ClusterNetworkPolicy is never dropped for its
// metadata: it reaches the model invalid (readNetworkPolicy, readClusterNetworkPolicy). No file
// or network knowledge here.

import { WeirError } from '../errors.ts';
import { isRecord } from '../records.ts';
import { canonicalCidr, canonicalIp } from '../model/cidr.ts';
import { NAMESPACE_NAME_LABEL } from '../model/cluster.ts';
import { AUDIT_ANNOTATION, CUT_EXISTING_ANNOTATION, weirAnnotations } from '../model/annotations.ts';
import { PROTOCOLS } from '../model/types.ts';
import { describeValue, exact } from '../model/selector.ts';
import { type Interner, NO_INTERNING } from './intern.ts';
import type { ContainerPort, Labels, Namespace, Node, Pod, PolicyError, Protocol, RawClusterNetworkPolicy, RawNetworkPolicy, RawPolicyObject } from '../model/types.ts';

/** Receives problems that do not stop the conversion (an invalid IP that is dropped). */
export type ConvertWarning = (message: string) => void;

const DEFAULT_NAMESPACE = 'default';
const ignore: ConvertWarning = () => {};

type Rec = Record<string, unknown>;

/** What was found, for a message: YAML reads an unquoted `2` as a number. */
function describe(v: unknown): string {
  return typeof v === 'number' ? `the number ${v}` : describeValue(v);
}

/** A value YAML reads as another type than the string meant: quoting it makes it one. */
function quotable(v: unknown): boolean {
  return v === null || typeof v === 'number' || typeof v === 'boolean';
}

/** A field path ('' for the whole object) and what is wrong there; a NetworkPolicy's become
 *  its errors as they are. */
type Problem = PolicyError;

/** One problem as a message of Pod, Namespace or Node ("metadata.name is missing"). */
function problemText(p: Problem): string {
  return `${p.path === '' ? 'the object' : p.path} ${p.message}`;
}

/** Reads fields of one object, collecting every problem (a field path and what is wrong with
 *  it) instead of stopping at the first. */
class Reader {
  readonly problems: Problem[] = [];

  problem(path: string, message: string): void {
    this.problems.push({ path, message });
  }

  record(v: unknown, path: string): Rec {
    if (v === undefined || v === null) return {};
    if (isRecord(v)) return v;
    this.problem(path, `must be an object, got ${describe(v)}`);
    return {};
  }

  array(v: unknown, path: string): readonly unknown[] {
    if (v === undefined || v === null) return [];
    if (Array.isArray(v)) return v;
    this.problem(path, `must be a list, got ${describe(v)}`);
    return [];
  }

  string(v: unknown, path: string, fallback: string): string {
    if (v === undefined || v === null) return fallback;
    if (typeof v === 'string') return v;
    this.notString(v, path);
    return fallback;
  }

  notString(v: unknown, path: string): void {
    this.problem(path, `must be a string, got ${describe(v)}${quotable(v) ? ' (quote it in YAML)' : ''}`);
  }

  boolean(v: unknown, path: string): boolean {
    if (v === undefined || v === null) return false;
    if (typeof v === 'boolean') return v;
    this.problem(path, `must be true or false, got ${describe(v)}`);
    return false;
  }

  /** A map of strings (labels, annotations). */
  stringMap(v: unknown, path: string): Record<string, string> {
    const out: Record<string, string> = {};
    const rec = this.record(v, path);
    for (const key of Object.keys(rec).sort()) {
      const value = rec[key];
      if (typeof value === 'string') out[key] = value;
      else this.notString(value, keyPath(path, key));
    }
    return out;
  }
}

/** `metadata.labels.version`; a key with dots or slashes in brackets, so the path stays one. */
function keyPath(path: string, key: string): string {
  return /^[A-Za-z0-9_-]+$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

interface Meta {
  readonly name: string;
  readonly namespace: string;
  readonly uid: string;
  readonly labels: Labels;
  /** Only weir.dev/ keys (weirAnnotations). */
  readonly annotations: Labels;
  /** false: the name is missing or not a string (name is then ''). */
  readonly nameReadable: boolean;
  /** false: the namespace is not a string, or metadata is not a mapping (namespace is then ''). */
  readonly namespaceReadable: boolean;
}

/** Reads metadata, labels and annotations included (the API server refuses an object whose
 *  labels or annotations are not strings). Namespaced kinds default to "default", and uid to
 *  namespace/name. */
function readMeta(r: Reader, obj: unknown, namespaced: boolean): { root: Rec; md: Rec; meta: Meta } {
  if (!isRecord(obj)) {
    r.problem('', `must be a mapping, got ${describe(obj)}`);
    return { root: {}, md: {}, meta: { name: '', namespace: '', uid: '', labels: {}, annotations: {}, nameReadable: false, namespaceReadable: !namespaced } };
  }
  if (obj.metadata === undefined || obj.metadata === null) r.problem('metadata', 'is missing');
  const mdReadable = obj.metadata === undefined || obj.metadata === null || isRecord(obj.metadata);
  const md = r.record(obj.metadata, 'metadata');
  let name = '';
  if (md.name === undefined || md.name === null) {
    if (isRecord(obj.metadata)) r.problem('metadata.name', 'is missing');
  } else {
    name = r.string(md.name, 'metadata.name', '');
    if (typeof md.name === 'string' && name === '') r.problem('metadata.name', 'is empty');
  }
  let namespace = '';
  let namespaceReadable = mdReadable;
  if (namespaced && mdReadable) {
    namespaceReadable = md.namespace === undefined || md.namespace === null || typeof md.namespace === 'string';
    namespace = r.string(md.namespace, 'metadata.namespace', '') || (namespaceReadable ? DEFAULT_NAMESPACE : '');
  }
  const uidText = r.string(md.uid, 'metadata.uid', '');
  const uid = uidText !== '' ? uidText : namespaced ? `${namespace}/${name}` : name;
  const labels = r.stringMap(md.labels, 'metadata.labels');
  const annotations = weirAnnotations(r.stringMap(md.annotations, 'metadata.annotations'));
  return { root: obj, md, meta: { name, namespace, uid, labels, annotations, nameReadable: name !== '', namespaceReadable: namespaced ? namespaceReadable : true } };
}

function fail(kind: string, meta: Pick<Meta, 'name' | 'namespace'>, problems: readonly Problem[]): never {
  const ref = meta.name === '' ? '(unnamed)' : meta.namespace === '' ? meta.name : `${meta.namespace}/${meta.name}`;
  throw new WeirError('WEIR_MANIFEST_OBJECT', `${kind} ${ref}: ${problems.map(problemText).join('; ')}`);
}

/** `intern`: shares the values pods repeat (see intern.ts); a source holding many pods passes one. */
export function toPod(obj: unknown, warn: ConvertWarning = ignore, intern: Interner = NO_INTERNING): Pod {
  const r = new Reader();
  const { root, md, meta } = readMeta(r, obj, true);
  const spec = r.record(root.spec, 'spec');
  const status = r.record(root.status, 'status');
  const ref = `Pod ${meta.namespace}/${meta.name}`;

  const pod: Pod = {
    uid: meta.uid,
    namespace: intern.string(meta.namespace),
    name: meta.name,
    labels: intern.labels(meta.labels),
    nodeName: intern.string(r.string(spec.nodeName, 'spec.nodeName', '')),
    hostNetwork: r.boolean(spec.hostNetwork, 'spec.hostNetwork'),
    phase: intern.string(r.string(status.phase, 'status.phase', '') || 'Pending'),
    terminating: md.deletionTimestamp !== undefined && md.deletionTimestamp !== null,
    ips: exact(readPodIps(r, status, (m) => warn(`${ref}: ${m}`))),
    ports: intern.ports(exact(readPorts(r, spec))),
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
          r.problem(`${ppath}.containerPort`, `must be an integer from 1 to 65535, got ${describe(number)}`);
        }
        const protocol = r.string(port.protocol, `${ppath}.protocol`, 'TCP');
        if (!(PROTOCOLS as readonly string[]).includes(protocol)) {
          r.problem(`${ppath}.protocol`, `must be one of ${PROTOCOLS.join(', ')}, got ${describe(protocol)}`);
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
  const audit = meta.annotations[AUDIT_ANNOTATION];
  const cutExisting = meta.annotations[CUT_EXISTING_ANNOTATION];
  return { name: meta.name, labels: sortKeys(labels), ...(audit !== undefined ? { audit } : {}), ...(cutExisting !== undefined ? { cutExisting } : {}) };
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

/** The name of a Namespace object that does not convert, when that much can be read. */
export function namespaceNameOf(obj: unknown): string | null {
  const { meta } = readMeta(new Reader(), obj, false);
  return meta.nameReadable ? meta.name : null;
}

/** A NetworkPolicy as the model is to see it, however broken its metadata. */
export interface PolicyReading {
  /** For the model. Every problem found outside the spec is in its `errors`, at its field path:
   *  the model then reads it as invalid, so it allows nothing and the pods it selects stay
   *  isolated in the directions it names. */
  readonly policy: RawNetworkPolicy;
  /** metadata.namespace cannot be read: `policy.namespace` is '' and the policy may have
   *  isolated pods of any namespace. */
  readonly anyNamespace: boolean;
}

/**
 * Reads a NetworkPolicy without ever dropping it: the API server would refuse one whose
 * metadata is broken, but the pods it was written to isolate exist, so it fails closed the way
 * an invalid spec does. `unreadableName` stands in for a name that cannot be read (or whose
 * namespace cannot); it must not be a valid Kubernetes name, so it never replaces a real
 * policy. `sourceErrors`: what the caller found wrong around the object (its apiVersion);
 * they come first.
 */
export function readNetworkPolicy(obj: unknown, unreadableName: string, sourceErrors: readonly PolicyError[] = []): PolicyReading {
  const r = new Reader();
  r.problems.push(...sourceErrors);
  const { root, md, meta } = readMeta(r, obj, true);
  const generation = readGeneration(r, md);
  const identified = meta.nameReadable && meta.namespaceReadable;
  const name = identified ? meta.name : unreadableName;
  const uid = identified ? meta.uid : `${meta.namespace}/${name}`;
  // The spec goes through as received, even beside errors: compilePolicy reports precise
  // paths and still reads podSelector and policyTypes, so the policy isolates exactly what it
  // would have.
  const policy: RawNetworkPolicy = { namespace: meta.namespace, name, uid, generation, spec: root.spec, ...annotationsAndErrors(r, meta) };
  return { policy, anyNamespace: !meta.namespaceReadable };
}

/** For the kube source, where the API server guarantees name and namespace: a policy whose
 *  identity cannot be read throws WEIR_MANIFEST_OBJECT; any other problem is carried. */
export function toNetworkPolicy(obj: unknown): RawNetworkPolicy {
  const { policy, anyNamespace } = readNetworkPolicy(obj, '');
  if (anyNamespace || policy.name === '') fail('NetworkPolicy', policy, policy.errors ?? []);
  return policy;
}

/** metadata.generation: 1 when absent (a manifest), a problem when not a positive integer. */
function readGeneration(r: Reader, md: Rec): number {
  if (md.generation === undefined || md.generation === null) return 1;
  if (typeof md.generation === 'number' && Number.isInteger(md.generation) && md.generation >= 1) return md.generation;
  r.problem('metadata.generation', `must be a positive integer, got ${describe(md.generation)}`);
  return 1;
}

/**
 * Reads a ClusterNetworkPolicy without ever dropping it, as readNetworkPolicy does: each problem
 * outside the spec goes into its errors, so the model fails it closed. Cluster-scoped: a
 * metadata.namespace is ignored, as the API server ignores it. `unreadableName` stands in for a
 * name that cannot be read; it must not be a valid Kubernetes name.
 */
export function readClusterNetworkPolicy(obj: unknown, unreadableName: string, sourceErrors: readonly PolicyError[] = []): RawClusterNetworkPolicy {
  const r = new Reader();
  r.problems.push(...sourceErrors);
  const { root, md, meta } = readMeta(r, obj, false);
  const generation = readGeneration(r, md);
  const name = meta.nameReadable ? meta.name : unreadableName;
  const uid = meta.nameReadable ? meta.uid : name;
  return { name, uid, generation, spec: root.spec, ...annotationsAndErrors(r, meta) };
}

/** A policy's `annotations` and `errors`, each only when there is one. A whole object that is
 *  no mapping has its error at "(object)" (never from a manifest: parse.ts skips what is no
 *  mapping; an API object always is one). */
function annotationsAndErrors(r: Reader, meta: Meta): Pick<RawPolicyObject, 'annotations' | 'errors'> {
  const errors = r.problems.map((p) => (p.path === '' ? { ...p, path: '(object)' } : p));
  return { ...(Object.keys(meta.annotations).length > 0 ? { annotations: meta.annotations } : {}), ...(errors.length > 0 ? { errors } : {}) };
}

/** For the kube source: a policy without a readable name throws WEIR_MANIFEST_OBJECT; any other
 *  problem is carried. */
export function toClusterNetworkPolicy(obj: unknown): RawClusterNetworkPolicy {
  const policy = readClusterNetworkPolicy(obj, '');
  if (policy.name === '') fail('ClusterNetworkPolicy', { name: '', namespace: '' }, policy.errors ?? []);
  return policy;
}

function sortKeys(labels: Record<string, string>): Labels {
  const out: Record<string, string> = {};
  for (const k of Object.keys(labels).sort()) out[k] = labels[k];
  return out;
}
