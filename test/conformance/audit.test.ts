// The audit log with real packets: each node's agent writes the lines of the connections its
// audit rules saw, and the lines are exactly the ones the truth table implies, named by pod,
// policy and rule. Audit-only policies leave traffic open and log what they would drop.

import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { familyOf } from '../../src/model/types.ts';
import { expectMatrix, type Cell } from '../../src/sim/prober.ts';
import { A1, A2, B1, B2, Conformance, EXTERNAL, G1, NODES, basePods, cnp, nsOf } from './harness.ts';
import { and, from, ingress, egress, not, or, self, tcp, udp } from './predicates.ts';

interface Line {
  time: string;
  node: string;
  verdict: string;
  direction: string;
  policy: { namespace: string; name: string; rule: number } | { kind: 'ClusterNetworkPolicy'; name: string; tier: string; rule: number } | null;
  reason?: string;
  isolatedBy?: { namespace: string; name: string }[];
  src: { ip: string; port: number; namespace: string; pod: string };
  dst: { ip: string; port: number; namespace: string; pod: string };
  protocol: string;
  count: number;
}

const nodeOf = (key: string) => basePods().find((p) => `${p.namespace}/${p.name}` === key)?.node ?? '';
const podOf = (key: string) => (key === EXTERNAL ? '' : key.split('/')[1]);

