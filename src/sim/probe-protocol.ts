// The JSON-lines protocol between the test process and a pod server's UNIX control socket.
// UNIX sockets are not bound to a network namespace, so the test process can ask a server
// to open connections from inside its pod's namespace.

import type { Socket } from 'node:net';

export type ProbeProto = 'tcp' | 'udp';

/** Calls `onLine` with every complete line that arrives on the socket (one message a line). */
export function onLines(sock: Socket, onLine: (line: string) => void): void {
  let buffered = '';
  sock.setEncoding('utf8');
  sock.on('data', (chunk: string) => {
    buffered += chunk;
    let nl: number;
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl);
      buffered = buffered.slice(nl + 1);
      onLine(line);
    }
  });
}

export interface ProbeRequest {
  readonly id: number;
  readonly proto: ProbeProto;
  readonly ip: string;
  readonly port: number;
  readonly timeoutMs: number;
}

export interface ProbeResult {
  readonly id: number;
  /** TCP: connected and read the server's name. UDP: the echo arrived before the timeout. */
  readonly ok: boolean;
  /** What the target server sent back: its endpoint name. */
  readonly reply?: string;
  /** Why the probe failed: an errno code such as ECONNREFUSED, or "timeout". */
  readonly error?: string;
}
