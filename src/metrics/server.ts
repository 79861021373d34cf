// /metrics, /healthz and /readyz on one small HTTP server. The agent runs on the host
// network, so the server listens on loopback unless told an address, and its bodies carry
// codes only: the details (payload lines, policy names, addresses) stay in the logs.

import { createServer, type Server, type ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { ConfigError } from '../errors.ts';

export interface Health {
  /** The loop makes progress: writes owed have succeeded within the bound. */
  health(): { healthy: boolean; reason: string; error?: string };
  /** The kernel holds the state computed from the latest input. */
  readiness(): { ready: boolean; revision: string; reason: string; error?: string };
}

/** Where `:PORT` listens: every interface of a hostNetwork node would be the whole network. */
export const DEFAULT_METRICS_HOST = '127.0.0.1';

export function parseHostPort(addr: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d+)$/.exec(addr);
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 0 && port <= 65535)) throw new ConfigError([`metrics address "${addr}" must be HOST:PORT, e.g. 127.0.0.1:9476 (":PORT" is loopback; 0.0.0.0:PORT serves every interface)`]);
  return { host: m[1] ?? (m[2] || DEFAULT_METRICS_HOST), port };
}

export async function startHealthServer(addr: string, registry: Registry, health: Health): Promise<{ server: Server; host: string; port: number }> {
  const { host, port } = parseHostPort(addr);
  const json = (res: ServerResponse, status: number, body: object) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body) + '\n');
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === '/metrics') {
      registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
        () => res.writeHead(500).end('metrics unavailable\n'),
      );
    } else if (path === '/healthz') {
      // Named fields only, so nothing the loop adds later can reach whoever asks.
      const h = health.health();
      json(res, h.healthy ? 200 : 503, { healthy: h.healthy, reason: h.reason, ...(h.error ? { error: h.error } : {}) });
    } else if (path === '/readyz') {
      const r = health.readiness();
      json(res, r.ready ? 200 : 503, { ready: r.ready, revision: r.revision, reason: r.reason, ...(r.error ? { error: r.error } : {}) });
    } else {
      res.writeHead(404).end('not found\n');
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const a = server.address();
  return { server, host, port: typeof a === 'object' && a ? a.port : port };
}