describe('audit log', () => {
  let c: Conformance;
  let dir: string;
  /** Lines of each node's file already taken by earlier steps. */
  const seen = new Map<string, number>();
  const logOf = (node: string) => join(dir, `${node}.log`);

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weir-audit-'));
    c = await Conformance.start('waud', (node) => ['--audit', 'on', '--audit-log-file', logOf(node), '--audit-rate', '10000']);
  });
  after(async () => {
    await c?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  async function readLines(node: string): Promise<Line[]> {
    const text = await readFile(logOf(node), 'utf8').catch(() => '');
    return text
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as Line);
  }

  /** The lines written since the last call, once no new one has come for 1.5 s (the
   *  deduplication window is 1 s). */
  async function newLines(): Promise<Line[]> {
    let last = -1;
    let stableSince = Date.now();
    for (;;) {
      const all = await Promise.all(NODES.map((n) => readLines(n.name)));
      const total = all.reduce((s, l) => s + l.length, 0);
      if (total !== last) {
        last = total;
        stableSince = Date.now();
      } else if (Date.now() - stableSince > 1_500) {
        const out = NODES.flatMap((n, i) => all[i].slice(seen.get(n.name) ?? 0));
        for (const [i, n] of NODES.entries()) seen.set(n.name, all[i].length);
        return out;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** What identifies a line: everything but time, source port and count. */
  const keyOf = (l: Pick<Line, 'node' | 'verdict' | 'direction' | 'policy' | 'src' | 'dst' | 'protocol'> & { isolatedBy?: Line['isolatedBy'] }) =>
    JSON.stringify([
      l.node,
      l.verdict,
      l.direction,
      l.policy
        ? 'kind' in l.policy
          ? `${l.policy.kind} ${l.policy.tier} ${l.policy.name}#${l.policy.rule}`
          : `${l.policy.namespace}/${l.policy.name}#${l.policy.rule}`
        : `default-deny by ${(l.isolatedBy ?? []).map((p) => `${p.namespace}/${p.name}`).join(',')}`,
      l.src.ip,
      l.src.namespace,
      l.src.pod,
      l.dst.ip,
      l.dst.namespace,
      l.dst.pod,
      l.dst.port,
      l.protocol,
    ]);

  /** The line a cell must produce, or null. */
  type Expect = (x: Cell) => { node: string; verdict: string; direction: string; policy: Line['policy']; isolatedBy?: Line['isolatedBy'] } | null;

  function expectedKeys(expect: Expect): string[] {
    const m = expectMatrix(c.cluster, {}, () => true);
    const keys = new Set<string>();
    for (const cellKey of m.cells.keys()) {
      const [source, target, family, proto, port] = cellKey.split('|');
      const cell: Cell = { source, target, family: Number(family) as 4 | 6, proto: proto as Cell['proto'], port: Number(port) };
      const e = expect(cell);
      if (!e) continue;
      const ipOf = (key: string) => c.cluster.endpoint(key)!.ips.find((ip) => familyOf(ip) === cell.family)!;
      keys.add(
        keyOf({
          ...e,
          src: { ip: ipOf(source), port: 0, namespace: nsOf(source), pod: podOf(source) },
          dst: { ip: ipOf(target), port: cell.port, namespace: nsOf(target), pod: podOf(target) },
          protocol: proto.toUpperCase(),
        }),
      );
    }
    return [...keys].sort();
  }

  function assertWellFormed(lines: Line[]): void {
    for (const l of lines) {
      assert.match(l.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, JSON.stringify(l));
      assert.ok(Number.isInteger(l.src.port) && l.src.port > 0, `source port of ${JSON.stringify(l)}`);
      assert.ok(Number.isInteger(l.count) && l.count >= 1, `count of ${JSON.stringify(l)}`);
      if (l.policy === null) assert.equal(l.reason, 'default-deny');
    }
  }

  function assertLines(lines: Line[], expect: Expect, what: string): void {
    assertWellFormed(lines);
    const got = [...new Set(lines.map(keyOf))].sort();
    const want = expectedKeys(expect);
    const missing = want.filter((k) => !got.includes(k));
    const extra = got.filter((k) => !want.includes(k));
    assert.deepEqual({ missing, extra }, { missing: [], extra: [] }, `${what}: ${lines.length} lines`);
  }

  test('namespace level all: every connection to an isolated pod is logged on its node, allowed ones with policy and rule', async () => {
    c.namespaceAnnotations = { alpha: { 'weir.dev/audit': 'all' } };
    await c.setPolicies({
      metadata: { namespace: 'alpha', name: 'web-in' },
      spec: {
        podSelector: { matchLabels: { app: 'web' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ protocol: 'TCP', port: 80 }] }, { from: [{ podSelector: { matchLabels: { app: 'db' } } }] }],
      },
    });
    await newLines();
    const rule0 = and(from(B1, B2), tcp(80));
    await c.expect(ingress({ [A1]: or(rule0, from(A2)) }), 'alpha/web-in');
    const policy = (rule: number) => ({ namespace: 'alpha', name: 'web-in', rule });
    assertLines(
      await newLines(),
      (x) => {
        if (x.target !== A1 || self(x)) return null;
        const base = { node: 'node-a', direction: 'ingress' };
        if (rule0(x)) return { ...base, verdict: 'allow', policy: policy(0) };
        if (from(A2)(x)) return { ...base, verdict: 'allow', policy: policy(1) };
        return { ...base, verdict: 'deny', policy: null, isolatedBy: [{ namespace: 'alpha', name: 'web-in' }] };
      },
      'ingress to a1',
    );
  });

  test('policy level deny: the egress drops of an isolated pod are logged, cross-node included, and nothing of the namespaces not audited', async () => {
    c.namespaceAnnotations = {};
    await c.setPolicies({
      metadata: { namespace: 'beta', name: 'b1-out', annotations: { 'weir.dev/audit': 'deny' } },
      spec: {
        podSelector: { matchLabels: { app: 'web' } },
        policyTypes: ['Egress'],
        egress: [{ to: [{ namespaceSelector: { matchLabels: { team: 'a' } }, podSelector: { matchLabels: { app: 'db' } } }], ports: [{ protocol: 'UDP', port: 81 }] }],
      },
    });
    await newLines();
    const allowed = and(from(B1), (x: Cell) => x.target === A2, udp(81));
    await c.expect(egress(B1, allowed), 'beta/b1-out');
    assertLines(
      await newLines(),
      (x) => (x.source === B1 && !self(x) && !allowed(x) ? { node: nodeOf(B1), verdict: 'deny', direction: 'egress', policy: null, isolatedBy: [{ namespace: 'beta', name: 'b1-out' }] } : null),
      'egress from b1',
    );
  });

  test('an audit-only policy leaves traffic open, logs exactly what it would drop, and is enforced once the annotation goes', async () => {
    c.namespaceAnnotations = {};
    const spec = { podSelector: {}, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } } }] }] };
    await c.setPolicies({ metadata: { namespace: 'gamma', name: 'g-in', annotations: { 'weir.dev/enforcement': 'audit' } }, spec });
    await newLines();
    await c.expect(() => true, 'audit-only: nothing isolated');
    const fromAlpha = (x: Cell) => nsOf(x.source) === 'alpha';
    assertLines(
      await newLines(),
      (x) =>
        x.target === G1 && !self(x) && !fromAlpha(x) ? { node: nodeOf(G1), verdict: 'would-deny', direction: 'ingress', policy: null, isolatedBy: [{ namespace: 'gamma', name: 'g-in' }] } : null,
      'would-deny to g1',
    );

    await c.setPolicies({ metadata: { namespace: 'gamma', name: 'g-in' }, spec });
    await c.expect(ingress({ [G1]: fromAlpha }), 'annotation removed: enforced');
    assert.deepEqual(await newLines(), [], 'an enforced policy in a namespace not audited logs nothing');
  });

  test('a ClusterNetworkPolicy at level deny: its Admin Deny is logged naming policy, tier and rule; its Pass never is', async () => {
    c.namespaceAnnotations = {};
    await c.setPolicies(
      cnp(
        'alpha-guard',
        {
          tier: 'Admin',
          priority: 3,
          subject: { namespaces: { matchLabels: { team: 'a' } } },
          ingress: [
            { name: 'gamma-passes', action: 'Pass', from: [{ namespaces: { matchExpressions: [{ key: 'team', operator: 'DoesNotExist' }] } }] },
            { name: 'no-beta', action: 'Deny', from: [{ namespaces: { matchLabels: { team: 'b' } } }] },
          ],
        },
        { 'weir.dev/audit': 'deny' },
      ),
    );
    await newLines();
    const denied = (x: Cell) => (x.target === A1 || x.target === A2) && (x.source === B1 || x.source === B2);
    await c.expect(not(denied), 'beta denied into alpha, gamma passed');
    assertLines(
      await newLines(),
      (x) => (denied(x) ? { node: nodeOf(x.target), verdict: 'deny', direction: 'ingress', policy: { kind: 'ClusterNetworkPolicy', name: 'alpha-guard', tier: 'Admin', rule: 1 } } : null),
      'admin deny into alpha',
    );
  });

  test('no annotation anywhere: policies enforce and no line is written', async () => {
    c.namespaceAnnotations = {};
    await c.setPolicies({ metadata: { namespace: 'alpha', name: 'deny-all' }, spec: { podSelector: {} } });
    await newLines();
    await c.expect(ingress({ [A1]: not(() => true), [A2]: not(() => true) }), 'alpha isolated');
    assert.deepEqual(await newLines(), []);
    assert.deepEqual(c.agentErrors(), []);
  });
});
