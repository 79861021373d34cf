// Hand-built desired dataplanes for dataplane tests (unit and kernel), and a fake kernel for
// the unit tests of the dataplane's jobs.

import { emptyDirty, type DesiredDataplane, type DesiredSet, type Dirty, type Rule, type SetType } from '../../../src/calc/desired.ts';
import { makeNames } from '../../../src/calc/names.ts';
import { createDataplane, type ApplyStep } from '../../../src/dataplane/dataplane.ts';
import { renderChain } from '../../../src/dataplane/render.ts';
import { recordingRunner, type CommandRunner, type RecordedCall, type RunResult } from '../../../src/exec/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import type { Family } from '../../../src/model/types.ts';

export function set(name: string, family: Family, members: string[], type: SetType = 'hash:net'): DesiredSet {
  return { name, family, type, members: new Set(members) };
}

export function desired(spec: {
  readonly sets?: readonly DesiredSet[];
  readonly chains4?: Readonly<Record<string, readonly Rule[]>>;
  readonly chains6?: Readonly<Record<string, readonly Rule[]>>;
  readonly top?: string;
}): DesiredDataplane {
  return {
    sets: new Map((spec.sets ?? []).map((s) => [s.name, s])),
    chains: { 4: new Map(Object.entries(spec.chains4 ?? {})), 6: new Map(Object.entries(spec.chains6 ?? {})) },
    topChain: spec.top ?? 'cali-FORWARD',
  };
}

export const accept: Rule = { matches: [], action: { kind: 'accept' } };
export const jump = (chain: string, comment?: string): Rule => ({ matches: [], action: { kind: 'jump', chain }, comment });
export const fromSet = (setName: string, comment?: string): Rule => ({
  matches: [{ kind: 'set', set: setName, dir: 'src' }],
  action: { kind: 'accept' },
  comment,
});

// ---- A fake kernel for unit tests of the dataplane's jobs ------------------------------------

export const names = makeNames('cali');
export const OK: RunResult = { stdout: '', stderr: '', exitCode: 0 };

/** The part of save text `iptables-save -t <table>` prints: that table's section. */
export const tableOf = (text: string, args: readonly string[]) => {
  const table = args[args.indexOf('-t') + 1];
  return text
    .split(/^(?=\*)/m)
    .filter((section) => section.startsWith(`*${table}\n`))
    .join('');
};

/** What `iptables -t <table> -S <chain>` prints of save text: the policy line and that chain's rules. */
export const chainOf = (text: string, args: readonly string[]) => {
  const chain = args[args.indexOf('-S') + 1];
  const rules = tableOf(text, args)
    .split('\n')
    .filter((l) => l.startsWith(`-A ${chain} `));
  return [`-P ${chain} ACCEPT`, ...rules, ''].join('\n');
};

/** Answers save and list commands (per table) with fixed kernel text and lets a test fail chosen calls. */
export function fakeKernel(kernel: { save4?: string; save6?: string; ipset?: string } = {}, fail?: (c: RecordedCall) => RunResult | undefined) {
  return recordingRunner((c) => {
    const f = fail?.(c);
    if (f) return f;
    if (c.cmd === 'iptables-nft-save') return { ...OK, stdout: tableOf(kernel.save4 ?? '', c.args) };
    if (c.cmd === 'ip6tables-nft-save') return { ...OK, stdout: tableOf(kernel.save6 ?? '', c.args) };
    if (c.cmd === 'iptables-nft') return { ...OK, stdout: chainOf(kernel.save4 ?? '', c.args) };
    if (c.cmd === 'ip6tables-nft') return { ...OK, stdout: chainOf(kernel.save6 ?? '', c.args) };
    if (c.cmd === 'ipset' && c.args[0] === 'save') return { ...OK, stdout: kernel.ipset ?? '' };
    return OK;
  });
}

/** A dataplane for both families on nft over `runner`. */
export const make = (runner: CommandRunner, extra: { step?: (s: ApplyStep, sec: number, ok: boolean) => void } = {}) =>
  createDataplane({ runner, names, families: [4, 6], backend: 'nft', log: silentLogger(), onMetric: { step: extra.step } });

