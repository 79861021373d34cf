// The one HTTP client to the Kubernetes API server, used by the kube source (lists and watches)
// and the status writers (applies, Lease, Events). Raw JSON: client-node's typed objects rename
// fields (`from` becomes `_from`) and drop unknown ones, while the source validates NetworkPolicy
// specs as the API server sends them and the status writers send exact server-side-apply bodies.
//
// client-node makes each request's authentication (RequestContext, applySecurityAuthentication),
// so tokens, exec plugins, client certificates and proxies work as for any client-node call, and
// the request goes out through the undici dispatcher it builds. A request answered whole goes
// through the dispatcher's own request() rather than fetch: fetch's web streams and
// Request/Response objects cost more CPU per write and leave more memory resident
// (docs/performance.md). Watches are read here rather than with
// client-node's Watch: Watch aborts any watch that is silent for 30 s (a private, fixed timer),
// while the API server bookmarks an idle watch only about once a minute; and it cannot be
// cancelled before the response headers arrive. Silence is judged by the reflector's watchdog
// instead.

import { KubeApiError } from '../errors.ts';
import { ListSplitter } from './list-splitter.ts';
import { decodeProtoStatus, ProtoListSplitter } from './proto-list.ts';
import { ProtoError } from './protobuf.ts';
import { HttpMethod, RequestContext } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node';
import { Agent, type Dispatcher, fetch } from 'undici';

/** A request the API server answered with an error status, or a watch ERROR event.
 *  `status` 0: no HTTP answer at all (connection refused, reset, timed out, TLS failure). */
export { KubeApiError };

export const APPLY_PATCH = 'application/apply-patch+yaml';
export const MERGE_PATCH = 'application/merge-patch+json';
export const JSON_TYPE = 'application/json';
export const PROTOBUF_TYPE = 'application/vnd.kubernetes.protobuf';

/** The default limit on one request (a hung API server must not hold a writer, or stop(),
 *  forever). Watches have none: the reflector's watchdog judges them. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;

export type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

export interface KubeRequest {
  readonly method: Method;
  readonly path: string;
  readonly query?: Readonly<Record<string, string>>;
  /** Serialized as JSON (valid YAML too, so apply-patch+yaml accepts it). */
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
  /** Overrides the client's timeout for this request (a list page of a large cluster). */
  readonly timeoutMs?: number;
  /** For a list: decodes one item from protobuf into the JSON shape its caller reads. Given,
   *  the list asks for protobuf (JSON remains acceptable: the server picks, and a kind without
   *  protobuf, or a server without it, answers JSON). */
  readonly protobuf?: (item: Buffer) => unknown;
}

/** One line of a watch stream. */
export interface RawWatchEvent {
  readonly type: string;
  readonly object: unknown;
}

/** What the client reports of every request it sends, e.g. to count them. */
export interface RequestRecord {
  readonly method: Method;
  readonly path: string;
  readonly watch: boolean;
}

export interface KubeClientOptions {
  readonly timeoutMs?: number;
  /** Called as each request is sent; must not throw. */
  readonly onRequest?: (r: RequestRecord) => void;
}

export interface KubeClient {
  /** Sends the request; resolves to the parsed JSON answer (undefined for an empty body),
   *  rejects with a KubeApiError for any non-2xx answer or transport failure. */
  send(req: KubeRequest): Promise<unknown>;
  /** Sends a GET for a list and hands each item to `onItem` as it arrives, so the whole answer
   *  is never held at once; resolves to the answer without its items (`"items": []`). Rejects
   *  as `send` does, and when the body is cut short or is not a list. */
  list(req: KubeRequest, onItem: (item: unknown) => void): Promise<unknown>;
  /** Opens a watch (GET with the query as given, which should hold watch=true); resolves once
   *  the server answered 200, with the stream of its events. `onData` is called for every chunk
   *  received, so a caller can measure silence. */
  watch(path: string, query: Readonly<Record<string, string>>, signal: AbortSignal, onData: () => void): Promise<AsyncIterable<RawWatchEvent>>;
  /** Destroys every pooled connection, idle ones too: after a stalled watch the path to the
   *  server is suspect, and reusing a half-dead keep-alive connection would stall again. */
  reset(): void;
  /** Releases the connection pool. */
  close(): Promise<void>;
}

