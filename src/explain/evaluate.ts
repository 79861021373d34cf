// A packet walked through calc's desired chains as the kernel would walk them: every Match and
// Action kind of desired.ts, jumps, gotos and returns, mark bits and set membership. Pure: it
// reads the structured rules, never iptables text, so `weir explain` judges by what calc built.

import { cidrContains, parseCidr } from '../model/cidr.ts';
import type { Cidr } from '../model/cidr.ts';
import type { Family, Protocol } from '../model/types.ts';
import type { Action, DesiredSet, Match, Rule } from '../calc/desired.ts';

export type CtState = 'NEW' | 'ESTABLISHED' | 'RELATED' | 'INVALID';

/** One packet as mangle FORWARD sees it. */
export interface Packet {
  readonly family: Family;
  readonly src: string;
  readonly dst: string;
  /** A port protocol, or ICMPv6 (then `icmp6Type` says which message). */
  readonly protocol: Protocol | 'ICMPv6';
  /** The destination port (ignored for ICMPv6). */
  readonly dport: number;
  readonly icmp6Type?: number;
  /** Interfaces it came in on and goes out through; undefined: one Weir names no rule after. */
  readonly inIface?: string;
  readonly outIface?: string;
  /** The bridge port it entered through (br_netfilter), when it came from a local pod. */
  readonly bridgePortIn?: string;
  /** Conntrack's view of it; explain asks about a new connection. */
  readonly ctstate: CtState;
  /** The packet mark on entry (Weir's top chain clears its own bits first). */
  readonly mark: number;
}

/** The sets the rules name: calc's desired sets (a ReadonlyMap fits). */
export interface SetSource {
  get(name: string): DesiredSet | undefined;
}

/** One set lookup a rule made, and what it found. */
export interface SetLookup {
  readonly set: string;
  readonly dir: 'src' | 'dst' | 'dst,dst';
  /** What was looked up: an address, or "address,proto:port" for a hash:ip,port set. */
  readonly member: string;
  readonly found: boolean;
  /** The set's member that holds it (a prefix or the address itself), when found. */
  readonly by?: string;
  readonly negate: boolean;
}

/** A rule whose matches all held: where it is, what it did, and the lookups it made. */
export interface Hit {
  readonly chain: string;
  /** 1-based, as iptables numbers the rules of a chain. */
  readonly position: number;
  readonly rule: Rule;
  /** The chains being walked, outermost first, this one last. */
  readonly stack: readonly string[];
  readonly lookups: readonly SetLookup[];
  /** The packet mark after the rule. */
  readonly mark: number;
  /** The rule only matched because a rate limit was taken to have tokens left. */
  readonly limited: boolean;
}

/** How the walk ended: a terminal ACCEPT or DROP, or the top chain ran out (back to FORWARD). */
export type Verdict = 'accept' | 'drop' | 'return';

export interface Walk {
  readonly verdict: Verdict;
  /** The hit that ended the walk (ACCEPT or DROP); none when the top chain ran out. */
  readonly final?: Hit;
  readonly mark: number;
  /** Every rule that matched, in order. */
  readonly hits: readonly Hit[];
  /** NFLOG prefixes the packet was copied with (the audit log; never a verdict). */
  readonly logged: readonly string[];
}

/** Chains a jump may nest; more is a loop (the kernel refuses loops; calc must never build one). */
const MAX_DEPTH = 64;
/** Rules one walk may visit before it is called a loop. */
const MAX_STEPS = 1_000_000;

export class EvaluationError extends Error {}

/** Whether every match of a rule holds for the packet, with the set lookups it made. */
export function matchRule(rule: Rule, p: Packet, sets: SetSource, mark: number): { readonly matched: boolean; readonly lookups: SetLookup[]; readonly limited: boolean } {
  const lookups: SetLookup[] = [];
  let limited = false;
  for (const m of rule.matches) {
    if (m.kind === 'limit') limited = true;
    if (!matches(m, p, sets, mark, lookups)) return { matched: false, lookups, limited };
  }
  return { matched: true, lookups, limited };
}

function matches(m: Match, p: Packet, sets: SetSource, mark: number, lookups: SetLookup[]): boolean {
  switch (m.kind) {
    case 'set': {
      const look = lookup(sets, m.set, m.dir, p);
      const found = look.by !== undefined;
      lookups.push({ set: m.set, dir: m.dir, member: look.member, found, ...(found ? { by: look.by } : {}), negate: m.negate === true });
      return m.negate === true ? !found : found;
    }
    case 'addr':
      return cidrContains(cidrOf(m.cidr), m.dir === 'src' ? p.src : p.dst);
    case 'proto':
      if (p.protocol !== m.protocol) return false;
      return m.dports === undefined || m.dports.some((r) => r.from <= p.dport && p.dport <= r.to);
    case 'ctstate':
      return m.states.includes(p.ctstate);
    case 'mark':
      return (mark & m.mask) >>> 0 === m.value >>> 0;
    case 'icmp6':
      return p.protocol === 'ICMPv6' && p.icmp6Type === m.type;
    case 'iface':
      return (m.dir === 'in' ? p.inIface : p.outIface) === m.name;
    case 'bridgePortIn':
      return p.bridgePortIn === m.port;
    case 'limit':
      // The audit log's rate limit: a new connection is taken to find a token (it changes no
      // verdict either way, it only decides whether a line is written).
      return true;
  }
}