/** A call as the tests name it: the tool, and for ipset its subcommand. */
export const what = (c: RecordedCall) => (c.cmd === 'ipset' ? `ipset ${c.args[0]}` : c.cmd);

/** What a kernel read runs for families 4 and 6 on nft: each family's two tables, then the sets. */
export const READ_KERNEL = ['iptables-nft-save', 'ip6tables-nft-save', 'iptables-nft-save', 'ip6tables-nft-save', 'ipset save'];
/** What writing `base` in full to an empty kernel runs after that read. */
export const WRITE_BASE = ['ipset restore', 'iptables-nft-restore', 'ip6tables-nft-restore'];

/** One set and two chains per family. */
export const base = desired({
  sets: [set('cali40s:a', 4, ['10.0.0.1']), set('cali60s:a', 6, ['fd00::1'])],
  chains4: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali40s:a')] },
  chains6: { 'cali-FORWARD': [jump('cali-x')], 'cali-x': [fromSet('cali60s:a')] },
});

export const dirtyOf = (o: { sets?: [string, string[] | 'all'][]; c4?: string[]; c6?: string[] }): Dirty => {
  const d = emptyDirty();
  for (const [n, m] of o.sets ?? []) d.sets.set(n, m === 'all' ? 'all' : new Set(m));
  for (const c of o.c4 ?? []) d.chains[4].add(c);
  for (const c of o.c6 ?? []) d.chains[6].add(c);
  return d;
};

/** An IPv4 kernel a Weir wrote: an own chain no longer desired, its hook, the accept hook, and
 *  others' objects beside them (flannel's and kube-proxy's). */
export const KERNEL4 = `*mangle
:PREROUTING ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:cali-FORWARD - [0:0]
:cali-stale - [0:0]
-A FORWARD -m comment --comment "flannel" -s 10.244.0.0/16 -j ACCEPT
-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD
-A cali-FORWARD -m comment --comment "weir:0123456789abcdef" -j cali-stale
-A cali-stale -m comment --comment "weir:fedcba9876543210" -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A FORWARD -m mark --mark 0x10000/0x10000 -m comment --comment weir:hook -j ACCEPT
-A KUBE-FORWARD -j ACCEPT
COMMIT
`;
export const ACCEPT_HOOK = '-m mark --mark 0x10000/0x10000 -m comment --comment weir:hook -j ACCEPT';
/** The sets beside KERNEL4: an own set no longer desired, kube-proxy's, and cali40s:a with a member too many. */
export const IPSET = `create cali40s:stale hash:net family inet hashsize 1024 maxelem 1048576 comment
add cali40s:stale 10.9.9.9
create KUBE-LOOP hash:ip family inet hashsize 1024 maxelem 65536
create cali40s:a hash:net family inet hashsize 1024 maxelem 1048576 comment
add cali40s:a 10.0.0.1
add cali40s:a 10.6.6.6
`;

// Felix names its chains and sets exactly like Weir's default prefix does: only the mark (rule
// comments "weir:", sets created with the comment extension) tells them apart.
export const FELIX4 = `*filter
:FORWARD ACCEPT [0:0]
:cali-FORWARD - [0:0]
:cali-tw-cali12345 - [0:0]
:cali-empty - [0:0]
-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
-A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j cali-tw-cali12345
-A cali-tw-cali12345 -m comment --comment "cali:abcdabcdabcdabcd" -j ACCEPT
COMMIT
`;
export const FELIX_SETS = `create cali40s:felix hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x1
add cali40s:felix 10.1.1.1
`;

// ---- IPVS: kube-proxy's IPVS mode forwards Service traffic INPUT -> OUTPUT, never FORWARD ----

export const OUTPUT_HOOK = '-m ipvs --ipvs --vdir ORIGINAL -m addrtype ! --src-type LOCAL -m comment --comment "weir:hook" -j cali-FORWARD';

