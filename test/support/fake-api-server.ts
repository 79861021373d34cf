// The loopback core of the unit tests' two fake API servers, whose jobs differ: the status
// writers' (test/unit/status/fake-api.ts) is a read-write store of any path that records every
// request; the kube source's (test/unit/sources/kube-fake-api.ts) serves four read-only kinds
// with the transport faults a reflector must survive. Both stand on this: the HTTP server and its
// kubeconfig, Status replies, paginated list pages, and watch streams that end with 410 Gone
// for a resourceVersion older than the kept history.

import { createServer } from 'node:http';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';

export type Obj = Record<string, unknown> & { metadata: Record<string, unknown> };

/** An HTTP server on 127.0.0.1 that hands every request to `handle`, and the open watch
 *  streams, which it ends when it closes. */
export class LoopbackApi<W extends WatchStream = WatchStream> {
  readonly watches = new Set<W>();
  readonly #handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>;
  #server: Server | null = null;

  constructor(handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>) {
    this.#handle = handle;
  }

  async start(): Promise<void> {
    const server = createServer((req, res) => void this.#handle(req, res));
    this.#server = server;
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  }

  async close(): Promise<void> {
    for (const w of this.watches) w.res.destroy();
    this.watches.clear();
    const server = this.#server;
    if (server === null) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** A kubeconfig for this server; `token` tells clients apart. */
  kubeConfig(token: string): KubeConfig {
    if (this.#server === null) throw new Error('the fake API server has not started');
    const port = (this.#server.address() as AddressInfo).port;
    const kc = new KubeConfig();
    kc.loadFromOptions({
      // client-node refuses plain http unless skipTLSVerify is set.
      clusters: [{ name: 'fake', server: `http://127.0.0.1:${port}`, skipTLSVerify: true }],
      users: [{ name: 'agent', token }],
      contexts: [{ name: 'fake', cluster: 'fake', user: 'agent' }],
      currentContext: 'fake',
    });
    return kc;
  }

  /** Answers a watch request with 200 and chunked headers, and keeps `w` open until either side ends it. */
  openWatch(w: W): void {
    w.res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    w.res.flushHeaders();
    this.watches.add(w);
    w.res.on('close', () => this.watches.delete(w));
  }

  /** Ends the open watches that `which` picks, as the server does at timeoutSeconds. */
  endWatches(which: (w: W) => boolean = () => true): void {
    for (const w of [...this.watches]) {
      if (!which(w)) continue;
      this.watches.delete(w);
      w.res.end();
    }
  }

  /** Ends a just-opened watch with the 410 Gone event for a resourceVersion too old. */
  gone(w: W, from: string | number): void {
    const status = { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Expired', code: 410, message: `too old resource version: ${from}` };
    w.res.end(`${JSON.stringify({ type: 'ERROR', object: status })}\n`);
    this.watches.delete(w);
  }
}

export interface WatchStream {
  readonly res: ServerResponse;
}

/** Writes one watch event to a stream. */
export function sendEvent(w: WatchStream, type: string, object: Obj): void {
  w.res.write(`${JSON.stringify({ type, object })}\n`);
}

export function sendJson(res: ServerResponse, code: number, value: unknown): void {
  res.writeHead(code, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

/** A Status failure, as the API server answers one. */
export function sendStatus(res: ServerResponse, code: number, reason: string, message: string): void {
  sendJson(res, code, { kind: 'Status', apiVersion: 'v1', status: 'Failure', message, reason, code });
}

/** One page of a list as the API server serves it: `limit` objects from where the continue
 *  token points, the token carrying the list's resourceVersion. `truncate`: the connection
 *  dies halfway through the body. */
export function sendListPage(res: ServerResponse, listKind: string, all: readonly Obj[], q: URLSearchParams, rv: number, truncate = false): void {
  // As the real API server: a continue token carries its own resourceVersion.
  if (q.get('continue') !== null && q.get('resourceVersion') !== null) {
    sendStatus(res, 400, 'BadRequest', 'specifying resource version is not allowed when using continue');
    return;
  }
  const limit = Number(q.get('limit') ?? '0') || all.length;
  const token = q.get('continue');
  const from = token === null ? { offset: 0, rv } : (JSON.parse(Buffer.from(token, 'base64').toString()) as { offset: number; rv: number });
  const items = all.slice(from.offset, from.offset + limit);
  const metadata: Record<string, string> = { resourceVersion: String(from.rv) };
  if (from.offset + limit < all.length) metadata.continue = Buffer.from(JSON.stringify({ offset: from.offset + limit, rv: from.rv })).toString('base64');
  const body = JSON.stringify({ kind: listKind, apiVersion: 'v1', metadata, items });
  if (truncate) {
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.write(body.slice(0, Math.floor(body.length / 2)), () => res.destroy());
    return;
  }
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(body);
}

/** The request's body, parsed (undefined when empty). */
export async function readBody(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const text = Buffer.concat(chunks).toString();
  return text === '' ? undefined : (JSON.parse(text) as unknown);
}
