// Raw JSON requests to the API server through the kubeconfig's authentication. Raw, because the
// status writers send exact server-side-apply bodies, not client-node's typed objects (whose
// serializer renames and drops fields); client-node still provides auth, TLS and proxies.

import { KubeApiError } from '../errors.ts';
import { IsomorphicFetchHttpLibrary, RequestContext } from '@kubernetes/client-node';
import type { HttpMethod, KubeConfig } from '@kubernetes/client-node';

export const APPLY_PATCH = 'application/apply-patch+yaml';
export const MERGE_PATCH = 'application/merge-patch+json';
export const JSON_TYPE = 'application/json';

/** A request the API server refused (`status` is the HTTP code), or one that got no HTTP
 *  answer at all (`status` 0: refused, reset, timed out, TLS failure). */
export { KubeApiError };

export function isStatus(err: unknown, status: number): err is KubeApiError {
  return err instanceof KubeApiError && err.status === status;
}

export interface KubeRequest {
  readonly method: HttpMethod;
  readonly path: string;
  readonly query?: Readonly<Record<string, string>>;
  /** Serialized as JSON (valid YAML too, so apply-patch+yaml accepts it). */
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
}

export interface KubeClient {
  /** Sends the request; resolves to the parsed JSON answer (undefined for an empty body),
   *  rejects with a KubeApiError for any non-2xx answer or transport failure. */
  send(req: KubeRequest): Promise<unknown>;
  /** Releases the connection pool. */
  close(): Promise<void>;
}

export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;

type Dispatcher = NonNullable<ReturnType<RequestContext['getDispatcher']>>;

export function createKubeClient(kc: KubeConfig, timeoutMs: number = DEFAULT_REQUEST_TIMEOUT_MS): KubeClient {
  const http = new IsomorphicFetchHttpLibrary();
  // applySecurityAuthentication builds a new connection pool per call; keep the first one
  // (headers are still refreshed per request, tokens rotate) until a request fails below HTTP.
  let pool: Dispatcher | undefined;
  let havePool = false;

  const dropPool = (): void => {
    const old = pool;
    pool = undefined;
    havePool = false;
    void old?.close().catch(() => {});
  };

  return {
    async send(req) {
      const { method, path } = req;
      const cluster = kc.getCurrentCluster();
      if (cluster === null) throw new KubeApiError(method, path, 0, '', 'the kubeconfig has no current cluster');
      const url = new URL(cluster.server.replace(/\/+$/, '') + path);
      for (const [k, v] of Object.entries(req.query ?? {})) url.searchParams.set(k, v);
      const ctx = new RequestContext(url.toString(), method);
      ctx.setHeaderParam('Accept', JSON_TYPE);
      if (req.body !== undefined) {
        ctx.setHeaderParam('Content-Type', req.contentType ?? JSON_TYPE);
        ctx.setBody(JSON.stringify(req.body));
      }
      await kc.applySecurityAuthentication(ctx);
      if (!havePool) {
        pool = ctx.getDispatcher();
        havePool = true;
      }
      if (pool !== undefined) ctx.setDispatcher(pool);
      // A hung API server must not hold a status writer (or stop()) forever.
      const timeout = AbortSignal.timeout(timeoutMs);
      ctx.setSignal(req.signal ? AbortSignal.any([req.signal, timeout]) : timeout);

      let status: number;
      let text: string;
      try {
        const resp = await http.send(ctx).toPromise();
        status = resp.httpStatusCode;
        text = await resp.body.text();
      } catch (err) {
        if (!req.signal?.aborted) dropPool();
        throw new KubeApiError(method, path, 0, '', describe(err), { cause: err });
      }
      const parsed = parseJson(text);
      if (status < 200 || status > 299) {
        const s = statusOf(parsed);
        throw new KubeApiError(method, path, status, s?.reason ?? '', s?.message || text.trim().slice(0, 300) || 'no message');
      }
      return parsed;
    },

    async close() {
      const old = pool;
      pool = undefined;
      havePool = false;
      await old?.close().catch(() => {});
    },
  };
}

function parseJson(text: string): unknown {
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function statusOf(v: unknown): { reason: string; message: string } | undefined {
  if (typeof v !== 'object' || v === null || (v as { kind?: unknown }).kind !== 'Status') return undefined;
  const s = v as { reason?: unknown; message?: unknown };
  return { reason: typeof s.reason === 'string' ? s.reason : '', message: typeof s.message === 'string' ? s.message : '' };
}

/** fetch wraps the useful part ("ECONNREFUSED 127.0.0.1:1") in `cause`. */
function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : '';
  return `${err.message}${cause}`;
}
