// Test helpers for the status writers: a loopback fake API server that stores objects, records
// every request and serves watches (with 410 Gone once its history is compacted), a logger that
// keeps its lines, and a waiter for the writers' onWrite results. The fake clock is
// test/support/fake-clock.ts's, re-exported here.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { Writable } from 'node:stream';
import type { KubeConfig } from '@kubernetes/client-node';
import { pino } from 'pino';
import type { Logger } from '../../../src/log.ts';

import { LoopbackApi, type Obj, readBody, sendEvent, sendJson, sendListPage, sendStatus } from '../../support/fake-api-server.ts';

export { FakeClock } from '../../support/fake-clock.ts';
export type { Obj };

export interface Recorded {
  readonly method: string;
  readonly path: string;
  readonly query: URLSearchParams;
  readonly contentType: string | undefined;
  readonly authorization: string | undefined;
  readonly body: unknown;
}

export interface Fault {
  readonly method?: string;
  readonly path?: string | RegExp;
  readonly status: number;
  readonly reason: string;
  /** How many matching requests fail (default: all of them). */
  times?: number;
  /** Runs when the fault hits, e.g. to let "another client" write first. */
  readonly onHit?: () => void;
}

interface Parsed {
  readonly prefix: string;
  readonly ns: string | null;
  readonly plural: string;
  readonly name: string | null;
  readonly sub: string | null;
}

function parsePath(path: string): Parsed {
  const segs = path.split('/').filter(Boolean).map(decodeURIComponent);
  const i = segs[0] === 'api' ? 2 : 3;
  let rest = segs.slice(i);
  let ns: string | null = null;
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    ns = rest[1];
    rest = rest.slice(2);
  }
  return { prefix: '/' + segs.slice(0, i).join('/'), ns, plural: rest[0], name: rest[1] ?? null, sub: rest[2] ?? null };
}

const keyOf = (p: Pick<Parsed, 'prefix' | 'ns' | 'plural'>, name: string): string => `${p.prefix}|${p.ns ?? ''}|${p.plural}|${name}`;

