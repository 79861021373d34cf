// The only place that writes iptables and ipset syntax. Pure functions: structured rules and
// sets from calc in, restore-payload lines out.

import { createHash } from 'node:crypto';
import type { Action, Match, PortRange, Rule, SetType } from '../calc/desired.ts';
import type { Family } from '../model/types.ts';

/** The multiport match takes at most 15 ports; a range uses two of them. */
export const MULTIPORT_MAX = 15;
/** Length of the per-rule hash kept in the comment. */
export const RULE_HASH_LENGTH = 16;
/** xt_comment keeps 255 characters; leave the human part what the prefix and hash leave over. */
const MAX_COMMENT = 255;

const portText = (p: PortRange) => (p.from === p.to ? `${p.from}` : `${p.from}:${p.to}`);
const portWeight = (p: PortRange) => (p.from === p.to ? 1 : 2);

/** Splits destination ports into groups that each fit one multiport match, in order. */
export function splitPorts(ports: readonly PortRange[]): PortRange[][] {
  const groups: PortRange[][] = [];
  let cur: PortRange[] = [];
  let weight = 0;
  for (const p of ports) {
    if (weight + portWeight(p) > MULTIPORT_MAX) {
      groups.push(cur);
      cur = [];
      weight = 0;
    }
    cur.push(p);
    weight += portWeight(p);
  }
  if (cur.length > 0) groups.push(cur);
  return groups;
}

const hex = (n: number) => `0x${(n >>> 0).toString(16)}`;

/** The alternatives one match renders to: one string, or several when ports need splitting. */
export function renderMatch(m: Match): string[] {
  switch (m.kind) {
    case 'set':
      return [`-m set ${m.negate === true ? '! ' : ''}--match-set ${m.set} ${m.dir}`];
    case 'addr':
      return [`${m.dir === 'src' ? '-s' : '-d'} ${m.cidr}`];
    case 'proto': {
      const p = m.protocol.toLowerCase();
      if (m.dports === undefined) return [`-p ${p}`];
      // An empty list would silently mean "every port"; calc never means that, so refuse.
      if (m.dports.length === 0) throw new RangeError(`proto match for ${p} has an empty port list`);
      return splitPorts(m.dports).map((g) => (g.length === 1 ? `-p ${p} -m ${p} --dport ${portText(g[0])}` : `-p ${p} -m multiport --dports ${g.map(portText).join(',')}`));
    }
    case 'ctstate':
      return [`-m conntrack --ctstate ${m.states.join(',')}`];
    case 'mark':
      return [`-m mark --mark ${hex(m.value)}/${hex(m.mask)}`];
    case 'icmp6':
      return [`-p ipv6-icmp -m icmp6 --icmpv6-type ${m.type}`];
    case 'iface':
      return [`${m.dir === 'in' ? '-i' : '-o'} ${m.name}`];
    case 'bridgePortIn':
      return [`-m physdev --physdev-in ${m.port}`];
    case 'limit': {
      // hashlimit, not limit: rules with one name share one bucket, so the cap is per node.
      const node = hashlimit(m.name, `--hashlimit-upto ${m.perSecond}/sec --hashlimit-burst ${m.burst}`);
      const s = m.perSource;
      if (s === undefined) return [node];
      // After the node bucket, so that only packets it let through can add an address to the table.
      const options = `--hashlimit-upto ${s.perSecond}/sec --hashlimit-burst ${s.burst} --hashlimit-mode srcip --hashlimit-htable-size ${hashBuckets(s.tableMax)} --hashlimit-htable-max ${s.tableMax} --hashlimit-htable-expire ${s.expireMs}`;
      return [`${node} ${hashlimit(s.name, options)}`];
    }
  }
}

/** Hash buckets of a hashlimit table that holds at most `max` entries: chains of about 8 when
 *  full, within bounds. Explicit, because the kernel raises a max below the bucket count (its
 *  default depends on the node's memory) to that count. */
function hashBuckets(max: number): number {
  let n = 16;
  while (n < 65_536 && n * 8 < max) n *= 2;
  return Math.min(n, max);
}

/** The kernel keeps at most 15 characters of a hashlimit table's name. */
const HASHLIMIT_NAME_MAX = 15;
/** Hex digits of the options' hash in a hashlimit table's name. */
const HASHLIMIT_HASH_LENGTH = 6;

