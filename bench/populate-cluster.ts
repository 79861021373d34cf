// A real kube-apiserver filled with a cluster of bench/synthetic.ts's shapes, as a kubelet and a
// user would write it: Namespaces, NetworkPolicies, Nodes, and Pods (created, then their status
// through the status subresource). Shared by bench:agent and bench:controller, which measure a
// Weir process against the same cluster. Writes go through bench/peers/api.ts (HTTP straight to
// the API server, bounded concurrency, retried while the API server is overloaded).

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { Pod, RawNetworkPolicy } from '../src/model/types.ts';
import { type ControlPlane, startControlPlane } from '../test/integration/controlplane.ts';
import { Api, ApiError, type KubeObject } from './peers/api.ts';
import { makeNamespace, makePod, makePolicy, type SyntheticSize } from './synthetic.ts';

const CRDS = join(fileURLToPath(new URL('../', import.meta.url)), 'crds');

export const secs = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;
/** Progress goes to stderr, so stdout holds the figures alone. */
export const progress = (s: string): void => void process.stderr.write(`  .. ${s}\n`);

/** Starts the bench's etcd and kube-apiserver, saying how long they took. */
export async function startApiServer(log: (s: string) => void): Promise<ControlPlane> {
  progress('starting etcd and kube-apiserver');
  const cp = await startControlPlane();
  log(`kube-apiserver ready in ${secs(cp.startMs)} at ${cp.server}`);
  return cp;
}

export function loadAverage(): number {
  return Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
}

/** Waits up to `seconds` for the load average to fall under 1 (populating leaves it high). */
export async function settle(seconds: number): Promise<void> {
  if (seconds <= 0) return;
  const until = performance.now() + seconds * 1000;
  progress(`waiting up to ${seconds} s for the load average (${loadAverage().toFixed(2)}) to fall under 1`);
  while (loadAverage() >= 1 && performance.now() < until) await sleep(2000);
}

// ---------------------------------------------------------------------------------------------
// API objects of the synthetic shapes

/** The number of node `node-N`. */
export const nodeNumber = (nodeName: string): number => Number(nodeName.slice(nodeName.lastIndexOf('-') + 1));

/** A node's address (status.hostIP of its pods). */
export const hostIPOf = (nodeName: string): string => {
  const n = nodeNumber(nodeName);
  return `100.64.${(n >> 8) & 255}.${n & 255}`;
};

/** IPv6 in canonical text (synthetic.ts writes fd00::0:1f, the API server's strict validation
 *  wants fd00::1f). */
export const canonicalIp = (ip: string): string => (ip.includes(':') ? new URL(`http://[${ip}]/`).hostname.slice(1, -1) : ip);

/** Node n with the pod ranges synthetic.ts's podIps draws its pods' addresses from. */
export function nodeObject(n: number): KubeObject {
  const v4 = `10.${n >> 4}.${(n & 15) << 4}.0/20`;
  const v6 = canonicalIp(n === 0 ? 'fd00::' : `fd00::${n.toString(16)}:0`);
  return { apiVersion: 'v1', kind: 'Node', metadata: { name: `node-${n}` }, spec: { podCIDR: v4, podCIDRs: [v4, `${v6}/112`] } };
}

export function podObject(p: Pod): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: p.name, namespace: p.namespace, labels: { ...p.labels } },
    spec: {
      nodeName: p.nodeName,
      containers: [{ name: 'app', image: 'registry.invalid/weir-bench', ports: p.ports.map((x) => ({ name: x.name, containerPort: x.port, protocol: x.protocol })) }],
    },
  };
}

export function podStatus(p: Pod): unknown {
  const hostIP = hostIPOf(p.nodeName);
  const ips = p.ips.map(canonicalIp);
  return {
    status: {
      phase: 'Running',
      hostIP,
      hostIPs: [{ ip: hostIP }],
      podIP: ips[0],
      podIPs: ips.map((ip) => ({ ip })),
      conditions: [{ type: 'Ready', status: 'True' }],
    },
  };
}

export const namespaceObject = (i: number): KubeObject => {
  const ns = makeNamespace(i);
  return { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns.name, labels: { ...ns.labels } } };
};

export const policyObject = (p: RawNetworkPolicy): KubeObject => ({
  apiVersion: 'networking.k8s.io/v1',
  kind: 'NetworkPolicy',
  metadata: { namespace: p.namespace, name: p.name },
  spec: p.spec,
});

