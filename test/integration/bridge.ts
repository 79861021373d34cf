// Makes the API server (listening on 127.0.0.1 of the test's own namespace) reachable as
// 127.0.0.1:PORT inside a simulated node's namespace, without touching any network
// configuration: a TCP listener inside the node's namespace forwards each connection over a
// UNIX socket (sockets in the filesystem cross namespaces) to this process, which connects
// to the real server. TLS passes through untouched, so the same kubeconfig works on both
// sides. The bridge is also the loopback proxy the fault tests use to stall a watch.

import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface Bridge {
  /** While blocked, every connection open now is frozen and new ones are refused: the agent
   *  is cut off from the API server (and so misses whatever happens meanwhile). */
  setBlocked(blocked: boolean): void;
  /** Freezes every connection open now (new ones still work): a silent, stalled watch. */
  stallOpenConnections(): number;
  /** How many connections are open (and not stalled) now. */
  openConnections(): number;
  /** Cuts every connection open now. */
  dropOpenConnections(): number;
  close(): Promise<void>;
}

export async function bridgeApiServer(netns: string, port: number): Promise<Bridge> {
  const sock = join(tmpdir(), `weir-bridge-${process.pid}-${netns}.sock`);
  rmSync(sock, { force: true });
  const open = new Set<{ a: Socket; b: Socket }>();
  const stalled = new Set<{ a: Socket; b: Socket }>();
  let blocked = false;
  const server: Server = createServer((a) => {
    if (blocked) {
      a.destroy();
      return;
    }
    const b = connect(port, '127.0.0.1');
    const pair = { a, b };
    open.add(pair);
    a.pipe(b).pipe(a);
    const end = () => {
      open.delete(pair);
      stalled.delete(pair);
      a.destroy();
      b.destroy();
    };
    a.on('error', end).on('close', end);
    b.on('error', end).on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(sock, resolve));
  const script = `const net = require('node:net');
net.createServer((c) => { const u = net.connect(${JSON.stringify(sock)}); c.pipe(u).pipe(c); const end = () => { c.destroy(); u.destroy(); }; c.on('error', end).on('close', end); u.on('error', end).on('close', end); })
  .listen(${port}, '127.0.0.1', () => console.log('ready'));`;
  const child: ChildProcess = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`bridge in ${netns} exited ${code}`)));
  });
  const freeze = () => {
    for (const { a, b } of open) {
      a.unpipe(b);
      b.unpipe(a);
      a.pause();
      b.pause();
    }
    const n = open.size;
    for (const p of open) stalled.add(p); // frozen until the agent gives up on them
    open.clear();
    return n;
  };
  return {
    setBlocked(on) {
      blocked = on;
      if (on) freeze();
    },
    stallOpenConnections() {
      return freeze();
    },
    openConnections() {
      return open.size;
    },
    dropOpenConnections() {
      const n = open.size;
      for (const { a, b } of [...open]) {
        a.destroy();
        b.destroy();
      }
      return n;
    },
    async close() {
      if (child.exitCode === null) child.kill('SIGKILL');
      for (const { a, b } of [...open, ...stalled]) {
        a.destroy();
        b.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(sock, { force: true });
    },
  };
}