/** RFC 7386 JSON merge patch. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (typeof patch !== 'object' || patch === null || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> = typeof target === 'object' && target !== null && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

interface Watcher {
  readonly prefix: string;
  readonly plural: string;
  readonly ns: string | null;
  readonly res: ServerResponse;
}

interface HistoryEvent {
  readonly rv: number;
  readonly key: string;
  readonly type: 'ADDED' | 'MODIFIED' | 'DELETED';
  readonly object: Obj;
}

export class FakeApi {
  readonly requests: Recorded[] = [];
  readonly faults: Fault[] = [];
  private readonly store = new Map<string, Obj>();
  private readonly history: HistoryEvent[] = [];
  /** Watches from a resourceVersion below this get 410 Gone. */
  private oldest = 0;
  private rv = 100;
  private uidSeq = 0;
  private readonly server = new LoopbackApi<Watcher>((req, res) => this.handle(req, res));

  start(): Promise<void> {
    return this.server.start();
  }

  stop(): Promise<void> {
    return this.server.close();
  }

  /** A kubeconfig for this server; `token` tells clients apart in `requests`. */
  kubeConfig(token: string = 'test-token'): KubeConfig {
    return this.server.kubeConfig(token);
  }

  /** Stores an object at its item path (uid and resourceVersion added when missing). */
  put(path: string, obj: Record<string, unknown>): Obj {
    const p = parsePath(path);
    const o = structuredClone(obj) as Obj;
    o.metadata = { uid: `uid-${++this.uidSeq}`, creationTimestamp: '2025-01-01T00:00:00Z', ...o.metadata, resourceVersion: String(++this.rv) };
    const key = keyOf(p, p.name!);
    const type = this.store.has(key) ? 'MODIFIED' : 'ADDED';
    this.store.set(key, o);
    this.record({ rv: this.rv, key, type, object: o });
    return o;
  }

  /** Deletes an object at its item path, as somebody else would. */
  remove(path: string): void {
    const p = parsePath(path);
    const key = keyOf(p, p.name!);
    const cur = this.store.get(key);
    if (cur === undefined) throw new Error(`nothing at ${path}`);
    this.store.delete(key);
    this.record({ rv: ++this.rv, key, type: 'DELETED', object: { ...cur, metadata: { ...cur.metadata, resourceVersion: String(this.rv) } } });
  }

  /** Open watch streams. */
  openWatches(): number {
    return this.server.watches.size;
  }

  /** Forgets the history and ends every watch: resuming from any resourceVersion served so far
   *  gets 410 Gone (as if other kinds had moved etcd's revision on before the compaction). */
  compact(): void {
    this.oldest = ++this.rv;
    this.history.length = 0;
    this.server.endWatches();
  }

  private record(e: HistoryEvent): void {
    this.history.push(e);
    for (const w of this.server.watches) if (watches(w, e.key)) sendEvent(w, e.type, e.object);
  }

  private watch(p: Parsed, url: URL, res: ServerResponse): void {
    const w: Watcher = { prefix: p.prefix, plural: p.plural, ns: p.ns, res };
    this.server.openWatch(w);
    const from = Number(url.searchParams.get('resourceVersion') ?? '0');
    if (from !== 0 && from < this.oldest) {
      this.server.gone(w, from);
      return;
    }
    for (const e of this.history) if (e.rv > from && watches(w, e.key)) sendEvent(w, e.type, e.object);
  }

  get(path: string): Obj | undefined {
    const p = parsePath(path);
    return this.store.get(keyOf(p, p.name!));
  }

  /** Requests that change something. */
  writes(): Recorded[] {
    return this.requests.filter((r) => r.method !== 'GET');
  }

  fail(f: Fault): Fault {
    this.faults.push(f);
    return f;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readBody(req);
    const url = new URL(req.url ?? '/', 'http://fake');
    const method = req.method ?? 'GET';
    const contentType = req.headers['content-type'];
    this.requests.push({ method, path: url.pathname, query: url.searchParams, contentType, authorization: req.headers.authorization, body });

    const send = (status: number, value: unknown): void => sendJson(res, status, value);
    const failure = (status: number, reason: string, message: string): void => sendStatus(res, status, reason, message);

    for (const f of this.faults) {
      if ((f.times ?? Infinity) <= 0) continue;
      if (f.method !== undefined && f.method !== method) continue;
      if (f.path !== undefined && !(typeof f.path === 'string' ? url.pathname === f.path : f.path.test(url.pathname))) continue;
      if (f.times !== undefined) f.times--;
      f.onHit?.();
      return failure(f.status, f.reason, `${method} ${url.pathname} is ${f.reason.toLowerCase()} (fault)`);
    }

    const p = parsePath(url.pathname);
    if (p.name === null) {
      if (method === 'GET' && url.searchParams.get('watch') === 'true') return this.watch(p, url, res);
      if (method === 'GET') {
        const items = [...this.store.entries()].filter(([k]) => k.startsWith(`${p.prefix}|`) && k.split('|')[2] === p.plural && (p.ns === null || k.split('|')[1] === p.ns)).map(([, o]) => o);
        return sendListPage(res, 'List', items, url.searchParams, this.rv);
      }
      if (method === 'POST') {
        const o = body as Obj;
        const name = o?.metadata?.name;
        if (typeof name !== 'string') return failure(422, 'Invalid', 'metadata.name is required');
        if (this.store.has(keyOf(p, name))) return failure(409, 'AlreadyExists', `${p.plural} "${name}" already exists`);
        const path = `${url.pathname}/${name}`;
        return send(201, this.put(path, o));
      }
      return failure(405, 'MethodNotAllowed', `${method} on a collection`);
    }

    const key = keyOf(p, p.name);
    const cur = this.store.get(key);
    const itemPath = url.pathname.replace(/\/status$/, '');
    switch (method) {
      case 'GET':
        return cur ? send(200, cur) : failure(404, 'NotFound', `${p.plural} "${p.name}" not found`);
      case 'PUT': {
        if (!cur) return failure(404, 'NotFound', `${p.plural} "${p.name}" not found`);
        const o = body as Obj;
        const rv = o?.metadata?.resourceVersion;
        if (rv !== undefined && rv !== cur.metadata.resourceVersion) {
          return failure(409, 'Conflict', `Operation cannot be fulfilled on ${p.plural} "${p.name}": the object has been modified`);
        }
        return send(200, this.put(itemPath, { ...o, metadata: { ...o.metadata, uid: cur.metadata.uid, creationTimestamp: cur.metadata.creationTimestamp } }));
      }
      case 'PATCH': {
        if (contentType === 'application/apply-patch+yaml') {
          if (!url.searchParams.get('fieldManager')) return failure(400, 'BadRequest', 'fieldManager is required for apply requests');
          const o = body as Obj;
          // A resourceVersion in an applied object is a precondition, on the status subresource too.
          const rv = o?.metadata?.resourceVersion;
          if (cur && rv !== undefined && rv !== cur.metadata.resourceVersion) {
            return failure(409, 'Conflict', `Operation cannot be fulfilled on ${p.plural} "${p.name}": the object has been modified`);
          }
          if (p.sub === 'status') {
            if (!cur) return failure(404, 'NotFound', `${p.plural} "${p.name}" not found`);
            return send(200, this.put(itemPath, { ...cur, status: o.status }));
          }
          const { status: _ignored, ...rest } = o;
          const merged = cur ? { ...cur, ...rest, metadata: { ...cur.metadata, ...o.metadata } } : rest;
          return send(cur ? 200 : 201, this.put(itemPath, merged));
        }
        if (contentType === 'application/merge-patch+json') {
          if (!cur) return failure(404, 'NotFound', `${p.plural} "${p.name}" not found`);
          return send(200, this.put(itemPath, mergePatch(cur, body) as Obj));
        }
        return failure(415, 'UnsupportedMediaType', `content type ${contentType}`);
      }
      case 'DELETE': {
        if (!cur) return failure(404, 'NotFound', `${p.plural} "${p.name}" not found`);
        const pre = (body as { preconditions?: { uid?: string } } | undefined)?.preconditions?.uid;
        if (pre !== undefined && pre !== cur.metadata.uid) return failure(409, 'Conflict', 'precondition failed: uid');
        this.remove(url.pathname);
        return send(200, { kind: 'Status', apiVersion: 'v1', status: 'Success' });
      }
      default:
        return failure(405, 'MethodNotAllowed', method);
    }
  }
}

