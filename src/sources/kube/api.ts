// Raw JSON from the API server through the kubeconfig's auth: one GET for a list page and one
// streamed GET for a watch. Raw, because client-node's typed objects rename fields (`from`
// becomes `_from`) and the model validates NetworkPolicy specs as the API server sends them.
//
// Requests go through client-node's own HTTP stack (RequestContext, applySecurityAuthentication,
// IsomorphicFetchHttpLibrary), so tokens, exec plugins, client certificates and proxies work as
// for any client-node call. Watches are read here rather than with client-node's Watch: Watch
// aborts any watch that is silent for 30 s (a private, fixed timer), while the API server
// bookmarks an idle watch only about once a minute; and it cannot be cancelled before the
// response headers arrive. Silence is judged by the reflector's own watchdog instead.

import { KubeApiError } from '../../errors.ts';
import { HttpMethod, IsomorphicFetchHttpLibrary, RequestContext } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node';

/** A request the API server answered with an error status, or a watch ERROR event.
 *  `status` 0: no HTTP answer at all (connection refused, reset, TLS failure). */
export { KubeApiError };

/** One line of a watch stream. */
export interface RawWatchEvent {
  readonly type: string;
  readonly object: unknown;
}

export interface KubeApi {
  /** GET path?query, the parsed body. */
  get(path: string, query: Readonly<Record<string, string>>, signal: AbortSignal): Promise<unknown>;
  /** Opens a watch; resolves once the server answered 200, with the stream of its events.
   *  `onData` is called for every chunk received, so a caller can measure silence. */
  watch(
    path: string,
    query: Readonly<Record<string, string>>,
    signal: AbortSignal,
    onData: () => void,
  ): Promise<AsyncIterable<RawWatchEvent>>;
  /** Destroys every pooled connection, idle ones too: after a stalled watch the path to the
   *  server is suspect, and reusing a half-dead keep-alive connection would stall again. */
  reset(): void;
  /** Releases the connection pool. */
  close(): Promise<void>;
}

type Dispatcher = NonNullable<ReturnType<RequestContext['getDispatcher']>>;

export function createKubeApi(kc: KubeConfig): KubeApi {
  const http = new IsomorphicFetchHttpLibrary();
  // client-node builds a new connection pool on every applySecurityAuthentication call (so every
  // list page would open a new TLS connection). Headers are refreshed on every request (tokens
  // rotate); the pool is kept until a request fails below HTTP, e.g. after a certificate rotation.
  let pool: Dispatcher | undefined;
  let havePool = false;

  async function send(path: string, query: Readonly<Record<string, string>>, signal: AbortSignal) {
    const cluster = kc.getCurrentCluster();
    if (cluster === null) throw new KubeApiError('GET', path, 0, '', 'the kubeconfig has no current cluster');
    const url = new URL(cluster.server.replace(/\/+$/, '') + path);
    for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
    const ctx = new RequestContext(url.toString(), HttpMethod.GET);
    ctx.setHeaderParam('Accept', 'application/json');
    await kc.applySecurityAuthentication(ctx);
    if (!havePool) {
      pool = ctx.getDispatcher();
      havePool = true;
    }
    if (pool !== undefined) ctx.setDispatcher(pool);
    ctx.setSignal(signal);
    try {
      return await http.send(ctx).toPromise();
    } catch (err) {
      if (signal.aborted) throw err;
      const old = pool;
      havePool = false;
      pool = undefined;
      void old?.close().catch(() => {});
      throw new KubeApiError('GET', path, 0, '', describe(err), { cause: err });
    }
  }

  function failure(path: string, status: number, text: string): KubeApiError {
    const s = statusOf(parseJson(text));
    return new KubeApiError('GET', path, status, s?.reason ?? '', s?.message ?? (text.trim().slice(0, 200) || 'no message'));
  }

  return {
    async get(path, query, signal) {
      const resp = await send(path, query, signal);
      const text = await resp.body.text();
      if (resp.httpStatusCode !== 200) throw failure(path, resp.httpStatusCode, text);
      const body = parseJson(text);
      if (body === undefined) throw new KubeApiError('GET', path, 200, '', 'the response is not JSON');
      return body;
    },

    async watch(path, query, signal, onData) {
      const resp = await send(path, query, signal);
      if (resp.httpStatusCode !== 200) throw failure(path, resp.httpStatusCode, await resp.body.text());
      const stream = resp.body.stream();
      if (stream === null) throw new KubeApiError('GET', path, 200, '', 'the watch response has no body');
      return lines(path, stream, onData);
    },

    reset() {
      const old = pool;
      pool = undefined;
      havePool = false;
      void old?.destroy().catch(() => {});
    },

    async close() {
      const old = pool;
      pool = undefined;
      havePool = false;
      await old?.close().catch(() => {});
    },
  };
}

/** Newline-delimited JSON events; a line that is not a watch event ends the stream with an error
 *  (the next watch resumes from the last good resourceVersion). */
async function* lines(path: string, stream: ReadableStream<Uint8Array>, onData: () => void): AsyncGenerator<RawWatchEvent> {
  const decoder = new TextDecoder();
  let buffered = '';
  for await (const chunk of stream) {
    onData();
    buffered += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl).trim();
      buffered = buffered.slice(nl + 1);
      if (line !== '') yield event(path, line);
    }
  }
  const rest = (buffered + decoder.decode()).trim();
  if (rest !== '') yield event(path, rest);
}

function event(path: string, line: string): RawWatchEvent {
  const parsed = parseJson(line);
  if (typeof parsed !== 'object' || parsed === null || typeof (parsed as { type?: unknown }).type !== 'string') {
    throw new KubeApiError('GET', path, 200, '', `the watch sent a line that is not an event: ${line.slice(0, 200)}`);
  }
  const { type, object } = parsed as { type: string; object?: unknown };
  return { type, object };
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** The reason/message/code of a metav1.Status, if `v` is one. */
export function statusOf(v: unknown): { code: number; reason: string; message: string } | undefined {
  if (typeof v !== 'object' || v === null || (v as { kind?: unknown }).kind !== 'Status') return undefined;
  const s = v as { code?: unknown; reason?: unknown; message?: unknown };
  return {
    code: typeof s.code === 'number' ? s.code : 0,
    reason: typeof s.reason === 'string' ? s.reason : '',
    message: typeof s.message === 'string' ? s.message : '',
  };
}

/** fetch failures wrap the useful part ("ECONNREFUSED 127.0.0.1:1") in `cause`. */
export function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : '';
  return `${err.message}${cause}`;
}
