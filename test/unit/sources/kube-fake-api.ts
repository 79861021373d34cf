// A loopback fake of the Kubernetes API server for the collections the kube source reads:
// paginated lists and chunked watch streams, with the faults a real server will not produce on
// demand (HTTP errors, held or stalled responses, ended streams, compacted history), and a CRD's
// collection that is not served until it is installed. Its server core is
// test/support/fake-api-server.ts, shared with the status writers' read-write fake.

import type { IncomingMessage, ServerResponse } from 'node:http';
import type { KubeConfig } from '@kubernetes/client-node';
import { LoopbackApi, type Obj, sendEvent, sendListPage, sendStatus } from '../../support/fake-api-server.ts';

export type Kind = 'Pod' | 'Namespace' | 'Node' | 'NetworkPolicy' | 'ClusterNetworkPolicy';

const PATHS: Record<Kind, string> = {
  Pod: '/api/v1/pods',
  Namespace: '/api/v1/namespaces',
  Node: '/api/v1/nodes',
  NetworkPolicy: '/apis/networking.k8s.io/v1/networkpolicies',
  ClusterNetworkPolicy: '/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies',
};
const NAMESPACED: Record<Kind, boolean> = { Pod: true, Namespace: false, Node: false, NetworkPolicy: true, ClusterNetworkPolicy: false };
/** Kinds of a CRD: not served (404, as a real server answers) until `serve` installs it. */
const CRD_KINDS: readonly Kind[] = ['ClusterNetworkPolicy'];
export const TOKEN = 'fake-token';

/** What the next list or watch request of a kind gets instead of a normal answer. */
export type Fault =
  | { readonly status: number; readonly reason?: string }
  /** Answer once the promise resolves: normally, or with `status` when given. */
  | { readonly hold: Promise<void>; readonly status?: number; readonly reason?: string }
  /** (watch) 200 and headers, then nothing at all, ever. */
  | { readonly stall: true }
  /** (list) 200, then the connection dies halfway through the body. */
  | { readonly truncate: true };

export interface RequestRecord {
  readonly kind: Kind;
  readonly verb: 'list' | 'watch';
  readonly query: URLSearchParams;
}

interface Watcher {
  readonly kind: Kind;
  readonly res: ServerResponse;
  readonly name: string | null;
  readonly stalled: boolean;
}

interface HistoryEvent {
  readonly rv: number;
  readonly type: string;
  readonly object: Obj;
}

export class FakeApiServer {
  rv = 1000;
  readonly requests: RequestRecord[] = [];
  private readonly objects = new Map<Kind, Map<string, Obj>>();
  private readonly history = new Map<Kind, HistoryEvent[]>();
  /** Watches from a resourceVersion below this get 410 Gone. */
  private readonly oldest = new Map<Kind, number>();
  private readonly faults = new Map<string, Fault[]>();
  private readonly server = new LoopbackApi<Watcher>((req, res) => this.handle(req, res));
  private uidSeq = 0;
  private readonly served = new Set<Kind>((Object.keys(PATHS) as Kind[]).filter((k) => !CRD_KINDS.includes(k)));

  start(): Promise<void> {
    return this.server.start();
  }

  close(): Promise<void> {
    return this.server.close();
  }

  kubeConfig(token = TOKEN): KubeConfig {
    return this.server.kubeConfig(token);
  }

  /** Installs (true) or removes (false) the CRD of a kind: unserved, its path answers 404 and
   *  its open watches end. */
  serve(kind: Kind, on: boolean): void {
    if (on) this.served.add(kind);
    else {
      this.served.delete(kind);
      this.endWatches(kind);
    }
  }

  /** Queues a fault for the next list or watch request of a kind. */
  fault(kind: Kind, verb: 'list' | 'watch', f: Fault): void {
    const k = `${kind} ${verb}`;
    this.faults.set(k, [...(this.faults.get(k) ?? []), f]);
  }