/**
 * One hashlimit match. The kernel keeps the options of the first rule that named a table for as
 * long as any rule names it, and silently gives later rules that table: so the name carries a
 * hash of the options, and changed options (a flag, an upgrade) make a new table.
 */
function hashlimit(name: string, options: string): string {
  if (name.length + HASHLIMIT_HASH_LENGTH > HASHLIMIT_NAME_MAX)
    throw new RangeError(
      `hashlimit name "${name}" must be at most ${HASHLIMIT_NAME_MAX - HASHLIMIT_HASH_LENGTH} characters (the kernel keeps ${HASHLIMIT_NAME_MAX}, and the hash of the options takes ${HASHLIMIT_HASH_LENGTH})`,
    );
  const hash = createHash('sha256').update(options).digest('hex').slice(0, HASHLIMIT_HASH_LENGTH);
  return `-m hashlimit ${options} --hashlimit-name ${name}${hash}`;
}

export function renderAction(a: Action): string {
  switch (a.kind) {
    case 'accept':
      return '-j ACCEPT';
    case 'drop':
      return '-j DROP';
    case 'return':
      return '-j RETURN';
    case 'jump':
      return `-j ${a.chain}`;
    case 'goto':
      return `-g ${a.chain}`;
    case 'setMark':
      return `-j MARK --set-xmark ${hex(a.value)}/${hex(a.mask)}`;
    case 'nflog':
      // Threshold 1: otherwise the kernel batches events for about a second.
      if (!/^[A-Za-z0-9:_-]{1,63}$/.test(a.prefix)) throw new RangeError(`NFLOG prefix "${a.prefix}" must be 1 to 63 characters of [A-Za-z0-9:_-]`);
      return `-j NFLOG --nflog-group ${a.group} --nflog-prefix ${a.prefix} --nflog-size ${a.size} --nflog-threshold 1`;
  }
}

/**
 * The rule bodies (matches then action, no chain, no comment) that one Rule becomes: usually
 * one, several when a port list is longer than one multiport match allows.
 */
export function renderRuleBodies(rule: Rule): string[] {
  let bodies = [''];
  for (const m of rule.matches) {
    const alts = renderMatch(m);
    bodies = bodies.flatMap((b) => alts.map((a) => (b ? `${b} ${a}` : a)));
  }
  const action = renderAction(rule.action);
  return bodies.map((b) => (b ? `${b} ${action}` : action));
}

/**
 * Keeps comment text that survives iptables-restore's quoting unchanged: printable ASCII
 * without quotes or backslashes, single spaces, bounded length.
 */
