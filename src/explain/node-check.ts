// `weir explain --node-check`: does this node's kernel hold what explain judged by? Every chain
// on the packet's way is compared rule by rule (the hash each rule's comment carries, which
// the dataplane computes from the rendered rule), and every set looked up is asked the same
// question in the kernel's copy, and compared whole. Pure: the kernel's state comes in as text
// already read (iptables-save, ipset save).

import type { DesiredDataplane, DesiredSet, Members, Rule } from '../calc/desired.ts';
import { memberKey, type SavedSet } from '../dataplane/ipset.ts';
import { commentOf, parseSave, targetOf } from '../dataplane/iptables.ts';
import { parseIpsetSave } from '../dataplane/ipset.ts';
import { HOOK_COMMENT, ownRuleHash, renderChain, renderLayerEnd } from '../dataplane/render.ts';
import type { Family } from '../model/types.ts';
import type { Packet, SetLookup } from './evaluate.ts';
import type { Explanation } from './explain.ts';
import { matchRule } from './evaluate.ts';

/** One family's kernel state, as read on the node. */
export interface KernelState {
  /** Mangle chains: name -> rule specs as iptables-save prints them (after `-A <chain> `). */
  readonly chains: ReadonlyMap<string, readonly string[]>;
  readonly sets: ReadonlyMap<string, SavedSet>;
}

/** Reads `iptables-save` (mangle) and `ipset save` output. */
export function kernelStateOf(iptablesSave: string, ipsetSave: string): KernelState {
  return { chains: parseSave(iptablesSave, 'mangle'), sets: parseIpsetSave(ipsetSave) };
}

export interface ChainCheck {
  readonly chain: string;
  /** Lines calc's rules render to. */
  readonly expected: number;
  /** Lines the kernel's chain holds; null: no such chain. */
  readonly kernel: number | null;
  readonly same: boolean;
  /** The first line (1-based) that differs, when one does. */
  readonly firstDifference?: number;
  /** The kernel holds the rules, above older ones a layered write left for the tidy. */
  readonly layered?: boolean;
}

export interface SetCheck {
  readonly set: string;
  /** What was looked up, and whether calc's set and the kernel's hold it (null: no such set). */
  readonly member: string;
  readonly expected: boolean;
  readonly kernel: boolean | null;
  /** Members calc wants that the kernel lacks, and the kernel holds beyond them (a few named). */
  readonly missing: number;
  readonly extra: number;
  readonly examples: readonly string[];
  readonly same: boolean;
}

export interface NodeCheck {
  readonly node: string;
  readonly family: Family;
  /** mangle FORWARD's first rule is Weir's hook to the top chain. */
  readonly hook: boolean;
  readonly chains: readonly ChainCheck[];
  readonly sets: readonly SetCheck[];
  /** Everything on the packet's way is as calc wants it. */
  readonly same: boolean;
}

export interface CheckInput {
  readonly node: string;
  readonly family: Family;
  readonly topChain: string;
  readonly chains: ReadonlyMap<string, readonly Rule[]>;
  readonly sets: ReadonlyMap<string, DesiredSet>;
  /** The chains the packet went through here (the top chain among them). */
  readonly path: readonly string[];
  /** The set lookups it made on the way. */
  readonly lookups: readonly SetLookup[];
  readonly packet: Packet;
}

export function checkNode(input: CheckInput, kernel: KernelState): NodeCheck {
  const forward = kernel.chains.get('FORWARD') ?? [];
  const hook = forward.length > 0 && commentOf(forward[0]) === HOOK_COMMENT && targetOf(forward[0]) === input.topChain;
  const chains = [...new Set([input.topChain, ...input.path])].map((c) => checkChain(c, input.chains.get(c) ?? [], kernel.chains.get(c)));
  const seen = new Set<string>();
  const sets: SetCheck[] = [];
  for (const l of input.lookups) {
    const key = `${l.set}\n${l.dir}`;
    if (seen.has(key)) continue;
    seen.add(key);
    sets.push(checkSet(l, input.sets.get(l.set), kernel.sets.get(l.set), input.packet));
  }
  return { node: input.node, family: input.family, hook, chains, sets, same: hook && chains.every((c) => c.same) && sets.every((s) => s.same) };
}

function checkChain(chain: string, rules: readonly Rule[], kernelSpecs: readonly string[] | undefined): ChainCheck {
  const want = renderChain(chain, rules).hashes;
  if (kernelSpecs === undefined) return { chain, expected: want.length, kernel: null, same: false, firstDifference: 1 };
  const have = kernelSpecs.map((s) => ownRuleHash(commentOf(s)));
  const base = { chain, expected: want.length, kernel: have.length };
  for (let i = 0; i < want.length; i++) if (have[i] !== want[i]) return { ...base, same: false, firstDifference: i + 1 };
  if (have.length === want.length) return { ...base, same: true };
  // A layered write: the new rules on top, then the RETURN that ends them, older rules below.
  const layerEnd = renderLayerEnd(chain, want.at(-1) ?? '').hash;
  if (have[want.length] === layerEnd) return { ...base, same: true, layered: true };
  return { ...base, same: false, firstDifference: want.length + 1 };
}

/** A kernel set in the form calc's sets take, so the same lookup asks it the same question. */
function asDesired(s: SavedSet): DesiredSet {
  const members: Members = new Set(s.members.map((m) => memberKey(s.type, m)));
  return { name: s.name, family: s.family ?? 4, type: s.type === 'hash:ip,port' ? 'hash:ip,port' : 'hash:net', members };
}

function checkSet(l: SetLookup, want: DesiredSet | undefined, have: SavedSet | undefined, packet: Packet): SetCheck {
  const base = { set: l.set, member: l.member, expected: l.found };
  if (have === undefined) return { ...base, kernel: null, missing: want?.members.size ?? 0, extra: 0, examples: [], same: false };
  const kernelSet = asDesired(have);
  const rule: Rule = { matches: [{ kind: 'set', set: l.set, dir: l.dir }], action: { kind: 'drop' } };
  const kernel = matchRule(rule, packet, { get: () => kernelSet }, 0).matched;
  const wanted = new Set([...(want?.members ?? [])].map((m) => memberKey(kernelSet.type, m)));
  const missing = [...wanted].filter((m) => !kernelSet.members.has(m));
  const extra = [...kernelSet.members].filter((m) => !wanted.has(m));
  const examples = [...missing.slice(0, 3).map((m) => `missing ${m}`), ...extra.slice(0, 3).map((m) => `extra ${m}`)];
  return { ...base, kernel, missing: missing.length, extra: extra.length, examples, same: kernel === l.found && missing.length === 0 && extra.length === 0 };
}

/** The checks of the directions an explanation found decided at `node`, one per family. */
export function checksFor(x: Explanation, node: string, desired: DesiredDataplane, kernel: (family: Family) => KernelState): NodeCheck[] {
  const out: NodeCheck[] = [];
  for (const f of x.families) {
    const here = f.directions.filter((d) => d.node === node);
    if (here.length === 0) continue;
    const steps = here.flatMap((d) => d.path);
    const packet: Packet = { family: f.family, src: f.src, dst: f.dst, protocol: x.protocol, dport: x.port, ctstate: 'NEW', mark: 0 };
    out.push(
      checkNode(
        { node, family: f.family, topChain: desired.topChain, chains: desired.chains[f.family], sets: desired.sets, path: steps.map((s) => s.chain), lookups: steps.flatMap((s) => s.lookups), packet },
        kernel(f.family),
      ),
    );
  }
  return out;
}