const METHODS: Record<Method, HttpMethod> = {
  GET: HttpMethod.GET,
  POST: HttpMethod.POST,
  PUT: HttpMethod.PUT,
  PATCH: HttpMethod.PATCH,
  DELETE: HttpMethod.DELETE,
};

/** An answer's status and body, however it was read. */
interface Answer {
  readonly status: number;
  readonly contentType: string;
  text(): Promise<string>;
  bytes(): Promise<Buffer>;
  readonly chunks: AsyncIterable<Uint8Array>;
}

export function createKubeClient(kc: KubeConfig, opts: KubeClientOptions = {}): KubeClient {
  const timeoutMs = opts.timeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  // client-node builds a new connection pool on every applySecurityAuthentication call (so every
  // request would open a new TLS connection). Headers are refreshed on every request (tokens
  // rotate); the pool is kept until a request fails below HTTP, e.g. after a certificate rotation.
  let pool: Dispatcher | undefined;

  const takePool = (): Dispatcher | undefined => {
    const old = pool;
    pool = undefined;
    return old;
  };

  /** Sends; resolves to the status and the response (body unread). A streamed answer (a list or
   *  a watch) is read through fetch, whose stream hands the splitters larger chunks than
   *  request()'s: a large list takes less CPU that way (docs/performance.md). */
  async function open(req: KubeRequest, how: 'answer' | 'stream' | 'watch'): Promise<Answer> {
    const watch = how === 'watch';
    const { method, path } = req;
    const cluster = kc.getCurrentCluster();
    if (cluster === null) throw new KubeApiError(method, path, 0, '', 'the kubeconfig has no current cluster');
    const url = new URL(cluster.server.replace(/\/+$/, '') + path);
    for (const [k, v] of Object.entries(req.query ?? {})) url.searchParams.set(k, v);
    const ctx = new RequestContext(url.toString(), METHODS[method]);
    ctx.setHeaderParam('Accept', req.protobuf === undefined ? JSON_TYPE : `${PROTOBUF_TYPE}, ${JSON_TYPE}`);
    if (req.body !== undefined) ctx.setHeaderParam('Content-Type', req.contentType ?? JSON_TYPE);
    await kc.applySecurityAuthentication(ctx);
    // client-node makes none when nothing about TLS is configured (fetch then used a default one).
    pool ??= (ctx.getDispatcher() as Dispatcher | undefined) ?? new Agent({ connect: { keepAlive: true, keepAliveInitialDelay: 30_000 } });
    const dispatcher = pool;
    const limit = watch ? undefined : AbortSignal.timeout(req.timeoutMs ?? timeoutMs);
    const signal = limit === undefined ? req.signal : req.signal === undefined ? limit : AbortSignal.any([req.signal, limit]);
    opts.onRequest?.({ method, path, watch });
    const init = { method, headers: ctx.getHeaders(), body: req.body === undefined ? undefined : JSON.stringify(req.body), signal };
    try {
      if (how === 'answer') {
        const r = await dispatcher.request({ origin: url.origin, path: url.pathname + url.search, ...init });
        return { status: r.statusCode, contentType: String(r.headers['content-type'] ?? ''), text: () => r.body.text(), bytes: async () => Buffer.from(await r.body.arrayBuffer()), chunks: r.body };
      }
      const r = await fetch(url, { ...init, dispatcher });
      return { status: r.status, contentType: r.headers.get('content-type') ?? '', text: () => r.text(), bytes: async () => Buffer.from(await r.arrayBuffer()), chunks: r.body ?? noChunks() };
    } catch (err) {
      if (req.signal?.aborted) throw err;
      void takePool()
        ?.close()
        .catch(() => {});
      throw new KubeApiError(method, path, 0, '', describe(err), { cause: err });
    }
  }

  function failure(req: KubeRequest, status: number, parsed: unknown, text: string): KubeApiError {
    const s = statusOf(parsed);
    return new KubeApiError(req.method, req.path, status, s?.reason ?? '', s?.message || text.trim().slice(0, 300) || 'no message');
  }

  return {
    async send(req) {
      const resp = await open(req, 'answer');
      let text: string;
      try {
        text = await resp.text();
      } catch (err) {
        if (req.signal?.aborted) throw err;
        throw new KubeApiError(req.method, req.path, 0, '', describe(err), { cause: err });
      }
      const parsed = parseJson(text);
      if (resp.status < 200 || resp.status > 299) throw failure(req, resp.status, parsed, text);
      if (parsed === undefined && text.trim() !== '') throw new KubeApiError(req.method, req.path, resp.status, '', 'the response is not JSON');
      return parsed;
    },

    async list(req, onItem) {
      const resp = await open(req, 'stream');
      const protobuf = req.protobuf !== undefined && resp.contentType.startsWith(PROTOBUF_TYPE) ? req.protobuf : undefined;
      if (resp.status < 200 || resp.status > 299) {
        if (protobuf === undefined) {
          const text = await resp.text().catch(() => '');
          throw failure(req, resp.status, parseJson(text), text);
        }
        throw failure(req, resp.status, decodeProtoStatus(await resp.bytes().catch(() => Buffer.alloc(0))), '');
      }
      const stream = resp.chunks;
      // The caller's own failure passes through as it is; the rest is the server's or the wire's.
      let callerFailure: unknown;
      const hand = (item: unknown) => {
        try {
          onItem(item);
        } catch (err) {
          callerFailure = err;
          throw err;
        }
      };
      try {
        if (protobuf !== undefined) {
          const splitter = new ProtoListSplitter();
          for await (const chunk of stream) for (const item of splitter.push(chunk)) hand(protobuf(item));
          return splitter.finish();
        }
        const splitter = new ListSplitter();
        const decoder = new TextDecoder();
        const take = (text: string) => {
          for (const item of splitter.push(text)) hand(JSON.parse(item) as unknown);
        };
        for await (const chunk of stream) take(decoder.decode(chunk, { stream: true }));
        take(decoder.decode());
        return splitter.finish();
      } catch (err) {
        if (err === callerFailure || req.signal?.aborted) throw err;
        const malformed = err instanceof SyntaxError || err instanceof ProtoError;
        const status = malformed ? resp.status : 0;
        const message = malformed ? `the list response is not a complete ${protobuf === undefined ? 'JSON' : 'protobuf'} list: ${err.message}` : describe(err);
        throw new KubeApiError(req.method, req.path, status, '', message, { cause: err });
      }
    },

    async watch(path, query, signal, onData) {
      const req: KubeRequest = { method: 'GET', path, query, signal };
      const resp = await open(req, 'watch');
      if (resp.status !== 200) {
        const text = await resp.text();
        throw failure(req, resp.status, parseJson(text), text);
      }
      return lines(path, resp.chunks, onData);
    },

    reset() {
      void takePool()
        ?.destroy()
        .catch(() => {});
    },

    async close() {
      await takePool()
        ?.close()
        .catch(() => {});
    },
  };
}

export function isStatus(err: unknown, status: number): err is KubeApiError {
  return err instanceof KubeApiError && err.status === status;
}

/** Newline-delimited JSON events; a line that is not a watch event ends the stream with an error
 *  (the next watch resumes from the last good resourceVersion). */
async function* lines(path: string, stream: AsyncIterable<Uint8Array>, onData: () => void): AsyncGenerator<RawWatchEvent> {
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

async function* noChunks(): AsyncGenerator<Uint8Array> {}

function event(path: string, line: string): RawWatchEvent {
  const parsed = parseJson(line);
  if (typeof parsed !== 'object' || parsed === null || typeof (parsed as { type?: unknown }).type !== 'string') {
    throw new KubeApiError('GET', path, 200, '', `the watch sent a line that is not an event: ${line.slice(0, 200)}`);
  }
  const { type, object } = parsed as { type: string; object?: unknown };
  return { type, object };
}

function parseJson(text: string): unknown {
  if (text.trim() === '') return undefined;
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

/** Transport failures may wrap the useful part ("ECONNREFUSED 127.0.0.1:1") in `cause`. */
export function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error && !err.message.includes(err.cause.message) ? `: ${err.cause.message}` : '';
  return `${err.message}${cause}`;
}