export function sanitizeComment(text: string, maxLength: number = MAX_COMMENT): string {
  return text
    .replace(/\s+/g, ' ')
    .replace(/[^\x20-\x7e]|["'\\`]/g, '')
    .replace(/ +/g, ' ')
    .trim()
    .slice(0, maxLength)
    .trim();
}

/**
 * Felix-style rule hash: covers the chain, the previous rule's hash and this rule's text, so
 * the hashes of a chain change from the first edited rule onwards and a chain whose kernel
 * copy was edited or flushed shows up as a different hash list.
 */
export function ruleHash(chain: string, prevHash: string, body: string, comment: string): string {
  return createHash('sha256').update(`${chain}\n${prevHash}\n${body}\n${comment}`).digest('base64url').slice(0, RULE_HASH_LENGTH);
}

export interface RenderedChain {
  /** `-A chain ...` lines, in order. */
  readonly lines: string[];
  /** One hash per line, as kept in the comments. */
  readonly hashes: string[];
}

/**
 * Every rule Weir writes carries this mark in its comment (`weir:<hash> text`), and so does
 * every chain (an empty one gets a marked RETURN): with the default prefix `cali` the names
 * are Calico's, and only the mark tells Weir's chains from Felix's.
 */
export const OWNER_MARK = 'weir';

/** What an empty chain is written as, so that it too carries the mark. */
const EMPTY_CHAIN: readonly Rule[] = [{ matches: [], action: { kind: 'return' }, comment: 'empty chain' }];

export function renderChain(chain: string, rules: readonly Rule[]): RenderedChain {
  const lines: string[] = [];
  const hashes: string[] = [];
  let prev = '';
  for (const rule of rules.length > 0 ? rules : EMPTY_CHAIN) {
    const human = sanitizeComment(rule.comment ?? '', MAX_COMMENT - OWNER_MARK.length - RULE_HASH_LENGTH - 2);
    for (const body of renderRuleBodies(rule)) {
      const hash = ruleHash(chain, prev, body, human);
      const comment = human ? `${OWNER_MARK}:${hash} ${human}` : `${OWNER_MARK}:${hash}`;
      lines.push(`-A ${chain} -m comment --comment "${comment}" ${body}`);
      hashes.push(hash);
      prev = hash;
    }
  }
  return { lines, hashes };
}

/** The RETURN that ends a layer of new rules inserted above a chain's old ones (planLayeredChains). */
export function renderLayerEnd(chain: string, prevHash: string): { line: string; hash: string } {
  const human = 'end of the new rules; older ones below wait for removal';
  const hash = ruleHash(chain, prevHash, '-j RETURN', human);
  return { line: `-A ${chain} -m comment --comment "${OWNER_MARK}:${hash} ${human}" -j RETURN`, hash };
}

/** The comment that marks Weir's hook rules (their target tells which instance). */
export const HOOK_COMMENT = `${OWNER_MARK}:hook`;

/** The hash in a rule comment `weir:<hash> ...`, or undefined if Weir did not write the rule. */
export function ownRuleHash(comment: string | undefined): string | undefined {
  if (comment === undefined || !comment.startsWith(`${OWNER_MARK}:`)) return undefined;
  return comment.slice(OWNER_MARK.length + 1).split(' ')[0];
}

/** The builtin chains of the mangle table Weir may hook, each at position 1. */
export const HOOK_CHAINS = ['FORWARD', 'OUTPUT'] as const;
export type HookChain = (typeof HOOK_CHAINS)[number];

/** Where Weir's chains live. Mangle FORWARD (priority -150) runs before filter FORWARD, for
 *  routed and bridged packets alike, and no other program's rule there can pre-empt Weir's
 *  drops, as kube-proxy's jumps inserted above Weir's in filter FORWARD did. */
export const TABLE = 'mangle';

/** One hook rule: the builtin chain, the own chain it jumps to, and its rule spec. */
export interface Hook {
  readonly chain: HookChain;
  readonly target: string;
  readonly spec: string;
}

/** The FORWARD hook rule spec (without `-A FORWARD`), as iptables-save prints it back. */
export const hookSpec = (topChain: string) => `-m comment --comment "${HOOK_COMMENT}" -j ${topChain}`;

/**
 * The OUTPUT hook of a node whose kube-proxy runs in IPVS mode. A pod's packet to a Service
 * address enters INPUT (the address sits on kube-ipvs0), IPVS rewrites it to the backend and
 * sends it out through OUTPUT: it never crosses FORWARD. This hook sends such packets (requests
 * IPVS forwarded) through the same top chain as FORWARD, so they meet the client's egress and
 * a local backend's ingress policy, after the rewrite. Packets from the node's own addresses
 * (kubelet, the API server, the node's DNS lookups, even when they go through a Service) never
 * match: Weir does not police the node's own traffic in any mode.
 */
export const ipvsHookSpec = (topChain: string) => `-m ipvs --ipvs --vdir ORIGINAL -m addrtype ! --src-type LOCAL ${hookSpec(topChain)}`;

/** The hooks a node needs in mangle: FORWARD always, OUTPUT too in IPVS mode. */
export function hooksFor(topChain: string, ipvs: boolean): Hook[] {
  const hooks: Hook[] = [{ chain: 'FORWARD', target: topChain, spec: hookSpec(topChain) }];
  if (ipvs) hooks.push({ chain: 'OUTPUT', target: topChain, spec: ipvsHookSpec(topChain) });
  return hooks;
}

/**
 * The one rule Weir keeps in the filter table (--allow-action ACCEPT), at FORWARD position 1:
 * in mangle ACCEPT ends only mangle, so what Weir accepted there (with the accept bit set)
 * is accepted here. Denied packets never get here: they were dropped in mangle. If another
 * program's rules land above it, they only see allowed traffic first, as without Weir.
 */
export const acceptHookSpec = (mark: number) => `-m mark --mark ${hex(mark)}/${hex(mark)} -m comment --comment "${HOOK_COMMENT}" -j ACCEPT`;
export const insertAcceptHook = (mark: number) => `-I FORWARD 1 ${acceptHookSpec(mark)}`;

// ---- iptables-restore payload lines -------------------------------------------------------

/** Declares a chain: creates it, or flushes it when it exists (with --noflush). */
export const declareChain = (chain: string) => `:${chain} - [0:0]`;
export const deleteChain = (chain: string) => `-X ${chain}`;
/** Deletes the first rule in `chain` that matches `spec` exactly. */
export const deleteRule = (chain: string, spec: string) => `-D ${chain} ${spec}`;
export const insertHook = (hook: Hook) => `-I ${hook.chain} 1 ${hook.spec}`;

/** Wraps lines in one table's transaction for iptables-restore --noflush; '' for no lines. */
export const tablePayload = (table: 'mangle' | 'filter', lines: readonly string[]) => (lines.length === 0 ? '' : [`*${table}`, ...lines, 'COMMIT', ''].join('\n'));
/** Wraps lines in one filter-table transaction. */
export const filterPayload = (lines: readonly string[]) => tablePayload('filter', lines);
/** Wraps lines in one mangle-table transaction. */
export const manglePayload = (lines: readonly string[]) => tablePayload('mangle', lines);
/**
 * One restore of both tables: mangle first. With the nft backend it is one transaction; with
 * legacy each table commits on its own, in this order, so a failure between them leaves
 * mangle's new policing in place and only filter's older objects not yet removed.
 */
export const restorePayload = (mangle: readonly string[], filter: readonly string[]) => manglePayload(mangle) + filterPayload(filter);

// ---- ipset restore lines ------------------------------------------------------------------

export const ipsetFamily = (family: Family) => (family === 4 ? 'inet' : 'inet6');

/** Sets are created with the comment extension: it is how Weir tells its sets from Felix's,
 *  whose names have the same shape (ipset has no per-set label). */
export const setCreate = (name: string, type: SetType, family: Family, maxElem: number) => `create ${name} ${type} family ${ipsetFamily(family)} maxelem ${maxElem} comment -exist`;
export const setAdd = (name: string, member: string) => `add ${name} ${member} -exist`;
export const setDel = (name: string, member: string) => `del ${name} ${member} -exist`;
/** The adds (or deletes) of many members of one set: kept as the member list and turned into
 *  text only as it is written, a bounded piece at a time (ipsetPieces), so a large first write
 *  never holds all of it as text (docs/design/dataplane.md, "Figures behind the choices"). */
export interface MemberLines {
  readonly op: 'add' | 'del';
  readonly set: string;
  readonly members: readonly string[];
}
/** One entry of an ipset restore batch: a line, or a set's member lines. */
export type SetLine = string | MemberLines;
export const setMemberLines = (op: 'add' | 'del', set: string, members: readonly string[]): MemberLines => ({ op, set, members });
export const setDestroy = (name: string) => `destroy ${name}`;
export const setSwap = (from: string, to: string) => `swap ${from} ${to}`;

/** Lines a piece of ipsetPieces holds at most: few enough that V8 allocates a piece in its young
 *  generation, so a piece written to the pipe is garbage collected young. */
export const LINES_PER_PIECE = 1000;

/** The text of a restore batch in pieces of at most LINES_PER_PIECE lines, each ending in a
 *  newline, in the batch's order. */
export function* ipsetPieces(lines: readonly SetLine[]): Generator<string> {
  // Short entries gather into one piece, so a small batch is one write.
  let pending: string[] = [];
  let count = 0;
  for (const line of lines) {
    const texts: Iterable<[number, string]> = typeof line === 'string' ? [[1, line]] : memberTexts(line);
    for (const [lineCount, text] of texts) {
      if (count + lineCount > LINES_PER_PIECE && count > 0) {
        yield `${pending.join('\n')}\n`;
        pending = [];
        count = 0;
      }
      pending.push(text);
      count += lineCount;
    }
  }
  if (count > 0) yield `${pending.join('\n')}\n`;
}

/** A MemberLines entry as texts of at most LINES_PER_PIECE lines, each with its line count. */
function* memberTexts({ op, set, members }: MemberLines): Generator<[number, string]> {
  for (let i = 0; i < members.length; i += LINES_PER_PIECE) {
    const part = members.slice(i, i + LINES_PER_PIECE);
    yield [part.length, `${op} ${set} ${part.join(` -exist\n${op} ${set} `)} -exist`];
  }
}

/** The whole text of a restore batch as one string: for tests and error messages. */
export const ipsetPayload = (lines: readonly SetLine[]) => [...ipsetPieces(lines)].join('');