function watches(w: Watcher, key: string): boolean {
  const [prefix, ns, plural] = key.split('|');
  return prefix === w.prefix && plural === w.plural && (w.ns === null || ns === w.ns);
}

/** Whether a request is a list (a GET of a collection, not a watch). */
export function isList(r: Recorded): boolean {
  return r.method === 'GET' && r.query.get('watch') !== 'true' && /\/(nodepolicystatuses|networkpolicystatuses)$/.test(r.path);
}

export interface LogLine {
  readonly level: number;
  readonly msg: string;
  readonly [k: string]: unknown;
}

/** A debug-level logger that keeps its lines. */
export function captureLog(): { log: Logger; lines: LogLine[]; warnings: () => LogLine[] } {
  const lines: LogLine[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.trim()) lines.push(JSON.parse(l) as LogLine);
      cb();
    },
  });
  const log = pino({ level: 'debug' }, stream);
  return { log, lines, warnings: () => lines.filter((l) => l.level === 40) };
}

/** Collects onWrite results; `next()` consumes them in order, waiting (real time, bounded)
 *  for one that has not arrived yet. */
export class Results<T> {
  readonly all: T[] = [];
  private consumed = 0;
  private waiters: { n: number; resolve: (v: T) => void }[] = [];
  readonly push = (r: T): void => {
    this.all.push(r);
    for (const w of this.waiters.splice(0)) {
      if (this.all.length >= w.n) w.resolve(this.all[w.n - 1]);
      else this.waiters.push(w);
    }
  };
  next(timeoutMs: number = 3000): Promise<T> {
    const n = ++this.consumed;
    if (this.all.length >= n) return Promise.resolve(this.all[n - 1]);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no result #${n} within ${timeoutMs} ms (have ${JSON.stringify(this.all)})`)), timeoutMs);
      this.waiters.push({
        n,
        resolve: (v) => {
          clearTimeout(t);
          resolve(v);
        },
      });
    });
  }
}

/** Waits until `cond` holds (real time, bounded): for effects that have no callback. */
export async function until(cond: () => boolean, what: string, timeoutMs: number = 3000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** Lets in-flight requests settle (for asserting that nothing more happens). */
export function settle(ms: number = 50): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
