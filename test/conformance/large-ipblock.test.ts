// Conformance with real packets for policies as large as the API server takes (about 1 MB):
// a namespace denying all ingress but from a huge ipBlock stays isolated on IPv4 and IPv6,
// later changes to any policy still apply, a policy over Weir's limits fails closed with its
// reason, and each agent's memory stays within its budget (read from /proc, printed).
// Every predicate is written by hand from docs/semantics (never derived from Weir's code).

import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { A1, A2, B1, B2, Conformance, EXTERNAL, np } from './harness.ts';
import { and, from, ingress, none, not, tcp, v } from './predicates.ts';

/** Peak resident memory one agent may reach while it holds a 1 MB policy (docs/behaviour.md). */
const AGENT_RSS_BUDGET_MB = 512;
const MB = 1 << 20;
const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

/** Host prefixes scattered over the IPv6 space, none in the simulated cluster (fd00::/16). */
function* v6Hosts(): Generator<string> {
  for (let i = 1; ; i++) {
    const h = Math.imul(i, 2654435761) >>> 0;
    if (h >>> 16 === 0xfd00) continue;
    yield `${(h >>> 16).toString(16)}:${(h & 0xffff).toString(16)}:${i.toString(16)}::${(i & 0xfff).toString(16)}/128`;
  }
}

function* v4Hosts(): Generator<string> {
  for (let i = 1; ; i++) {
    const h = Math.imul(i, 2654435761) >>> 0;
    yield `${(h >>> 24) & 255 || 1}.${(h >>> 16) & 255}.${(h >>> 8) & 255}.${h & 255}/32`;
  }
}

/** n excepts, or as many as keep the policy under `bytes` of JSON. */
function excepts(gen: Generator<string>, fixed: string[], n: number, bytes = Infinity): string[] {
  const out = [...fixed];
  let size = JSON.stringify(out).length + 200;
  while (out.length < n) {
    const e = gen.next().value as string;
    size += e.length + 3;
    if (size > bytes) break;
    out.push(e);
  }
  return out;
}

/** The issue's shape: every pod of alpha gets ingress only from this one block. */
const huge = (cidr: string, except: string[]) => np('alpha', 'huge', { podSelector: {}, policyTypes: ['Ingress'], ingress: [{ from: [{ ipBlock: { cidr, except } }] }] });

/** b1's and the external host's IPv6 addresses: excepted, so they stay out. */
const B1_V6 = 'fd00:10:244:1::21/128';
const EXTERNAL_V6 = 'fd00:172:31::200/128';

interface AgentMemory {
  readonly node: string;
  readonly rssMb: number;
  readonly peakMb: number;
}

/** Each `weir agent` of this cluster, found by its manifests directory, with VmRSS and VmHWM. */
function agentMemory(dir: string): AgentMemory[] {
  const out: AgentMemory[] = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let argv: string[];
    let status: string;
    try {
      argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      if (!argv.includes('agent') || !argv.includes(dir)) continue;
      status = readFileSync(`/proc/${pid}/status`, 'utf8');
    } catch {
      continue; // gone meanwhile
    }
    const kb = (field: string) => Number(/^(\w+):\s+(\d+) kB$/m.exec(status.split('\n').find((l) => l.startsWith(`${field}:`)) ?? '')?.[2] ?? NaN);
    out.push({ node: argv[argv.indexOf('--node-name') + 1], rssMb: kb('VmRSS') / 1024, peakMb: kb('VmHWM') / 1024 });
  }
  return out.sort((a, b) => (a.node < b.node ? -1 : 1));
}

function checkMemory(c: Conformance, what: string): void {
  const mem = agentMemory(c.dir);
  if (mem.length !== 2) throw new Error(`found ${mem.length} agents of ${c.dir}, expected 2`);
  console.log(`agent memory ${what}: ${mem.map((m) => `${m.node} rss ${m.rssMb.toFixed(0)} MB, peak ${m.peakMb.toFixed(0)} MB`).join('; ')}`);
  for (const m of mem) {
    if (!(m.peakMb < AGENT_RSS_BUDGET_MB)) throw new Error(`agent on ${m.node} peaked at ${m.peakMb.toFixed(0)} MB, over its ${AGENT_RSS_BUDGET_MB} MB budget (${what})`);
  }
}