  requestsOf(kind: Kind, verb: 'list' | 'watch'): RequestRecord[] {
    return this.requests.filter((r) => r.kind === kind && r.verb === verb);
  }

  openWatches(kind: Kind): number {
    return [...this.server.watches].filter((w) => w.kind === kind).length;
  }

  /** The stored object (as served, with uid and resourceVersion). */
  get(kind: Kind, key: string): Obj {
    const o = this.store(kind).get(key);
    if (o === undefined) throw new Error(`no ${kind} ${key}`);
    return o;
  }

  /** Creates or replaces an object; `silent` leaves watchers uninformed (a missed event). */
  set(kind: Kind, object: Obj, opts: { silent?: boolean } = {}): Obj {
    const key = keyOf(kind, object);
    const prev = this.store(kind).get(key);
    const md = { ...object.metadata };
    md.uid ??= (prev?.metadata.uid as string | undefined) ?? `uid-${++this.uidSeq}`;
    // As the API server's strategy for NetworkPolicy: generation 1 at creation, one more with
    // every change of the spec (Weir compares held policies by it).
    if ((kind === 'NetworkPolicy' || kind === 'ClusterNetworkPolicy') && !('generation' in md)) {
      const before = prev?.metadata.generation as number | undefined;
      md.generation = before === undefined ? 1 : JSON.stringify(prev?.spec) === JSON.stringify(object.spec) ? before : before + 1;
    }
    md.resourceVersion = String(++this.rv);
    const stored: Obj = { ...object, metadata: md };
    this.store(kind).set(key, stored);
    this.record(kind, prev === undefined ? 'ADDED' : 'MODIFIED', stored, opts.silent ?? false);
    return stored;
  }

  remove(kind: Kind, key: string, opts: { silent?: boolean } = {}): void {
    const prev = this.store(kind).get(key);
    if (prev === undefined) throw new Error(`no ${kind} ${key}`);
    this.store(kind).delete(key);
    const gone: Obj = { ...prev, metadata: { ...prev.metadata, resourceVersion: String(++this.rv) } };
    this.record(kind, 'DELETED', gone, opts.silent ?? false);
  }

  /** Sends a BOOKMARK at the current resourceVersion to the open watches of a kind. */
  bookmark(kind: Kind): string {
    const rv = String(this.rv);
    this.broadcast(kind, 'BOOKMARK', { kind: kind, apiVersion: 'v1', metadata: { resourceVersion: rv } } as Obj);
    return rv;
  }

  /** Ends every open watch stream of a kind, as the server does at timeoutSeconds. */
  endWatches(kind: Kind): void {
    this.server.endWatches((w) => w.kind === kind);
  }

  /** Forgets the history of a kind: a watch resuming from before now gets 410 Gone. */
  compact(kind: Kind): void {
    this.oldest.set(kind, this.rv);
    this.history.set(kind, []);
  }

  private store(kind: Kind): Map<string, Obj> {
    let m = this.objects.get(kind);
    if (m === undefined) this.objects.set(kind, (m = new Map()));
    return m;
  }

  private record(kind: Kind, type: string, object: Obj, silent: boolean): void {
    const rv = Number(object.metadata.resourceVersion);
    if (!silent) {
      this.history.set(kind, [...(this.history.get(kind) ?? []), { rv, type, object }]);
      this.broadcast(kind, type, object);
    }
  }

