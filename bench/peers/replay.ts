// The connect rows measure an enforcer's rules and its running agent together, on a machine
// whose load moves between turns. This step takes the rules apart from the agents: each
// enforcer's IPv4 rules and ipsets, as it left them on both nodes, are loaded in turn into one
// fresh cluster where no agent runs, interleaved round by round with two baselines, and the
// same new-connections/s runs are taken. The baselines are no rule at all (conntrack off: a
// namespace only tracks connections once a rule asks for it) and one rule that turns
// conntrack on, as kube-proxy does on every real node; every stateful enforcer pays that.

import type { ChildProcess } from 'node:child_process';
import { spawnSync } from 'node:child_process';
import { makeNames } from '../../src/calc/names.ts';
import { createCluster } from '../../src/sim/cluster.ts';
import { registerExitCleanup } from '../../src/sim/cleanup.ts';
import { connectLatency, connectRate } from './connect-loop.ts';
import { SIM_NODES, startHelper, type BenchEnv, type Turn } from './env.ts';
import { percentile } from '../stats.ts';
import type { Value } from './table.ts';

/** What an enforcer left in one node's namespace: its IPv4 tables and every ipset. */
export interface NodeRules {
  readonly iptables: string;
  readonly ipsets: string;
}
export type Capture = Record<string, NodeRules>;

/** iptables-save prints every builtin chain of a table, whether or not the kernel holds it
 *  (nft registers one only when a rule lands in it), and restoring those lines would register
 *  them all: each is one more hook every forwarded packet passes. Rules create what they use. */
const BUILTIN = /^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) /;

export function captureRules(t: Turn): Capture {
  const out: Capture = {};
  for (const n of SIM_NODES) {
    const iptables = t
      .inNode(n.name, 'iptables-save', [])
      .split('\n')
      .filter((l) => !BUILTIN.test(l))
      .join('\n');
    out[n.name] = { iptables, ipsets: t.inNode(n.name, 'ipset', ['save']) };
  }
  return out;
}

/**
 * Weir's rules with one rule put first in its top chain: every reply (ESTABLISHED, RELATED)
 * accepted at once, as kube-router's first rule for a pod does, before the checks Weir makes on
 * every packet (the source is a known pod on its own bridge port, the destination a known pod).
 * Not a mode of Weir: it shows what those checks cost per connection.
 */
export function repliesFirst(capture: Capture): Capture {
  const names = makeNames();
  const rule = `-I ${names.forward} 1 -m conntrack --ctstate RELATED,ESTABLISHED -g ${names.accept}`;
  return Object.fromEntries(Object.entries(capture).map(([node, r]) => [node, { ...r, iptables: r.iptables.replace(/^(\*mangle\n[\s\S]*?)^COMMIT$/m, `$1${rule}\nCOMMIT`) }]));
}

/** One rule that makes the namespace track connections and changes no verdict. */
const CONNTRACK_ONLY: NodeRules = { iptables: '*filter\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n', ipsets: '' };

export interface ReplayResult {
  /** Per configuration, per path ("same", "cross"): the rate of each round. */
  readonly rates: Record<string, Record<'same' | 'cross', number[]>>;
}

export interface ReplayTarget {
  readonly server: { key: string; ip: string };
  readonly clients: Record<'same' | 'cross', string>;
  /** A pod every replayed enforcer's rules deny: its connect must fail, or the rules are not in force. */
  readonly denied: string;
  readonly port: number;
}

function sh(netns: string, cmd: string, args: readonly string[], input?: string): void {
  const r = spawnSync('ip', ['netns', 'exec', netns, cmd, ...args], { input, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} in ${netns} exited ${r.status}: ${r.stderr.trim()}`);
}

/**
 * `rounds` rounds; in each, every configuration (the captures, "conntrack only" and "no rules")
 * is loaded on both nodes, conntrack is flushed, and one rate run is taken per path. The order
 * alternates between rounds, as the turns' does.
 */
export async function replayRates(
  env: BenchEnv,
  bin: string,
  captures: Record<string, Capture>,
  target: ReplayTarget,
  opts: { rounds: number; inflight: number; rateMs: number },
): Promise<ReplayResult> {
  // `nft flush ruleset` below is how a configuration goes; legacy tables would stay.
  const version = spawnSync('iptables', ['-V'], { encoding: 'utf8' }).stdout ?? '';
  if (!version.includes('nf_tables')) throw new Error(`the replay needs iptables on the nf_tables backend; this machine has ${version.trim()}`);
  // The baselines give no verdict; every capture must deny `target.denied`.
  const baselines: [string, Capture | undefined][] = [
    ['no rules', undefined],
    ['conntrack only', Object.fromEntries(SIM_NODES.map((n) => [n.name, CONNTRACK_ONLY]))],
  ];
  const configs = [...baselines, ...Object.entries(captures)];
  const cluster = await createCluster({
    tag: 'wreplay',
    nodes: SIM_NODES.map((n) => ({ name: n.name, podCIDRs: [...n.podCIDRs] })),
    pods: [...env.simPods.values()].map((p) => ({ namespace: p.namespace, name: p.name, node: p.node, ips: p.ips })),
    external: false,
  });
  let server: ChildProcess | undefined;
  const unregister = registerExitCleanup(() => server?.kill('SIGKILL'));
  try {
    const netns = (key: string) => cluster.endpoint(key)!.netns;
    server = await startHelper(netns(target.server.key), [bin, 'serve', String(target.port), target.server.key], (c) => (server = c));
    const rates: ReplayResult['rates'] = {};
    for (let round = 0; round < opts.rounds; round++) {
      const order = round % 2 === 0 ? configs : [...configs].reverse();
      for (const [name, capture] of order) {
        for (const node of cluster.nodes) {
          // Emptied chains would stay registered as hooks: the tables go, base chains and all.
          sh(node.netns, 'nft', ['flush', 'ruleset']);
          sh(node.netns, 'ipset', ['destroy']);
          sh(node.netns, 'conntrack', ['-F']);
          const rules = capture?.[node.name];
          if (!rules) continue;
          if (rules.ipsets) sh(node.netns, 'ipset', ['restore'], rules.ipsets);
          sh(node.netns, 'iptables-restore', ['--noflush'], rules.iptables);
        }
        if (name in captures) {
          const probe = await connectLatency(bin, netns(target.denied), target.server.ip, target.port, 1, 300);
          if (probe.failures !== 1) throw new Error(`replay of ${name}: ${target.denied} reached the server, so the replayed rules are not in force`);
        }
        for (const path of ['same', 'cross'] as const) {
          const r = await connectRate(bin, netns(target.clients[path]), target.server.ip, target.port, opts.inflight, opts.rateMs);
          if (r.fail) throw new Error(`replay of ${name}, ${path} node: ${r.fail} connects failed (the rules must allow the client)`);
          ((rates[name] ??= { same: [], cross: [] })[path] ??= []).push(r.perSecond);
        }
      }
    }
    return { rates };
  } finally {
    server?.kill('SIGKILL');
    unregister();
    await cluster.destroy();
  }
}

/** A configuration's rates on one path as a table value: the median round. */
export const medianRate = (xs: readonly number[]): Value => ({ p50: percentile(xs, 50), n: xs.length });