/** What iptables-save prints once `base` (IPv4) is written, with the hooks given. */
export function savedBase(hooks: { forward?: boolean; output?: 'first' | 'second' | 'none' }): string {
  const rules = [...base.chains[4]].flatMap(([name, r]) => renderChain(name, r).lines);
  const output = ['-A OUTPUT -j KUBE-FIREWALL'];
  if (hooks.output === 'first') output.unshift(`-A OUTPUT ${OUTPUT_HOOK}`);
  if (hooks.output === 'second') output.push(`-A OUTPUT ${OUTPUT_HOOK}`);
  return [
    '*mangle',
    ':INPUT ACCEPT [0:0]',
    ':FORWARD ACCEPT [0:0]',
    ':OUTPUT ACCEPT [0:0]',
    ':KUBE-FIREWALL - [0:0]',
    ':cali-FORWARD - [0:0]',
    ':cali-x - [0:0]',
    ...(hooks.forward === false ? [] : ['-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD']),
    ...output,
    ...rules,
    'COMMIT',
    '',
  ].join('\n');
}

/** A kernel for IPv4 whose save text and kube-ipvs0 presence the test sets as it goes. */
export function ipvsKernel(k: { save4: string; ipvs0: boolean }) {
  return recordingRunner((c) => {
    if (c.cmd === 'iptables-nft-save') return { ...OK, stdout: tableOf(k.save4, c.args) };
    if (c.cmd === 'iptables-nft') return { ...OK, stdout: chainOf(k.save4, c.args) };
    if (c.cmd === 'ip' && c.args.join(' ') === '-o link show dev kube-ipvs0') {
      return k.ipvs0 ? { ...OK, stdout: '9: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN\n' } : { ...OK, exitCode: 1, stderr: 'Device "kube-ipvs0" does not exist.\n' };
    }
    return OK;
  });
}

// ---- Upgrade: an older Weir policed from the filter table -----------------------------------

export const OLD4 = `*mangle
:PREROUTING ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:cali-FORWARD - [0:0]
:cali-x - [0:0]
:cali-flushed - [0:0]
-A FORWARD -m comment --comment "weir:hook" -j cali-FORWARD
-A FORWARD -j KUBE-FORWARD
-A OUTPUT -m comment --comment "weir:hook" -j cali-FORWARD
-A KUBE-FORWARD -j ACCEPT
-A cali-FORWARD -m comment --comment "weir:0123456789abcdef" -j cali-x
-A cali-FORWARD -m comment --comment "weir:0123456789abcdee" -j cali-flushed
-A cali-x -m comment --comment "weir:fedcba9876543210" -j ACCEPT
COMMIT
`;
/** ACCEPT mode's desired chains: the top chain and the accept chain, as calc builds them. */
export const withAccept = desired({
  chains4: {
    'cali-FORWARD': [jump('cali-x'), { matches: [{ kind: 'mark', value: 0x10000, mask: 0x10000 }], action: { kind: 'accept' } }],
    'cali-x': [{ matches: [], action: { kind: 'goto', chain: 'cali-accept' } }],
    'cali-accept': [{ matches: [], action: { kind: 'setMark', value: 0x10000, mask: 0x10000 } }, accept],
  },
});

/** A fake kernel whose next command matching `cmd` waits until `release()`; `isHeld` resolves once it waits. */
export function holdingKernel(cmd: (c: RecordedCall) => boolean) {
  const inner = fakeKernel();
  let hold: { held: () => void; release: Promise<void> } | undefined;
  const runner = {
    ...inner,
    async run(c: string, args: readonly string[], opts?: { input?: string }) {
      const h = hold;
      if (h !== undefined && cmd({ cmd: c, args: [...args], input: opts?.input })) {
        hold = undefined;
        h.held();
        await h.release;
      }
      return inner.run(c, args, opts);
    },
  };
  const holdNext = () => {
    let release = () => {};
    let held = () => {};
    const isHeld = new Promise<void>((r) => (held = r));
    hold = { held, release: new Promise<void>((r) => (release = r)) };
    return { isHeld, release: () => release() };
  };
  return { runner, calls: inner.calls, holdNext };
}
