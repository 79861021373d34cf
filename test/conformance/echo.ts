// Long-lived TCP connections between pods, for the tests of established flows: an echo server
// and a client that relays its stdin lines, each a process in a pod's namespace.

import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
// Marks every process started from here, so the suite's last file finds any that outlive their test.
import '../support/leftovers.ts';

/** A process started in a pod's namespace whose stdout lines can be awaited. */
export class NsProcess {
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  readonly #waiters: (() => void)[] = [];
  readonly #exited: Promise<void>;

  /** `argv` runs the script (through `ip netns exec`, or into a node first): see inNetns. */
  constructor(argv: readonly string[], spawnEnv: NodeJS.ProcessEnv = process.env) {
    this.child = spawn(argv[0]!, argv.slice(1), { env: spawnEnv, stdio: ['pipe', 'pipe', 'pipe'] });
    const onLine = (line: string) => {
      this.lines.push(line);
      for (const w of this.#waiters.splice(0)) w();
    };
    createInterface({ input: this.child.stdout! }).on('line', onLine);
    createInterface({ input: this.child.stderr! }).on('line', (l) => onLine(`stderr: ${l}`));
    this.#exited = new Promise((resolve) => this.child.on('close', () => resolve()));
  }

  /** `script` run by this machine's Node.js in network namespace `netns`, with `env` set.
   *  `ip netns exec` and `env` exec in place, so child.pid is the script's own process. */
  static inNetns(netns: string, script: string, env: Record<string, string>, prefix: readonly string[] = [], spawnEnv?: NodeJS.ProcessEnv): NsProcess {
    const vars = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    return new NsProcess([...prefix, 'ip', 'netns', 'exec', netns, 'env', ...vars, process.execPath, '-e', script], spawnEnv);
  }

  async waitFor(line: string, timeoutMs = 5000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!this.lines.includes(line)) {
      if (Date.now() > deadline) throw new Error(`no line "${line}" within ${timeoutMs} ms; got: ${JSON.stringify(this.lines)}`);
      await Promise.race([new Promise<void>((r) => this.#waiters.push(r)), sleep(100)]);
    }
  }

  send(line: string): void {
    this.child.stdin!.write(line + '\n');
  }

  /** Ends the script by closing its stdin (it may run inside a node, out of reach of a
   *  signal to the child), and waits for it. */
  async stop(): Promise<void> {
    this.child.stdin!.end();
    await this.#exited;
  }

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}

export const ECHO_SERVER = `
const net = require('node:net');
net.createServer((s) => {
  s.setEncoding('utf8');
  s.on('error', () => {});
  s.on('data', (d) => s.write('echo:' + d));
}).listen(Number(process.env.PORT), '::', () => console.log('ready'));
process.stdin.on('end', () => process.exit(0)).resume();`;

/** Connects once, relays stdin lines to the socket and socket lines to stdout; ends with its
 *  stdin. */
export const ECHO_CLIENT = `
const net = require('node:net');
const rl = require('node:readline');
const s = net.connect({ host: process.env.HOST, port: Number(process.env.PORT) });
const t = setTimeout(() => { console.log('timeout'); process.exit(0); }, Number(process.env.CONNECT_MS));
s.on('connect', () => { clearTimeout(t); console.log('connected'); });
s.on('error', (e) => { console.log('error ' + e.code); process.exit(0); });
rl.createInterface({ input: s }).on('line', (l) => console.log(l));
rl.createInterface({ input: process.stdin }).on('line', (l) => s.write(l + '\\n')).on('close', () => process.exit(0));`;