export const collection = (kind: 'Pod' | 'NetworkPolicy' | 'Namespace' | 'Node', namespace?: string): string =>
  kind === 'Namespace'
    ? '/api/v1/namespaces'
    : kind === 'Node'
      ? '/api/v1/nodes'
      : kind === 'Pod'
        ? `/api/v1/namespaces/${namespace}/pods`
        : `/apis/networking.k8s.io/v1/namespaces/${namespace}/networkpolicies`;

// ---------------------------------------------------------------------------------------------
// Writing

/** API clients: one keep-alive pool of 16 sockets each (bench/peers/api.ts), enough of them for
 *  the concurrency asked for. */
export class Clients {
  readonly all: Api[];
  #next = 0;
  constructor(cp: ControlPlane, n: number) {
    this.all = Array.from({ length: Math.max(1, Math.ceil(n / 16)) }, () => new Api(cp.server, cp.token, cp.kubeconfig));
  }
  get one(): Api {
    return this.all[0];
  }
  pick(): Api {
    return this.all[this.#next++ % this.all.length];
  }
  close(): void {
    for (const a of this.all) a.close();
  }
}

/** Retries what an overloaded API server answers (429, 5xx, a dropped connection); resolves
 *  with the answer, or undefined for a create that turns out to exist (a retry of one that had
 *  succeeded, when `create`). */
export async function withRetry<T>(what: string, fn: () => Promise<T>, create = false): Promise<T | undefined> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (e) {
      if (create && e instanceof ApiError && e.status === 409) return undefined;
      const transient = !(e instanceof ApiError) || e.status === 429 || e.status >= 500;
      if (!transient || attempt >= 8) throw new Error(`${what}: ${(e as Error).message}`, { cause: e });
      await sleep(Math.min(5000, 100 * 2 ** attempt));
    }
  }
}

/** Runs `fn` for 0..n-1 with `limit` in flight; stops taking new work after the first error or
 *  when `stop()` says so. Resolves with how many succeeded and the first error. */
export async function pool(n: number, limit: number, fn: (i: number) => Promise<void>, stop: () => boolean = () => false): Promise<{ done: number; error?: Error }> {
  let next = 0;
  let done = 0;
  let error: Error | undefined;
  const worker = async (): Promise<void> => {
    while (next < n && error === undefined && !stop()) {
      const i = next++;
      try {
        await fn(i);
        done++;
      } catch (e) {
        error ??= e as Error;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, n) }, worker));
  return { done, error };
}

/** Logs progress every 10 s while `work` runs. */
export async function withProgress<T>(what: string, total: number, count: () => number, work: Promise<T>): Promise<T> {
  const t0 = performance.now();
  const timer = setInterval(() => {
    const c = count();
    const rate = c / ((performance.now() - t0) / 1000);
    progress(`${what}: ${c}/${total} (${rate.toFixed(0)}/s, ${rate > 0 ? `about ${secs(((total - c) / rate) * 1000)} to go` : '?'}; load ${loadAverage().toFixed(2)})`);
  }, 10_000);
  try {
    return await work;
  } finally {
    clearInterval(timer);
  }
}

export interface PopulateOptions {
  readonly size: SyntheticSize;
  /** API writes in flight. */
  readonly concurrency: number;
  /** Stop creating pods after this long (from the first namespace) and keep what exists; 0: no limit. */
  readonly maxPopulateS: number;
  /** Node objects node-0 .. node-(nodes-1), each with its pod ranges, its address and Ready. */
  readonly nodes: number;
  /** Lines of figures (stdout). */
  readonly log: (line: string) => void;
}

export interface Population {
  /** Pods 0 .. pods-1 exist (creation stops in index order). */
  readonly pods: number;
  readonly namespaces: number;
  readonly policies: number;
  readonly podsError?: string;
  /** Each created Node's uid, by its number. */
  readonly nodeUids: readonly string[];
  /** Each policy's uid and generation as the API server gave them, by its index j. */
  readonly policyRefs: readonly { readonly uid: string; readonly generation: number }[];
}

type Created = { metadata: { uid: string; generation?: number } };

/** Creates an object; when it exists already (a retried create that had succeeded), reads it. */
async function create(api: Api, what: string, path: string, body: KubeObject): Promise<Created> {
  const made = await withRetry(what, () => api.request<Created>('POST', `${path}?fieldManager=weir-bench`, body), true);
  return made ?? (await withRetry(what, () => api.request<Created>('GET', `${path}/${body.metadata.name}`)))!;
}

