// The workload of a simulated pod (and of the external host). Run by Node inside the pod's
// network namespace:
//   podserver.ts --name ns1/a --ports 80,81 --control /tmp/.../pod3.sock
// It answers TCP connections and UDP datagrams on every port, v4 and v6, with its name, and
// runs probes from inside its namespace on request over the UNIX control socket. The control
// socket is opened last, so a successful connect to it means the server is ready.

import { connect, createServer, type Socket } from 'node:net';
import { createSocket } from 'node:dgram';
import { rmSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { onLines, type ProbeRequest, type ProbeResult } from './probe-protocol.ts';

const { values } = parseArgs({
  options: {
    name: { type: 'string' },
    ports: { type: 'string', default: '80,81' },
    control: { type: 'string' },
  },
});
function usage(): never {
  process.stderr.write('usage: podserver.ts --name <name> --ports 80,81 --control <unix socket path>\n');
  process.exit(2);
}
const name = values.name || usage();
const controlPath = values.control || usage();
const ports = values.ports.split(',').map(Number);
if (!ports.every((p) => Number.isInteger(p) && p > 0 && p < 65536)) usage();

function listenTcp(port: number): Promise<void> {
  const server = createServer((conn) => {
    conn.on('error', () => {}); // a peer resetting is not our problem
    conn.end(name);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    // One dual-stack socket takes both families (v4 arrives as ::ffff:a.b.c.d).
    server.listen({ port, host: '::', ipv6Only: false }, () => resolve());
  });
}

function listenUdp(port: number): Promise<void> {
  const sock = createSocket({ type: 'udp6', ipv6Only: false });
  sock.on('message', (_msg, from) => sock.send(name, from.port, from.address));
  return new Promise((resolve, reject) => {
    sock.once('error', reject);
    sock.bind(port, '::', () => {
      sock.off('error', reject);
      sock.on('error', (e) => process.stderr.write(`udp/${port}: ${e.message}\n`));
      resolve();
    });
  });
}

function probeTcp(req: ProbeRequest): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const sock = connect({ host: req.ip, port: req.port });
    let reply = '';
    let settled = false;
    const finish = (ok: boolean, error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ id: req.id, ok, reply: reply || undefined, error });
    };
    // A SYN that a DROP rule swallows never answers: the timeout is the verdict.
    const timer = setTimeout(() => finish(false, 'timeout'), req.timeoutMs);
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => (reply += d));
    sock.on('end', () => finish(reply.length > 0, reply ? undefined : 'closed without a reply'));
    sock.on('error', (e: NodeJS.ErrnoException) => finish(false, e.code ?? e.message));
  });
}

function probeUdp(req: ProbeRequest): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const sock = createSocket(req.ip.includes(':') ? 'udp6' : 'udp4');
    let settled = false;
    const finish = (ok: boolean, reply?: string, error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.close();
      resolve({ id: req.id, ok, reply, error });
    };
    const timer = setTimeout(() => finish(false, undefined, 'timeout'), req.timeoutMs);
    sock.on('message', (msg) => finish(true, msg.toString('utf8')));
    // Connected, so an ICMP port-unreachable surfaces as ECONNREFUSED instead of a timeout.
    sock.on('error', (e: NodeJS.ErrnoException) => finish(false, undefined, e.code ?? e.message));
    sock.connect(req.port, req.ip, () => sock.send('probe'));
  });
}

function serveControl(conn: Socket): void {
  conn.on('error', () => {});
  onLines(conn, (line) => {
    if (line.trim()) void handle(line).then((res) => conn.writable && conn.write(JSON.stringify(res) + '\n'));
  });
}

async function handle(line: string): Promise<ProbeResult> {
  let req: ProbeRequest;
  try {
    req = JSON.parse(line) as ProbeRequest;
  } catch {
    return { id: -1, ok: false, error: `bad request: ${line.slice(0, 100)}` };
  }
  return probeTcpOrUdp(req);
}

function probeTcpOrUdp(req: ProbeRequest): Promise<ProbeResult> {
  if (req.proto === 'tcp') return probeTcp(req);
  if (req.proto === 'udp') return probeUdp(req);
  return Promise.resolve({ id: req.id, ok: false, error: `unknown proto ${String(req.proto)}` });
}

await Promise.all(ports.flatMap((p) => [listenTcp(p), listenUdp(p)]));
// Probe ourselves once per kind before declaring readiness: the first probe pays for lazy
// compilation and module loading, which on a busy machine can eat a whole probe timeout.
await Promise.all((['tcp', 'udp'] as const).flatMap((proto) => ['127.0.0.1', '::1'].map((ip) => probeTcpOrUdp({ id: 0, proto, ip, port: ports[0], timeoutMs: 2000 }))));
rmSync(controlPath, { force: true });
createServer(serveControl).listen(controlPath);
