// A small client of the bench's real kube-apiserver: one keep-alive HTTPS pool, the admin
// token of the control plane, JSON in and out. The benchmark times API writes itself, so it
// talks HTTP directly instead of spawning kubectl (a Go process start per write would be the
// larger part of every figure).

import { readFileSync } from 'node:fs';
import { Agent, request } from 'node:https';

export interface KubeObject {
  readonly apiVersion: string;
  readonly kind: string;
  readonly metadata: { name: string; namespace?: string; labels?: Record<string, string>; [k: string]: unknown };
  readonly [k: string]: unknown;
}

const GROUPS: Record<string, readonly [string, string]> = {
  NetworkPolicy: ['/apis/networking.k8s.io/v1', 'networkpolicies'],
  ClusterNetworkPolicy: ['/apis/policy.networking.k8s.io/v1beta1', 'clusternetworkpolicies'],
};

/** The REST path of a collection or an object (the kinds the bench writes: core v1, NetworkPolicy, ClusterNetworkPolicy). */
export function pathOf(kind: string, namespace?: string, name?: string): string {
  const [group, plural] = GROUPS[kind] ?? ['/api/v1', { Pod: 'pods', Namespace: 'namespaces', Node: 'nodes' }[kind]];
  if (plural === undefined) throw new Error(`bench api: no path for kind ${kind}`);
  const ns = namespace === undefined ? '' : `/namespaces/${namespace}`;
  return `${group}${ns}/${plural}${name === undefined ? '' : `/${name}`}`;
}

export class ApiError extends Error {
  readonly status: number;
  constructor(method: string, path: string, status: number, body: string) {
    super(`${method} ${path}: HTTP ${status}: ${body.slice(0, 500)}`);
    this.status = status;
  }
}

export class Api {
  readonly server: string;
  readonly #token: string;
  readonly #agent: Agent;

  constructor(server: string, token: string, kubeconfigPath: string) {
    this.server = server;
    this.#token = token;
    const ca = /certificate-authority-data:\s*(\S+)/.exec(readFileSync(kubeconfigPath, 'utf8'))?.[1];
    if (ca === undefined) throw new Error(`no certificate-authority-data in ${kubeconfigPath}`);
    this.#agent = new Agent({ keepAlive: true, maxSockets: 16, ca: Buffer.from(ca, 'base64') });
  }

  request<T = unknown>(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<T> {
    const url = new URL(path, this.server);
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = request(
        url,
        {
          method,
          agent: this.#agent,
          headers: {
            authorization: `Bearer ${this.#token}`,
            accept: 'application/json',
            ...(data ? { 'content-type': contentType, 'content-length': data.length } : {}),
          },
          timeout: 60_000,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString();
            if ((res.statusCode ?? 0) >= 300) reject(new ApiError(method, path, res.statusCode ?? 0, text));
            else resolve((text ? JSON.parse(text) : undefined) as T);
          });
          res.on('error', reject);
        },
      );
      req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer in 60 s`)));
      req.on('error', reject);
      req.end(data);
    });
  }

  /** Creates or replaces (server-side apply, forced): the same call whatever exists. */
  apply(obj: KubeObject): Promise<unknown> {
    const path = `${pathOf(obj.kind, obj.metadata.namespace, obj.metadata.name)}?fieldManager=weir-bench&force=true`;
    return this.request('PATCH', path, obj, 'application/apply-patch+yaml');
  }

  /** Creates, or replaces the whole object (PUT): the API server defaults the new body afresh,
   *  as when a manifest is edited and re-read (an apply would keep fields it defaulted before,
   *  such as a NetworkPolicy's policyTypes). */
  async replace(obj: KubeObject): Promise<unknown> {
    const path = pathOf(obj.kind, obj.metadata.namespace, obj.metadata.name);
    try {
      const live = await this.request<{ metadata: { resourceVersion: string } }>('GET', path);
      return await this.request('PUT', path, { ...obj, metadata: { ...obj.metadata, resourceVersion: live.metadata.resourceVersion } });
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
      return this.request('POST', pathOf(obj.kind, obj.metadata.namespace), obj);
    }
  }

  /** A merge patch of an object or of its status subresource. */
  patch(kind: string, namespace: string | undefined, name: string, patch: unknown, subresource?: 'status'): Promise<unknown> {
    const path = pathOf(kind, namespace, name) + (subresource ? `/${subresource}` : '');
    return this.request('PATCH', path, patch, 'application/merge-patch+json');
  }

  /** Deletes at once (grace period 0: there is no kubelet to wait for); a missing object is fine. */
  async delete(kind: string, namespace: string | undefined, name: string): Promise<void> {
    try {
      await this.request('DELETE', `${pathOf(kind, namespace, name)}?gracePeriodSeconds=0`);
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
    }
  }

  /** Names of the objects of a kind in a namespace (or cluster-wide), optionally by label selector. */
  async list(kind: string, namespace?: string, labelSelector?: string): Promise<{ name: string; namespace?: string }[]> {
    const q = labelSelector ? `?labelSelector=${encodeURIComponent(labelSelector)}` : '';
    const r = await this.request<{ items: { metadata: { name: string; namespace?: string } }[] }>('GET', pathOf(kind, namespace) + q);
    return r.items.map((i) => ({ name: i.metadata.name, namespace: i.metadata.namespace }));
  }

  close(): void {
    this.#agent.destroy();
  }
}

/** Runs `fn` over `items` with at most `limit` in flight; rejects with the first error. */
export async function inParallel<T>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}
