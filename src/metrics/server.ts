// /metrics, /healthz and /readyz on one small HTTP server.

import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';
import { ConfigError } from '../errors.ts';

export interface Health {
  /** The process is alive and its loop turns. */
  healthy(): boolean;
  /** The kernel holds the state computed from the latest input; with a body for humans/tests. */
  readiness(): { ready: boolean; revision: string; reason: string };
}

export function parseHostPort(addr: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(addr);
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 0 && port <= 65535)) throw new ConfigError([`metrics address "${addr}" must be HOST:PORT, e.g. 127.0.0.1:9476`]);
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port };
}

export async function startHealthServer(addr: string, registry: Registry, health: Health): Promise<{ server: Server; port: number }> {
  const { host, port } = parseHostPort(addr);
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === '/metrics') {
      registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
        (err: unknown) => res.writeHead(500).end(String(err)),
      );
    } else if (path === '/healthz') {
      const ok = health.healthy();
      res.writeHead(ok ? 200 : 503, { 'content-type': 'text/plain' }).end(ok ? 'ok\n' : 'unhealthy\n');
    } else if (path === '/readyz') {
      const r = health.readiness();
      res.writeHead(r.ready ? 200 : 503, { 'content-type': 'application/json' }).end(JSON.stringify(r) + '\n');
    } else {
      res.writeHead(404).end('not found\n');
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const a = server.address();
  return { server, port: typeof a === 'object' && a ? a.port : port };
}
