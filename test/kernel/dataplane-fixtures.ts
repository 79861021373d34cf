// Shared by the dataplane's kernel tests: fresh network namespaces (never the root one), the
// iptables backends installed, the desired dataplane used throughout, and the kernel read back
// with iptables-save and ipset save.

import { after } from 'node:test';
import { execa } from 'execa';
import type { DesiredDataplane, Rule } from '../../src/calc/desired.ts';
import { makeNames } from '../../src/calc/names.ts';
import { silentLogger } from '../../src/log.ts';
import { createNs, deleteAllNs, deleteNs, uniquePrefix } from '../../src/sim/netns.ts';
import { createDataplane, type Dataplane } from '../../src/dataplane/dataplane.ts';
import type { Backend } from '../../src/dataplane/iptables.ts';
import { processRunner, netnsRunner, runOk, type CommandRunner } from '../../src/exec/runner.ts';
import { desired, set } from '../unit/dataplane/fixtures.ts';

const nsPrefix = uniquePrefix('wd');
after(() => deleteAllNs(nsPrefix));

const have = async (bin: string) => (await execa('sh', ['-c', `command -v ${bin}`], { reject: false })).exitCode === 0;
export const isRoot = process.getuid?.() === 0;
export const backends: Backend[] = [];
for (const b of ['nft', 'legacy'] as const) {
  if (isRoot && (await have(`iptables-${b}-restore`)) && (await have(`ip6tables-${b}-restore`)) && (await have('ipset'))) backends.push(b);
}

let seq = 0;
/** Runs fn in a fresh namespace and deletes it afterwards, whatever happens. */
export async function inFreshNs(fn: (runner: CommandRunner) => Promise<void>): Promise<void> {
  const ns = `${nsPrefix}${seq++}`;
  await createNs(ns);
  try {
    await fn(netnsRunner(ns, processRunner()));
  } finally {
    await deleteNs(ns);
  }
}

// ---- The desired dataplane used throughout -------------------------------------------------

export const names = makeNames('cali');
export const web4 = names.peerSet(4, 'ns:web');
export const web6 = names.peerSet(6, 'ns:web');
export const http4 = names.peerSet(4, 'np:http');
export const pol = names.policyIngress('default/allow-web');
export const tw = names.toWorkload('default/web-1');
export const ACCEPT_MARK = 0x10000;

export const workloadChain: Rule[] = [
  { matches: [{ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }], action: { kind: 'accept' } },
  { matches: [{ kind: 'ctstate', states: ['INVALID'] }], action: { kind: 'drop' } },
  { matches: [], action: { kind: 'setMark', value: 0, mask: 0x30000 } },
  { matches: [], action: { kind: 'jump', chain: pol } },
  { matches: [{ kind: 'mark', value: ACCEPT_MARK, mask: ACCEPT_MARK }], action: { kind: 'return' } },
  { matches: [], action: { kind: 'drop' }, comment: 'no policy allowed it' },
];
export const policyChain = (peer: string, extra: Rule[] = []): Rule[] => [
  {
    matches: [
      { kind: 'set', set: peer, dir: 'src' },
      {
        kind: 'proto',
        protocol: 'TCP',
        dports: [
          { from: 80, to: 80 },
          { from: 8000, to: 8100 },
        ],
      },
    ],
    action: { kind: 'setMark', value: ACCEPT_MARK, mask: ACCEPT_MARK },
    comment: 'policy default/allow-web ingress rule 0',
  },
  ...extra,
];
export const namedPort: Rule = { matches: [{ kind: 'set', set: http4, dir: 'dst,dst' }], action: { kind: 'setMark', value: ACCEPT_MARK, mask: ACCEPT_MARK } };

export function base(policy4: Rule[] = policyChain(web4, [namedPort])): DesiredDataplane {
  return desired({
    sets: [set(web4, 4, ['10.244.1.0/24', '10.244.2.7']), set(web6, 6, ['fd00:244::/64']), set(http4, 4, ['10.244.1.5,tcp:8080'], 'hash:ip,port')],
    chains4: {
      [names.forward]: [{ matches: [], action: { kind: 'jump', chain: names.toWorkloadDispatch } }],
      [names.toWorkloadDispatch]: [{ matches: [{ kind: 'addr', dir: 'dst', cidr: '10.244.1.5/32' }], action: { kind: 'goto', chain: tw } }],
      [tw]: workloadChain,
      [pol]: policy4,
    },
    chains6: {
      [names.forward]: [{ matches: [], action: { kind: 'jump', chain: names.toWorkloadDispatch } }],
      [names.toWorkloadDispatch]: [{ matches: [{ kind: 'addr', dir: 'dst', cidr: 'fd00:244::5/128' }], action: { kind: 'goto', chain: tw } }],
      [tw]: workloadChain,
      [pol]: policyChain(web6),
    },
    top: names.forward,
  });
}

// ---- Reading the kernel back ----------------------------------------------------------------

export const ipt = (b: Backend, family: 4 | 6) => `${family === 4 ? 'iptables' : 'ip6tables'}-${b}`;

