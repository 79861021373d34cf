// Connection attempts made from inside a pod's network namespace, at a steady pace, by a
// process on the pod's node: `kubectl exec` takes longer per attempt than the gaps these checks
// must see. The process is the node's own Node.js (this checkout's), entered into the
// namespace the runtime pinned for the pod; its clock is this machine's.

import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ok, REPO, type RealCluster } from './harness.ts';

/** One attempt: when it was sent, where to, and whether it connected. */
export interface Attempt {
  readonly at: number;
  readonly target: string;
  readonly connected: boolean;
}

export interface Prober {
  readonly attempts: readonly Attempt[];
  stop(): Promise<void>;
}

// Every `interval` ms, one TCP connect to each target; each attempt is printed once decided:
// `<ms when sent> <target> ok|fail`.
const SCRIPT = `
const net = require('node:net');
const [interval, timeout, ...targets] = process.argv.slice(1);
setInterval(() => {
  for (const target of targets) {
    const at = Date.now();
    const [host, port] = target.split(':');
    const s = net.connect({ host, port: Number(port) });
    let done = false;
    const end = (r) => { if (done) return; done = true; s.destroy(); console.log(at + ' ' + target + ' ' + r); };
    s.setTimeout(Number(timeout), () => end('fail'));
    s.on('connect', () => end('ok'));
    s.on('error', () => end('fail'));
  }
}, Number(interval));
process.stdin.on('end', () => process.exit(0)).resume();
`;

/** The name (under the node's /run/netns) of the namespace holding `podIp`. */
export async function podNetns(c: RealCluster, node: string, podIp: string): Promise<string> {
  const out = ok('ip netns', await c.onNode(node, ['sh', '-c', 'for n in $(ip netns list | cut -d" " -f1); do echo "$n $(ip -n "$n" -4 -o addr show scope global)"; done']));
  const line = out.split('\n').find((l) => l.includes(` ${podIp}/`));
  if (line === undefined) throw new Error(`no network namespace on ${node} holds ${podIp}:\n${out}`);
  return line.split(' ')[0]!;
}

/** Starts attempts from the pod with address `podIp` on `node` to each `ip:port` target. */
export async function startProber(c: RealCluster, node: string, podIp: string, targets: readonly string[], intervalMs = 100, timeoutMs = 500): Promise<Prober> {
  const netns = await podNetns(c, node, podIp);
  const node24 = join(REPO, 'node_modules/node/bin/node');
  const child = spawn(join(REPO, 'scripts/cluster.sh'), ['node-exec', node, 'ip', 'netns', 'exec', netns, node24, '-e', SCRIPT, String(intervalMs), String(timeoutMs), ...targets], {
    env: c.env,
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const attempts: Attempt[] = [];
  createInterface({ input: child.stdout }).on('line', (line) => {
    const [at, target, result] = line.split(' ');
    if (target !== undefined) attempts.push({ at: Number(at), target, connected: result === 'ok' });
  });
  const exited = new Promise<void>((resolve) => child.on('close', () => resolve()));
  return {
    attempts,
    stop: async () => {
      // Closing its stdin ends the prober inside the node; nsenter and the script follow.
      child.stdin.end();
      await exited;
    },
  };
}

/** The longest time between two connected attempts to `target` within [from, to]. */
export function longestOutage(attempts: readonly Attempt[], target: string, from: number, to: number): number {
  const times = attempts.filter((a) => a.target === target && a.connected && a.at >= from && a.at <= to).map((a) => a.at);
  let longest = 0;
  let last = from;
  for (const t of [...times, to]) {
    longest = Math.max(longest, t - last);
    last = t;
  }
  return longest;
}