const cidrs = new Map<string, Cidr>();
function cidrOf(text: string): Cidr {
  let c = cidrs.get(text);
  if (!c) {
    const parsed = parseCidr(text);
    if ('error' in parsed) throw new EvaluationError(`a rule holds an unreadable prefix: ${parsed.error}`);
    cidrs.set(text, (c = parsed));
  }
  return c;
}

/** A set lookup as ipset does it: hash:net holds prefixes (a bare address is a full-length
 *  one); hash:ip,port holds "ip,proto:port" of the destination. */
function lookup(sets: SetSource, name: string, dir: 'src' | 'dst' | 'dst,dst', p: Packet): { member: string; by?: string } {
  const set = sets.get(name);
  if (!set) throw new EvaluationError(`a rule names set ${name}, which the desired state does not hold`);
  if (dir === 'dst,dst') {
    const member = `${p.dst},${p.protocol.toLowerCase()}:${p.dport}`;
    if (set.type !== 'hash:ip,port') throw new EvaluationError(`set ${name} is ${set.type}, looked up by address and port`);
    return set.members.has(member) ? { member, by: member } : { member };
  }
  const ip = dir === 'src' ? p.src : p.dst;
  if (set.type !== 'hash:net') throw new EvaluationError(`set ${name} is ${set.type}, looked up by address`);
  if (set.members.has(ip)) return { member: ip, by: ip };
  for (const m of set.members) if (m.includes('/') && cidrContains(cidrOf(m), ip)) return { member: ip, by: m };
  return { member: ip };
}

interface Frame {
  chain: string;
  rules: readonly Rule[];
  /** The next rule to look at (0-based). */
  next: number;
}

/**
 * Walks the packet from `top` through `chains` as netfilter does: a jump returns to the rule
 * after it, a goto returns to whoever jumped to the chain that went to it, RETURN or the end
 * of a chain goes back one level, and the end of `top` hands the packet back to FORWARD.
 */
export function walk(chains: ReadonlyMap<string, readonly Rule[]>, top: string, packet: Packet, sets: SetSource): Walk {
  const chainOf = (name: string, from: string): readonly Rule[] => {
    const rules = chains.get(name);
    if (!rules) throw new EvaluationError(`${from} goes to chain ${name}, which the desired state does not hold`);
    return rules;
  };
  const stack: Frame[] = [{ chain: top, rules: chainOf(top, 'the hook'), next: 0 }];
  const hits: Hit[] = [];
  const logged: string[] = [];
  let mark = packet.mark >>> 0;
  let steps = 0;
  while (stack.length > 0) {
    const frame = stack[stack.length - 1];
    if (frame.next >= frame.rules.length) {
      stack.pop();
      continue;
    }
    if (++steps > MAX_STEPS) throw new EvaluationError(`the walk visited ${MAX_STEPS} rules: a loop through ${frame.chain}`);
    const position = frame.next + 1;
    const rule = frame.rules[frame.next++];
    const m = matchRule(rule, packet, sets, mark);
    if (!m.matched) continue;
    const a: Action = rule.action;
    if (a.kind === 'setMark') mark = ((mark & ~a.mask) | (a.value & a.mask)) >>> 0;
    const hit: Hit = { chain: frame.chain, position, rule, stack: stack.map((f) => f.chain), lookups: m.lookups, mark, limited: m.limited };
    hits.push(hit);
    switch (a.kind) {
      case 'accept':
        return { verdict: 'accept', final: hit, mark, hits, logged };
      case 'drop':
        return { verdict: 'drop', final: hit, mark, hits, logged };
      case 'return':
        stack.pop();
        break;
      case 'jump':
        if (stack.length >= MAX_DEPTH) throw new EvaluationError(`jumps nest deeper than ${MAX_DEPTH} chains at ${frame.chain}`);
        stack.push({ chain: a.chain, rules: chainOf(a.chain, `${frame.chain} rule ${position}`), next: 0 });
        break;
      case 'goto':
        stack.pop();
        stack.push({ chain: a.chain, rules: chainOf(a.chain, `${frame.chain} rule ${position}`), next: 0 });
        break;
      case 'setMark':
        break;
      case 'nflog':
        logged.push(a.prefix);
        break;
      default:
        // A new kind of action fails the type check here until the walk gives it a meaning.
        throw new EvaluationError(`rule ${position} of ${frame.chain} has an action explain does not know: ${JSON.stringify(a satisfies never)}`);
    }
  }
  return { verdict: 'return', mark, hits, logged };
}