export async function populate(cp: ControlPlane, clients: Clients, o: PopulateOptions): Promise<Population> {
  const { size, concurrency, log } = o;
  // Status objects: their CRDs exist, as in a real install.
  await cp.kubectl(['apply', '-f', CRDS]);
  await cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/nodepolicystatuses.weir.dev', 'crd/networkpolicystatuses.weir.dev']);

  const t0 = performance.now();
  let t = t0;
  const nodeUids: string[] = [];
  const nodes = await pool(o.nodes, concurrency, async (n) => {
    const node = nodeObject(n);
    nodeUids[n] = (await create(clients.pick(), `node ${n}`, collection('Node'), node)).metadata.uid;
    await withRetry(`status of node ${n}`, () =>
      clients
        .pick()
        .patch(
          'Node',
          undefined,
          node.metadata.name,
          { status: { addresses: [{ type: 'InternalIP', address: hostIPOf(node.metadata.name) }], conditions: [{ type: 'Ready', status: 'True' }] } },
          'status',
        ),
    );
  });
  if (nodes.error) throw nodes.error;
  const nodesMs = performance.now() - t;

  t = performance.now();
  let count = 0;
  const ns = await withProgress(
    'namespaces',
    size.namespaces,
    () => count,
    pool(size.namespaces, concurrency, async (i) => {
      await withRetry(`namespace ${i}`, () => clients.pick().request('POST', `${collection('Namespace')}?fieldManager=weir-bench`, namespaceObject(i)), true);
      count++;
    }),
  );
  if (ns.error) throw ns.error;
  const nsMs = performance.now() - t;

  t = performance.now();
  count = 0;
  const policyRefs: { uid: string; generation: number }[] = [];
  const pol = await withProgress(
    'policies',
    size.policies,
    () => count,
    pool(size.policies, concurrency, async (j) => {
      const p = makePolicy(j, size);
      const made = await create(clients.pick(), `policy ${p.namespace}/${p.name}`, collection('NetworkPolicy', p.namespace), policyObject(p));
      policyRefs[j] = { uid: made.metadata.uid, generation: made.metadata.generation ?? 1 };
      count++;
    }),
  );
  if (pol.error) throw pol.error;
  const polMs = performance.now() - t;

  t = performance.now();
  count = 0;
  // Each pod as a kubelet sees it: created (Pending, no address), then its status (Running,
  // its IPs and its node's address) through the status subresource.
  const deadline = o.maxPopulateS > 0 ? t0 + o.maxPopulateS * 1000 : Number.POSITIVE_INFINITY;
  const pods = await withProgress(
    'pods (create + status)',
    size.pods,
    () => count,
    pool(
      size.pods,
      concurrency,
      async (i) => {
        const p = makePod(i, size);
        const a = clients.pick();
        await withRetry(`pod ${p.namespace}/${p.name}`, () => a.request('POST', `${collection('Pod', p.namespace)}?fieldManager=weir-bench`, podObject(p)), true);
        await withRetry(`status of pod ${p.namespace}/${p.name}`, () => a.patch('Pod', p.namespace, p.name, podStatus(p), 'status'));
        count++;
      },
      () => performance.now() > deadline,
    ),
  );
  const podsMs = performance.now() - t;
  const total = performance.now() - t0;
  const rate = (n: number, ms: number) => `${((n / ms) * 1000).toFixed(0)}/s`;
  log(`nodes:      ${nodes.done} in ${secs(nodesMs)}`);
  log(`namespaces: ${ns.done} in ${secs(nsMs)} (${rate(ns.done, nsMs)})`);
  log(`policies:   ${pol.done} in ${secs(polMs)} (${rate(pol.done, polMs)})`);
  log(`pods:       ${pods.done} in ${secs(podsMs)} (${rate(pods.done, podsMs)} pods, ${rate(2 * pods.done, podsMs)} writes: create + status)`);
  log(`populated in ${secs(total)}, ${concurrency} writes in flight`);
  let podsError: string | undefined;
  if (pods.error) podsError = `the API server stopped taking pods after ${pods.done}: ${pods.error.message}`;
  else if (pods.done < size.pods) podsError = `--max-populate-s=${o.maxPopulateS} reached after ${pods.done} pods`;
  if (podsError) log(`NOT FULL SIZE: ${podsError}; measuring the ${pods.done} pods that exist`);
  return { pods: pods.done, namespaces: ns.done, policies: pol.done, podsError, nodeUids, policyRefs };
}

/** A bench flag's number: the flag, else the environment, else the default; never negative. */
export function benchNumber(v: string | undefined, env: string | undefined, d: number): number {
  const n = Number(v ?? env ?? d);
  if (!Number.isFinite(n) || n < 0) throw new Error(`not a number: ${v ?? env}`);
  return n;
}
