// Conformance with real packets: ports (numeric, ranges, protocols, named), ipBlocks (excepts,
// overlaps, /0, host bits, families, pod IPs, the external host), invalid input, hostNetwork
// pods, connections that outlive a policy, and drift made by other programs on a node.
// Every predicate is written by hand from docs/semantics (never derived from Weir's code).

import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import { inNs } from '../../src/sim/netns.ts';
import { A1, A2, B1, B2, Conformance, EXTERNAL, G1, np, type Cell } from './harness.ts';
import { and, egress, from, ingress, none, or, self, tcp, udp, v } from './predicates.ts';

// The cast's named ports, copied from the harness header: http is TCP everywhere, dns is UDP.
const HTTP: Readonly<Record<string, number>> = { [A1]: 80, [A2]: 81, [B2]: 80, [G1]: 80 };

// Agents see a changed file within their 20 ms debounce; nothing can be awaited for a file that
// changes no revision, so this is a generous fixed wait.

/** Polls `check` until it returns true or the deadline passes; returns the last answer. */
async function until(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await sleep(200);
  }
}

/** A process started in a pod's namespace whose stdout lines can be awaited. */
class NsProcess {
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  readonly #waiters: (() => void)[] = [];

  constructor(netns: string, script: string, env: Record<string, string>) {
    // `ip netns exec` execs in place, so child.pid is the script's own process.
    this.child = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', script], {
      env: { ...process.env, ...env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const onLine = (line: string) => {
      this.lines.push(line);
      for (const w of this.#waiters.splice(0)) w();
    };
    createInterface({ input: this.child.stdout! }).on('line', onLine);
    createInterface({ input: this.child.stderr! }).on('line', (l) => onLine(`stderr: ${l}`));
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

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}

const ECHO_SERVER = `
const net = require('node:net');
net.createServer((s) => {
  s.setEncoding('utf8');
  s.on('error', () => {});
  s.on('data', (d) => s.write('echo:' + d));
}).listen(Number(process.env.PORT), '::', () => console.log('ready'));`;

// Connects once, relays stdin lines to the socket and socket lines to stdout.
const ECHO_CLIENT = `
const net = require('node:net');
const rl = require('node:readline');
const s = net.connect({ host: process.env.HOST, port: Number(process.env.PORT) });
const t = setTimeout(() => { console.log('timeout'); process.exit(0); }, Number(process.env.CONNECT_MS));
s.on('connect', () => { clearTimeout(t); console.log('connected'); });
s.on('error', (e) => { console.log('error ' + e.code); process.exit(0); });
rl.createInterface({ input: s }).on('line', (l) => console.log(l));
rl.createInterface({ input: process.stdin }).on('line', (l) => s.write(l + '\\n'));`;

describe('conformance: ports, ipBlocks, invalid input, hostNetwork, drift', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wcpb');
  });
  after(async () => {
    await c?.stop();
  });

  // ---- ports --------------------------------------------------------------------------------

  test('a numeric TCP port allows that port only, and editing it moves the allowance', async () => {
    await c.reset();
    await c.setPolicies(np('alpha', 'p', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ protocol: 'TCP', port: 80 }] }] }));
    await c.expect(ingress({ [A1]: tcp(80) }), 'TCP 80');
    await c.setPolicies(np('alpha', 'p', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ protocol: 'TCP', port: 81 }] }] }));
    await c.expect(ingress({ [A1]: tcp(81) }), 'TCP 81');
  });

  test('a protocol with no port allows every port of that protocol and none of the other', async () => {
    await c.reset();
    await c.setPolicies(np('beta', 'p', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ ports: [{ protocol: 'UDP' }] }] }));
    await c.expect(ingress({ [B2]: udp() }), 'UDP, every port');
    await c.setPolicies(np('beta', 'p', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ ports: [{ protocol: 'TCP' }] }] }));
    await c.expect(ingress({ [B2]: tcp() }), 'TCP, every port');
  });

  test('a port with no protocol means TCP', async () => {
    await c.reset();
    await c.setPolicies(np('gamma', 'p', { podSelector: {}, ingress: [{ ports: [{ port: 81 }] }] }));
    await c.expect(ingress({ [G1]: tcp(81) }));
  });

  test('endPort makes a range: 80-81 allows both ports, 81-81 only 81', async () => {
    await c.reset();
    await c.setPolicies(np('alpha', 'p', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ ports: [{ port: 80, endPort: 81 }] }] }));
    await c.expect(ingress({ [A2]: tcp() }), '80-81');
    await c.setPolicies(np('alpha', 'p', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ ports: [{ port: 81, endPort: 81 }] }] }));
    await c.expect(ingress({ [A2]: tcp(81) }), '81-81');
  });

  test('several ports in one rule each allow their own protocol and port; TCP and UDP on one number are separate entries', async () => {
    await c.reset();
    const pol = (ports: unknown[]) => np('beta', 'p', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports }] });
    await c.setPolicies(pol([{ protocol: 'UDP', port: 80 }, { port: 81 }]));
    await c.expect(ingress({ [B1]: or(udp(80), tcp(81)) }), 'UDP 80 + TCP 81');
    await c.setPolicies(
      pol([
        { protocol: 'TCP', port: 80 },
        { protocol: 'UDP', port: 80 },
      ]),
    );
    await c.expect(ingress({ [B1]: (x) => x.port === 80 }), 'TCP 80 + UDP 80');
  });

  test('an ingress named port resolves on each selected pod: http is 80 on a1 but 81 on a2', async () => {
    await c.reset();
    await c.setPolicies(
      np('alpha', 'named', {
        podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['web', 'db'] }] },
        ingress: [{ ports: [{ port: 'http' }] }],
      }),
    );
    await c.expect(ingress({ [A1]: tcp(80), [A2]: tcp(81) }), 'both selected');
    await c.setPodLabels(A2, { app: 'cache' });
    await c.expect(ingress({ [A1]: tcp(80) }), 'a2 no longer selected');
  });

  test('an egress named port resolves on each destination; destinations lacking the name are unreachable', async () => {
    await c.reset();
    const pol = (to: unknown) => np('alpha', 'named-out', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'], egress: [{ to: [to], ports: [{ port: 'http' }] }] });
    // b1 has no named port at all; every other pod has http with its own number.
    const toHttp = (targets: string[]) => (x: Cell) => targets.includes(x.target) && x.target in HTTP && tcp(HTTP[x.target])(x);
    await c.setPolicies(pol({ namespaceSelector: {} }));
    await c.expect(egress(A1, toHttp([A2, B2, G1])), 'every namespace');
    await c.setPolicies(pol({ namespaceSelector: { matchLabels: { team: 'b' } } }));
    await c.expect(egress(A1, toHttp([B2])), 'team b only');
    await c.setNamespaceLabels('gamma', { team: 'b' });
    await c.expect(egress(A1, toHttp([B2, G1])), 'gamma joins team b');
  });

  test('a named port with protocol UDP matches only UDP container ports of that name', async () => {
    await c.reset();
    await c.setPolicies(np('gamma', 'dns', { podSelector: {}, ingress: [{ ports: [{ protocol: 'UDP', port: 'dns' }] }] }));
    await c.expect(ingress({ [G1]: udp(81) }), 'UDP dns');
    // g1's "dns" is UDP, so the same name as TCP (the default) resolves to nothing.
    await c.setPolicies(np('gamma', 'dns', { podSelector: {}, ingress: [{ ports: [{ port: 'dns' }] }] }));
    await c.expect(ingress({ [G1]: none }), 'TCP dns');
  });

  test('an egress named port toward an ipBlock peer matches nothing, while a numeric port does (impl)', async () => {
    await c.reset();
    const pol = (ports: unknown[]) =>
      np('alpha', 'named-block', {
        podSelector: { matchLabels: { app: 'web' } },
        policyTypes: ['Egress'],
        egress: [{ to: [{ ipBlock: { cidr: '10.244.0.0/16' } }, { ipBlock: { cidr: 'fd00:10:244::/48' } }], ports }],
      });
    await c.setPolicies(pol([{ port: 'http' }]));
    await c.expect(egress(A1, none), 'named port only');
    await c.setPolicies(pol([{ port: 'http' }, { port: 80 }]));
    await c.expect(egress(A1, tcp(80)), 'named port plus TCP 80');
  });

  // ---- ipBlock ------------------------------------------------------------------------------

  test('an ipBlock admits the external host only while a block covers it, in its own family', async () => {
    await c.reset();
    const pol = (...cidrs: string[]) => np('alpha', 'ext', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: cidrs.map((cidr) => ({ ipBlock: { cidr } })) }] });
    await c.setPolicies(pol('172.31.0.200/32'));
    await c.expect(ingress({ [A1]: and(from(EXTERNAL), v(4)) }), '/32');
    await c.setPolicies(pol('172.31.0.0/24', 'fd00:172:31::/64'));
    await c.expect(ingress({ [A1]: from(EXTERNAL) }), '/24 and /64');
    await c.setPolicies(pol('172.31.1.0/24', 'fd00:172:32::/64'));
    await c.expect(ingress({ [A1]: none }), 'blocks beside it');
  });

  test('except carves addresses out of a cidr: the external host and node-b pods excepted', async () => {
    await c.reset();
    const pol = (extExcept: string) =>
      np('alpha', 'except', {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [
          {
            from: [
              { ipBlock: { cidr: '172.31.0.0/24', except: [extExcept] } },
              { ipBlock: { cidr: '10.244.0.0/16', except: ['10.244.2.0/24'] } },
              { ipBlock: { cidr: 'fd00:172:31::/64', except: ['fd00:172:31::200/128'] } },
            ],
          },
        ],
      });
    await c.setPolicies(pol('172.31.0.200/32'));
    await c.expect(ingress({ [A1]: and(from(B1), v(4)) }), 'external excepted');
    await c.setPolicies(pol('172.31.0.0/25'));
    await c.expect(ingress({ [A1]: and(from(B1, EXTERNAL), v(4)) }), 'except no longer covers .200');
  });

  test('overlapping blocks: an address excepted by one block but covered by another is allowed', async () => {
    await c.reset();
    const pol = (v4: string, v6: string) =>
      np('alpha', 'overlap', {
        podSelector: { matchLabels: { app: 'db' } },
        ingress: [
          {
            from: [
              { ipBlock: { cidr: '10.244.0.0/16', except: ['10.244.2.0/24'] } },
              { ipBlock: { cidr: v4 } },
              { ipBlock: { cidr: 'fd00:10:244::/48', except: ['fd00:10:244:1::/64'] } },
              { ipBlock: { cidr: v6 } },
            ],
          },
        ],
      });
    // a1 10.244.1.11 / ::11, b1 .1.21 / ::21, b2 .2.22, g1 ::31 (node-a's /64 is excepted).
    await c.setPolicies(pol('10.244.2.16/28', 'fd00:10:244:1::20/124'));
    await c.expect(ingress({ [A2]: or(and(v(4), from(A1, B1, B2)), and(v(6), from(B1))) }), '.16/28 and ::20/124');
    await c.setPolicies(pol('10.244.2.0/28', 'fd00:10:244:1::30/124'));
    await c.expect(ingress({ [A2]: or(and(v(4), from(A1, B1)), and(v(6), from(G1))) }), '.0/28 and ::30/124');
  });

  test('0.0.0.0/0 and ::/0 match every address of their family, pods included (impl)', async () => {
    await c.reset();
    const pol = (...blocks: unknown[]) => np('alpha', 'all', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: blocks.map((ipBlock) => ({ ipBlock })) }] });
    await c.setPolicies(pol({ cidr: '0.0.0.0/0' }));
    await c.expect(ingress({ [A1]: v(4) }), '0.0.0.0/0');
    await c.setPolicies(pol({ cidr: '0.0.0.0/0' }, { cidr: '::/0' }));
    await c.expect(ingress({ [A1]: () => true }), 'both /0');
    await c.setPolicies(pol({ cidr: '0.0.0.0/0', except: ['10.244.0.0/16'] }, { cidr: '::/0', except: ['fd00:10:244::/48'] }));
    await c.expect(ingress({ [A1]: from(EXTERNAL) }), '/0 except the pod ranges');
  });

  test('a cidr with host bits set is treated as its network', async () => {
    await c.reset();
    await c.setPolicies(
      np('alpha', 'hostbits', {
        podSelector: { matchLabels: { app: 'db' } },
        ingress: [{ from: [{ ipBlock: { cidr: '172.31.0.7/24' } }, { ipBlock: { cidr: '10.244.1.99/24' } }, { ipBlock: { cidr: 'fd00:10:244:1::99/64' } }] }],
      }),
    );
    // node-a's pods (a1, b1 both families, g1 v6) and the external host over IPv4.
    await c.expect(ingress({ [A2]: or(from(A1, B1, G1), and(from(EXTERNAL), v(4))) }));
  });

  test('an ipBlock of one family allows nothing of the other, even on single-stack pods', async () => {
    await c.reset();
    await c.setPolicies(
      np('beta', 'v6-to-v4only', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ ipBlock: { cidr: '::/0' } }] }] }),
      np('gamma', 'v4-to-v6only', { podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0' } }] }] }),
      np('alpha', 'ext-v6', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ ipBlock: { cidr: 'fd00:172:31::/64' } }] }] }),
    );
    await c.expect(ingress({ [B2]: none, [G1]: none, [A1]: and(from(EXTERNAL), v(6)) }), 'other family');
    await c.setPolicies(
      np('beta', 'v6-to-v4only', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ ipBlock: { cidr: '0.0.0.0/0' } }] }] }),
      np('gamma', 'v4-to-v6only', { podSelector: {}, ingress: [{ from: [{ ipBlock: { cidr: '::/0' } }] }] }),
    );
    await c.expect(() => true, 'own family');
  });

  test('an egress ipBlock covering a pod IP allows that pod in that family only (impl)', async () => {
    await c.reset();
    const pol = (cidr: string) => np('beta', 'to-a2', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'], egress: [{ to: [{ ipBlock: { cidr } }] }] });
    await c.setPolicies(pol('10.244.2.12/32'));
    await c.expect(
      egress(
        B1,
        and((x) => x.target === A2, v(4)),
      ),
      'a2 over IPv4',
    );
    await c.setPolicies(pol('fd00:10:244:2::12/128'));
    await c.expect(
      egress(
        B1,
        and((x) => x.target === A2, v(6)),
      ),
      'a2 over IPv6',
    );
  });

  test('a /32 ipBlock and a pod selector naming the same address: the address stays allowed when the pod stops matching', async () => {
    await c.reset();
    // Both rules allow every port, so a1's ingress merges their peers into one set per family,
    // where a2's IPv4 address comes from both: the block (as a /32) and the selected pod.
    const block = np('alpha', 'from-a2-block', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ ipBlock: { cidr: '10.244.2.12/32' } }] }] });
    const db = np('alpha', 'from-db', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'db' } } }] }] });
    await c.setPolicies(block, db);
    await c.expect(ingress({ [A1]: from(A2) }), 'a2 over both families');
    await c.setPodLabels(A2, { app: 'cache' });
    await c.expect(ingress({ [A1]: and(from(A2), v(4)) }), 'a2 over IPv4 only: the block still covers it');
  });

  test('egress to the external host follows the ipBlock, its family and its ports', async () => {
    await c.reset();
    const pol = (cidr: string, ports?: unknown[]) =>
      np('alpha', 'to-ext', { podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Egress'], egress: [{ to: [{ ipBlock: { cidr } }], ...(ports ? { ports } : {}) }] });
    await c.setPolicies(pol('172.31.0.200/32', [{ port: 80 }]));
    await c.expect(egress(A1, none), 'pods unreachable from a1');
    await c.expectToExternal((x) => x.source !== A1 || (x.family === 4 && tcp(80)(x)), 'v4 TCP 80 to external');
    await c.setPolicies(pol('fd00:172:31::/64'));
    await c.expectToExternal((x) => x.source !== A1 || x.family === 6, 'v6 to external');
  });

  // ---- invalid input ------------------------------------------------------------------------

  test('an invalid policy is skipped whole, keeps the pods it selects isolated, and valid ones still apply', async () => {
    await c.reset();
    const valid = np('alpha', 'web-80', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 80 }] }] });
    // Half-applying these would open everything through the `{}` rule.
    const badCidr = (ns: string, app: string) => np(ns, 'bad-cidr', { podSelector: { matchLabels: { app } }, ingress: [{}, { from: [{ ipBlock: { cidr: 'nonsense' } }] }] });
    await c.setPolicies(valid, badCidr('alpha', 'web'), badCidr('beta', 'db'));
    await c.expect(ingress({ [A1]: tcp(80), [B2]: none }), 'bad cidr');

    // An unreadable podSelector isolates every pod of its namespace, in its declared direction.
    const badOp = (operator: string) => np('alpha', 'bad-op', { podSelector: { matchExpressions: [{ key: 'app', operator, values: ['web'] }] }, policyTypes: ['Ingress'], ingress: [{}] });
    await c.setPolicies(valid, badOp('in'));
    await c.expect(ingress({ [A1]: tcp(80), [A2]: none }), 'operator "in"');
    await c.setPolicies(valid, badOp('In'));
    await c.expect(ingress({ [A1]: () => true }), 'operator fixed');
  });

  test('a manifest file that stops parsing keeps its last good content; fixing or deleting it applies', async () => {
    await c.reset();
    const file = '40-raw.yaml';
    const head = ['apiVersion: networking.k8s.io/v1', 'kind: NetworkPolicy', 'metadata:', '  name: raw', '  namespace: alpha', 'spec:', '  podSelector:', '    matchLabels:', '      app: db'];
    try {
      await c.writeRaw(file, [...head, '  ingress:', '    - from:', '        - podSelector:', '            matchLabels:', '              app: web', ''].join('\n'));
      await c.expect(ingress({ [A2]: from(A1) }), 'valid file');
      await c.writeBrokenRaw(file, [...head, '  ingress: [ { from: [ {podSelector: ', ''].join('\n'));
      await c.expect(ingress({ [A2]: from(A1) }), 'broken file keeps last good content');
      await c.writeRaw(file, [...head, '  ingress:', '    - ports:', '        - port: 81', ''].join('\n'));
      await c.expect(ingress({ [A2]: tcp(81) }), 'fixed file');
      await c.removeRaw(file);
      await c.expect(() => true, 'file deleted');
    } finally {
      await c.removeRaw(file);
    }
  });

  // ---- hostNetwork ----------------------------------------------------------------------------

  // The harness has no hostNetwork switch: this flips the pod's manifest field and rewrites the
  // files. A real hostNetwork pod sends from the node's own address (node-traffic.test.ts: always
  // allowed, never policed). The simulated pod keeps its bridged namespace and IP, which then
  // belongs to no pod Weir polices: its traffic fails closed both ways, and it is in no peer set.
  test('a hostNetwork pod is never a policy target, and a bridged address claimed by one belongs to no pod (impl)', async () => {
    await c.reset();
    const setHostNetwork = async (key: string, on: boolean) => {
      c.pods.get(key)!.hostNetwork = on;
      await c.setPolicies(...c.policies);
    };
    await c.setPolicies(
      np('alpha', 'deny', { podSelector: {} }),
      np('alpha', 'from-web', { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'web' } } }] }] }),
    );
    await c.expect(ingress({ [A1]: none, [A2]: from(A1, B1, G1) }), 'a1 a normal pod');
    await setHostNetwork(A1, true);
    const unknownA1 = (x: Cell) => self(x) || (x.source !== A1 && x.target !== A1);
    await c.expect(and(unknownA1, ingress({ [A2]: from(B1, G1) })), 'a1 on the host network');
    await setHostNetwork(A1, false);
    await c.expect(ingress({ [A1]: none, [A2]: from(A1, B1, G1) }), 'a1 back on the pod network');
  });

  // ---- existing connections -------------------------------------------------------------------

  test('an established connection survives a policy that denies new ones (impl)', async () => {
    await c.reset();
    const procs: NsProcess[] = [];
    try {
      const server = new NsProcess(c.cluster.endpoint(A2)!.netns, ECHO_SERVER, { PORT: '8080' });
      procs.push(server);
      await server.waitFor('ready');
      const client = (host: string) => {
        const p = new NsProcess(c.cluster.endpoint(A1)!.netns, ECHO_CLIENT, { HOST: host, PORT: '8080', CONNECT_MS: '1500' });
        procs.push(p);
        return p;
      };
      const old4 = client('10.244.2.12');
      const old6 = client('fd00:10:244:2::12');
      for (const [i, p] of [old4, old6].entries()) {
        await p.waitFor('connected');
        p.send(`before${i}`);
        await p.waitFor(`echo:before${i}`);
      }

      await c.setPolicies(np('alpha', 'deny-db', { podSelector: { matchLabels: { app: 'db' } } }));
      await c.expect(ingress({ [A2]: none }), 'a2 denies all ingress');
      for (const [i, p] of [old4, old6].entries()) {
        p.send(`after${i}`);
        await p.waitFor(`echo:after${i}`);
      }
      const fresh = client('10.244.2.12');
      await fresh.waitFor('timeout');
      if (fresh.lines.includes('connected')) throw new Error(`a new connection got through: ${fresh.lines.join(' | ')}`);
    } finally {
      for (const p of procs) p.kill();
    }
  });

  // ---- drift made by other programs -------------------------------------------------------------

  describe('drift on node-a is repaired within the resync interval, and foreign rules survive', () => {
    const RESYNC_DEADLINE_MS = 12_000;
    const nodeA = () => c.nodeNetns('node-a');
    const ipt = (family: 4 | 6, ...args: string[]) => inNs(nodeA(), family === 4 ? 'iptables' : 'ip6tables', args);
    const forward = async (family: 4 | 6) => (await ipt(family, '-S', 'FORWARD')).split('\n').filter((l) => l.startsWith('-A FORWARD'));
    const FLANNEL = ['-s', '10.244.0.0/16', '-m', 'comment', '--comment', 'flanneld forward', '-j', 'ACCEPT'];
    const KUBE_JUMP = ['-m', 'comment', '--comment', 'kubernetes forwarding rules', '-j', 'KUBE-FORWARD'];
    const KUBE_RULE = ['-m', 'mark', '--mark', '0x4000/0x4000', '-j', 'ACCEPT'];
    // Accepts node-a's pod traffic before Weir sees it: harmless only while our hook is first.
    const TOP = ['-s', '10.244.0.0/16', '-m', 'comment', '--comment', 'foreign top', '-j', 'ACCEPT'];
    let foreignBefore = '';

    const foreignState = async () => {
      const kube = await ipt(4, '-S', 'KUBE-FORWARD');
      const fwd = (await forward(4)).filter((l) => !l.includes('weir:'));
      return `${kube}\n${fwd.join('\n')}`;
    };

    before(async () => {
      await ipt(4, '-N', 'KUBE-FORWARD');
      await ipt(4, '-A', 'KUBE-FORWARD', ...KUBE_RULE);
      await ipt(4, '-A', 'FORWARD', ...KUBE_JUMP);
      await ipt(4, '-A', 'FORWARD', ...FLANNEL);
      foreignBefore = await foreignState();
    });

    after(async () => {
      // The cluster is destroyed with the file; this only keeps the tests independent.
      await ipt(4, '-D', 'FORWARD', ...TOP).catch(() => {});
      await ipt(4, '-D', 'FORWARD', ...FLANNEL).catch(() => {});
      await ipt(4, '-D', 'FORWARD', ...KUBE_JUMP).catch(() => {});
      await ipt(4, '-F', 'KUBE-FORWARD').catch(() => {});
      await ipt(4, '-X', 'KUBE-FORWARD').catch(() => {});
    });

    test('a foreign rule inserted above the hook: the hook returns to position 1, the rule stays', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'deny', { podSelector: { matchLabels: { app: 'web' } } }));
      await ipt(4, '-I', 'FORWARD', '1', ...TOP);
      const repaired = await until(async () => {
        const rules = await forward(4);
        return rules[0]?.includes('weir:hook') === true && rules[1]?.includes('foreign top') === true;
      }, RESYNC_DEADLINE_MS);
      if (!repaired) throw new Error(`hook not first again within ${RESYNC_DEADLINE_MS} ms:\n${(await forward(4)).join('\n')}`);
      await c.expect(ingress({ [A1]: none }), 'policy enforced with the foreign rule second');
      const now = (await forward(4)).filter((l) => !l.includes('weir:'));
      if (!now.some((l) => l.includes('foreign top'))) throw new Error(`foreign rule removed:\n${now.join('\n')}`);
      await ipt(4, '-D', 'FORWARD', ...TOP);
      const foreignNow = await foreignState();
      if (foreignNow !== foreignBefore) throw new Error(`foreign rules changed:\nbefore:\n${foreignBefore}\nafter:\n${foreignNow}`);
    });

    test('a flushed cali-tw- chain is rewritten and enforcement returns', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'deny', { podSelector: { matchLabels: { app: 'web' } } }));
      // Find a1's ingress chain by the comment Weir writes into it, in both families.
      const twChain = async (family: 4 | 6) => {
        const line = (await ipt(family, '-t', 'mangle', '-S')).split('\n').find((l) => l.startsWith('-A cali-tw-') && l.includes('ingress to alpha/a1'));
        return line?.split(' ')[1];
      };
      const chains = { 4: await twChain(4), 6: await twChain(6) };
      if (!chains[4] || !chains[6]) throw new Error(`no cali-tw- chain for alpha/a1: ${JSON.stringify(chains)}`);
      await ipt(4, '-t', 'mangle', '-F', chains[4]);
      await ipt(6, '-t', 'mangle', '-F', chains[6]);
      const repaired = await until(async () => (await twChain(4)) === chains[4] && (await twChain(6)) === chains[6], RESYNC_DEADLINE_MS);
      if (!repaired) throw new Error(`${chains[4]} / ${chains[6]} not rewritten within ${RESYNC_DEADLINE_MS} ms`);
      await c.expect(ingress({ [A1]: none }), 'a1 isolated again');
      const foreignNow = await foreignState();
      if (foreignNow !== foreignBefore) throw new Error(`foreign rules changed:\nbefore:\n${foreignBefore}\nafter:\n${foreignNow}`);
    });

    test('a flushed peer set is refilled and enforcement returns', async () => {
      await c.reset();
      await c.setPolicies(np('alpha', 'from-db', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } }] }] }));
      const members = async (set: string) => (await inNs(nodeA(), 'ipset', ['list', set])).split('Members:')[1]?.trim().split('\n').filter(Boolean) ?? [];
      const names = (await inNs(nodeA(), 'ipset', ['list', '-n'])).split('\n').filter((n) => n.startsWith('cali40s:'));
      let peerSet: string | undefined;
      for (const n of names) if ((await members(n)).includes('10.244.2.12')) peerSet = n;
      if (!peerSet) throw new Error(`no v4 set holding a2's address among ${names.join(', ')}`);
      const want = (await members(peerSet)).sort();
      await inNs(nodeA(), 'ipset', ['flush', peerSet]);
      const refilled = await until(async () => JSON.stringify((await members(peerSet)).sort()) === JSON.stringify(want), RESYNC_DEADLINE_MS);
      if (!refilled) throw new Error(`${peerSet} not refilled within ${RESYNC_DEADLINE_MS} ms: ${(await members(peerSet)).join(' ')}`);
      await c.expect(ingress({ [A1]: from(A2, B2) }), 'db pods reach a1 again');
      const foreignNow = await foreignState();
      if (foreignNow !== foreignBefore) throw new Error(`foreign rules changed:\nbefore:\n${foreignBefore}\nafter:\n${foreignNow}`);
    });
  });
});