  private broadcast(kind: Kind, type: string, object: Obj): void {
    for (const w of this.server.watches) {
      if (w.kind !== kind || w.stalled) continue;
      if (w.name !== null && object.metadata.name !== w.name && type !== 'BOOKMARK') continue;
      sendEvent(w, type, object);
    }
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://fake');
    const kind = (Object.keys(PATHS) as Kind[]).find((k) => PATHS[k] === url.pathname);
    if (req.headers.authorization !== `Bearer ${TOKEN}`) return sendStatus(res, 401, 'Unauthorized', 'bad token');
    if (kind === undefined || req.method !== 'GET') return sendStatus(res, 404, 'NotFound', `no route ${url.pathname}`);
    const verb = url.searchParams.get('watch') === 'true' ? 'watch' : 'list';
    this.requests.push({ kind, verb, query: url.searchParams });
    if (!this.served.has(kind)) return sendStatus(res, 404, 'NotFound', 'the server could not find the requested resource');
    const fault = this.faults.get(`${kind} ${verb}`)?.shift();
    if (fault !== undefined && 'hold' in fault) await fault.hold;
    if (fault !== undefined && 'status' in fault && fault.status !== undefined) return sendStatus(res, fault.status, fault.reason ?? 'Failure', `injected ${fault.status}`);
    const selector = url.searchParams.get('fieldSelector');
    const name = selector?.startsWith('metadata.name=') ? selector.slice('metadata.name='.length) : null;
    if (verb === 'list') return this.list(kind, url.searchParams, name, res, fault !== undefined && 'truncate' in fault);
    this.watch(kind, url.searchParams, name, res, fault !== undefined && 'stall' in fault);
  }

  private list(kind: Kind, q: URLSearchParams, name: string | null, res: ServerResponse, truncate: boolean): void {
    const all = [...this.store(kind).entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, o]) => o)
      .filter((o) => name === null || o.metadata.name === name);
    sendListPage(res, `${kind}List`, all, q, this.rv, truncate);
  }

  private watch(kind: Kind, q: URLSearchParams, name: string | null, res: ServerResponse, stalled: boolean): void {
    const w: Watcher = { kind, res, name, stalled };
    this.server.openWatch(w);
    if (stalled) return;
    const from = q.get('resourceVersion');
    if (from === null || from === '' || from === '0') {
      for (const o of this.store(kind).values()) this.broadcastTo(w, 'ADDED', o);
      return;
    }
    if (Number(from) < (this.oldest.get(kind) ?? 0)) {
      this.server.gone(w, from);
      return;
    }
    for (const e of this.history.get(kind) ?? []) if (e.rv > Number(from)) this.broadcastTo(w, e.type, e.object);
  }

  private broadcastTo(w: Watcher, type: string, object: Obj): void {
    if (w.name !== null && object.metadata.name !== w.name) return;
    sendEvent(w, type, object);
  }
}

function keyOf(kind: Kind, o: Obj): string {
  const name = String(o.metadata.name);
  return NAMESPACED[kind] ? `${String(o.metadata.namespace ?? 'default')}/${name}` : name;
}

// ---- raw objects as the API server serves them ----------------------------------------------

export function pod(namespace: string, name: string, o: { uid?: string; labels?: Record<string, string>; ip?: string; node?: string } = {}): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace, ...(o.uid ? { uid: o.uid } : {}), labels: o.labels ?? {}, annotations: { 'weir.test/noise': 'x' } },
    spec: { nodeName: o.node ?? 'node-a', containers: [{ name: 'c', image: 'busybox', ports: [{ name: 'http', containerPort: 8080 }] }] },
    status: { phase: 'Running', podIP: o.ip ?? '10.0.0.1', podIPs: [{ ip: o.ip ?? '10.0.0.1' }] },
  };
}

export function namespace(name: string, labels: Record<string, string> = {}): Obj {
  return { apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels }, spec: { finalizers: ['kubernetes'] }, status: { phase: 'Active' } };
}

export function node(name: string, podCIDR: string): Obj {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name }, spec: { podCIDR, podCIDRs: [podCIDR] } };
}

export function networkPolicy(namespace: string, name: string, spec: unknown): Obj {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name, namespace }, spec };
}

export function clusterNetworkPolicy(name: string, spec: unknown, status?: unknown): Obj {
  return { apiVersion: 'policy.networking.k8s.io/v1beta1', kind: 'ClusterNetworkPolicy', metadata: { name }, spec, ...(status === undefined ? {} : { status }) };
}