describe('conformance: policies as large as the API server takes', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start('wlib');
    checkMemory(c, 'at start');
  });
  after(async () => {
    await c?.stop();
  });

  const isolatedButV6 = (...excepted: string[]) => and(v(6), not(from(...excepted)));

  test('::/0 except 15,000 scattered /128s (400 KB): alpha stays isolated on IPv4 and IPv6, and later changes apply', async () => {
    await c.reset();
    const except = excepts(v6Hosts(), [B1_V6, EXTERNAL_V6], 15_002);
    const policy = huge('::/0', except);
    console.log(`policy: ${except.length} excepts, ${(JSON.stringify(policy).length / 1024).toFixed(0)} KB`);
    await c.setPolicies(policy);
    await c.expect(ingress({ [A1]: isolatedButV6(B1, EXTERNAL), [A2]: isolatedButV6(B1, EXTERNAL) }), 'huge policy');
    checkMemory(c, 'with the 400 KB policy');

    // A small change to another policy still applies...
    await c.setPolicies(policy, np('beta', 'deny', { podSelector: {} }));
    await c.expect(ingress({ [A1]: isolatedButV6(B1, EXTERNAL), [A2]: isolatedButV6(B1, EXTERNAL), [B1]: none, [B2]: none }), 'beta denies all too');
    // ...and so does an edit of the huge one: b1 is no longer excepted.
    await c.setPolicies(
      huge(
        '::/0',
        except.filter((e) => e !== B1_V6),
      ),
      np('beta', 'deny', { podSelector: {} }),
    );
    await c.expect(ingress({ [A1]: isolatedButV6(EXTERNAL), [A2]: isolatedButV6(EXTERNAL), [B1]: none, [B2]: none }), 'b1 no longer excepted');
  });

  test('a 1 MB policy within the limits is enforced, and the agents stay within their memory budget', async () => {
    await c.reset();
    const policy = huge('::/0', excepts(v6Hosts(), [EXTERNAL_V6, B1_V6], Infinity, MB));
    const size = JSON.stringify(policy).length;
    console.log(`policy: ${(policy as { spec: { ingress: { from: { ipBlock: { except: string[] } }[] }[] } }).spec.ingress[0].from[0].ipBlock.except.length} excepts, ${(size / 1024).toFixed(0)} KB`);
    if (size < MB * 0.95) throw new Error(`the policy is only ${size} bytes`);
    await c.setPolicies(policy);
    await c.expect(ingress({ [A1]: isolatedButV6(B1, EXTERNAL), [A2]: isolatedButV6(B1, EXTERNAL) }), '1 MB policy');
    checkMemory(c, 'with the 1 MB policy');
    await c.setPolicies(policy, np('alpha', 'web-80', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 80 }] }] }));
    await c.expect(ingress({ [A1]: (x) => isolatedButV6(B1, EXTERNAL)(x) || tcp(80)(x), [A2]: isolatedButV6(B1, EXTERNAL) }), 'plus a small policy');
  });

  test('a 1 MB policy over the limits is rejected with its reason and fails closed; later changes apply', async () => {
    await c.reset();
    const over = huge('0.0.0.0/0', excepts(v4Hosts(), [], Infinity, MB));
    await c.setPolicies(over);
    // Invalid: it allows nothing, and alpha's pods stay isolated for ingress in both families.
    await c.expect(ingress({ [A1]: none, [A2]: none }), 'rejected policy');
    checkMemory(c, 'with the rejected 1 MB policy');
    const render = spawnSync(process.execPath, [MAIN, 'render', '--node-name', 'node-a', '--manifests', c.dir], { encoding: 'utf8', maxBuffer: 64 * MB });
    if (!/alpha\/huge is invalid[\s\S]*spec\.ingress\[0\]\.from\[0\]\.ipBlock\.except\[\d+\]: the policy's ipBlocks hold more than \d+ prefixes/.test(render.stdout)) {
      throw new Error(`weir render does not give the reason:\n${render.stdout.slice(-2000)}\n${render.stderr.slice(-2000)}`);
    }
    await c.setPolicies(over, np('alpha', 'web-80', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 80 }] }] }));
    await c.expect(ingress({ [A1]: tcp(80), [A2]: none }), 'plus a small valid policy');
    await c.setPolicies(np('alpha', 'web-80', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 80 }] }] }));
    await c.expect(ingress({ [A1]: tcp(80) }), 'the large one deleted');
  });
});