/** One table as iptables-save prints it, without comments and counters. */
export async function tableLines(runner: CommandRunner, b: Backend, family: 4 | 6, table: 'mangle' | 'filter' = 'mangle'): Promise<string[]> {
  const out = await runOk(runner, `${ipt(b, family)}-save`, ['-t', table]);
  return out
    .split('\n')
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ' [0:0]'));
}

/** Own lines only, with rule hashes replaced, so expected text can be written by hand. */
export const own = (lines: string[]) => lines.filter((l) => l.includes('cali')).map((l) => l.replace(/weir:[A-Za-z0-9_-]{16}/g, 'weir:HASH'));

/** `ipset save` without the per-boot header fields; members sorted within each set. */
export async function ipsetLines(runner: CommandRunner): Promise<string[]> {
  const out = await runOk(runner, 'ipset', ['save']);
  return out
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.replace(/ (hashsize|bucketsize|initval) \S+/g, ''))
    .sort();
}

interface Snapshot {
  readonly v4: string[];
  readonly v6: string[];
  readonly sets: string[];
}
/** Per family: mangle (Weir's chains), then filter. */
export const bothTables = async (runner: CommandRunner, b: Backend, family: 4 | 6) => [...(await tableLines(runner, b, family, 'mangle')), ...(await tableLines(runner, b, family, 'filter'))];
export const snapshot = async (runner: CommandRunner, b: Backend): Promise<Snapshot> => ({
  v4: await bothTables(runner, b, 4),
  v6: await bothTables(runner, b, 6),
  sets: await ipsetLines(runner),
});

/** In iptables-save order: declarations, then rules chain by chain (chains sorted by name). */
export const EXPECTED_V4 = [
  `:${names.forward} - [0:0]`,
  `:${pol} - [0:0]`,
  `:${names.toWorkloadDispatch} - [0:0]`,
  `:${tw} - [0:0]`,
  `-A FORWARD -m comment --comment "weir:hook" -j ${names.forward}`,
  `-A ${names.forward} -m comment --comment "weir:HASH" -j ${names.toWorkloadDispatch}`,
  `-A ${pol} -p tcp -m comment --comment "weir:HASH policy default/allow-web ingress rule 0" -m set --match-set ${web4} src -m multiport --dports 80,8000:8100 -j MARK --set-xmark 0x10000/0x10000`,
  `-A ${pol} -m comment --comment "weir:HASH" -m set --match-set ${http4} dst,dst -j MARK --set-xmark 0x10000/0x10000`,
  `-A ${names.toWorkloadDispatch} -d 10.244.1.5/32 -m comment --comment "weir:HASH" -g ${tw}`,
  `-A ${tw} -m comment --comment "weir:HASH" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
  `-A ${tw} -m comment --comment "weir:HASH" -m conntrack --ctstate INVALID -j DROP`,
  `-A ${tw} -m comment --comment "weir:HASH" -j MARK --set-xmark 0x0/0x30000`,
  `-A ${tw} -m comment --comment "weir:HASH" -j ${pol}`,
  `-A ${tw} -m comment --comment "weir:HASH" -m mark --mark 0x10000/0x10000 -j RETURN`,
  `-A ${tw} -m comment --comment "weir:HASH no policy allowed it" -j DROP`,
];
/** The same layout for IPv6: its own peer set and address, and no named-port rule. */
export const EXPECTED_V6 = EXPECTED_V4.filter((l) => !l.includes(http4)).map((l) => l.replace(web4, web6).replace('10.244.1.5/32', 'fd00:244::5/128'));
export const EXPECTED_SETS = [
  `add ${http4} 10.244.1.5,tcp:8080`,
  `add ${web4} 10.244.1.0/24`,
  `add ${web4} 10.244.2.7`,
  `add ${web6} fd00:244::/64`,
  `create ${http4} hash:ip,port family inet maxelem 1048576 comment`,
  `create ${web4} hash:net family inet maxelem 1048576 comment`,
  `create ${web6} hash:net family inet6 maxelem 1048576 comment`,
].sort();

export const newDataplane = (runner: CommandRunner, backend: Backend): Dataplane =>
  createDataplane({ runner, names, families: [4, 6], backend, log: silentLogger(), lockRetry: { attempts: 2, delayMs: 10 } });

/** Why the backend cases are skipped, or false. */
export const skip = backends.length === 0 ? 'needs root, ipset and iptables-{nft,legacy}-restore' : false;

/** The backends to test: those installed, or nft for a skipped run that still lists the cases. */
export const testedBackends: readonly Backend[] = backends.length > 0 ? backends : ['nft'];

/** iptables for one backend: `run` in filter (any table with -t), `mangle` where Weir's chains and hooks live. */
export function iptablesOf(backend: Backend) {
  // --wait: the legacy xtables lock is shared with every other process on the host.
  const run = (runner: CommandRunner, family: 4 | 6, args: string[]) => runOk(runner, ipt(backend, family), ['--wait', ...args]);
  const mangle = (runner: CommandRunner, family: 4 | 6, args: string[]) => run(runner, family, ['-t', 'mangle', ...args]);
  return { run, mangle };
}
