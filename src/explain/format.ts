// The short, readable form of an explanation: per family the verdict, then per direction what
// decided it, the kernel rule (chain, position, sets) and the way there. Words only: iptables
// syntax is dataplane's.

import type { Match } from '../calc/desired.ts';
import type { ClusterRuleRef, PolicyRuleRef } from './attribute.ts';
import type { SetLookup } from './evaluate.ts';
import type { DirectionResult, EndpointView, Explanation, PathStep } from './explain.ts';
import type { NodeCheck } from './node-check.ts';

export function formatExplanation(x: Explanation): string {
  const lines = [`${endpoint(x.source)} -> ${endpoint(x.destination)}, ${x.protocol} ${x.port}`];
  for (const f of x.families) {
    lines.push(`IPv${f.family} ${f.src} -> ${f.dst}: ${f.verdict}${f.unpoliced ? ` (not policed: ${f.unpoliced})` : ''}`);
    for (const d of f.directions) lines.push(...direction(d));
  }
  return `${lines.join('\n')}\n`;
}

function endpoint(e: EndpointView): string {
  if (e.kind === 'pod') return `${e.pod} (${e.node})`;
  if (e.kind === 'host') return `${e.given} (${e.pod}, host network on ${e.node})`;
  return `${e.given} (${e.note})`;
}

const policyRule = (dir: string) => (r: PolicyRuleRef) => `${r.namespace}/${r.name} ${dir} rule ${r.rule}`;

function clusterRule(r: ClusterRuleRef): string {
  if (r.rule < 0) return `ClusterNetworkPolicy ${r.name} (${r.tier}; invalid, so it denies everything)`;
  return `ClusterNetworkPolicy ${r.name} (${r.tier}) rule ${r.rule}${r.ruleName ? ` "${r.ruleName}"` : ''} (${r.action})`;
}

function direction(d: DirectionResult): string[] {
  const who = d.pod ?? 'an address no pod holds';
  const head = `  ${d.direction} at ${d.node}, ${who}: ${d.verdict}`;
  const out = [`${head}${why(d)}`];
  const more = (s: string) => out.push(`    ${s}`);
  if (!d.reached) more('(not reached: the other direction dropped it first on this node; this is what this direction alone would do)');
  if (d.passedBy) more(`passed on by ${clusterRule(d.passedBy)}`);
  if (d.auditOnly) {
    const would = d.auditOnly.wouldAllowBy.length > 0 ? `would allow it (${d.auditOnly.wouldAllowBy.map(policyRule(d.direction)).join(', ')})` : 'would drop it (logged as would-deny when audited)';
    more(`audit-only ${d.auditOnly.policies.join(', ')}: ${would}`);
  }
  if (d.rule) more(`rule: ${step(d.rule)}${merged(d)}`);
  for (const l of d.rule?.lookups ?? []) more(lookup(l));
  if (d.logged.length > 0) more(`logged: ${d.logged.map((l) => l.prefix).join(', ')}`);
  more(`path: ${d.path.map((p) => `${p.chain} #${p.position}`).join(' > ')}`);
  if (d.disagreement) more(`WARNING: the chains and the policies disagree: ${d.disagreement}`);
  return out;
}

function why(d: DirectionResult): string {
  switch (d.reason) {
    case 'network-policy':
      return ` by ${(d.allowedBy ?? []).map(policyRule(d.direction)).join(', ')}`;
    case 'cluster-policy':
      return d.clusterRule ? ` by ${clusterRule(d.clusterRule)}` : '';
    case 'default-deny': {
      const by = (d.isolatedBy ?? []).map((p) => `${p.namespace}/${p.name}${p.invalid ? ' (invalid)' : ''}`);
      return ` (no rule allows it; isolated for ${d.direction} by ${by.join(', ')})`;
    }
    case 'not-isolated':
      return d.clusterRule ? ` (${clusterRule(d.clusterRule)} hands it to the default allow)` : ` (no NetworkPolicy selects it for ${d.direction})`;
    case 'self':
      return ' (a pod may always reach itself)';
    case 'fail-closed':
      return ` (no pod ${d.node} knows sends or receives with that address: fail closed)`;
    case 'other':
      return d.rule?.rule.comment ? ` (${d.rule.rule.comment})` : '';
  }
}

function merged(d: DirectionResult): string {
  if (!d.rule?.merged) return '';
  if (d.reason === 'network-policy') return `; merged rule, policies whose peers match: ${(d.allowedBy ?? []).map(policyRule(d.direction)).join(', ')}`;
  const also = d.clusterRule?.alsoMatching ?? [];
  return `; merged rule, rules whose peers match: ${also.map((r) => `${r.name} rule ${r.rule}`).join(', ')}`;
}

function step(p: PathStep): string {
  const what = [...p.rule.matches.map(matchText), `then ${actionText(p)}`].filter((s) => s !== '').join(', ');
  return `${p.chain} #${p.position}${p.rule.comment ? ` "${p.rule.comment}"` : ''}: ${what}`;
}

function actionText(p: PathStep): string {
  const a = p.rule.action;
  switch (a.kind) {
    case 'accept':
    case 'drop':
    case 'return':
      return a.kind;
    case 'jump':
    case 'goto':
      return `${a.kind} ${a.chain}`;
    case 'setMark':
      return a.value === 0 ? `clear mark ${hex(a.mask)}` : `set mark ${hex(a.value)}`;
    case 'nflog':
      return `log as ${a.prefix}`;
  }
}

function matchText(m: Match): string {
  switch (m.kind) {
    case 'set':
      return `${m.dir === 'dst,dst' ? 'destination and port' : m.dir === 'src' ? 'source' : 'destination'} ${m.negate ? 'not ' : ''}in set ${m.set}`;
    case 'addr':
      return `${m.dir === 'src' ? 'source' : 'destination'} in ${m.cidr}`;
    case 'proto':
      return `${m.protocol}${m.dports ? ` port ${m.dports.map((r) => (r.from === r.to ? `${r.from}` : `${r.from}-${r.to}`)).join(',')}` : ''}`;
    case 'ctstate':
      return `conntrack ${m.states.join(',')}`;
    case 'mark':
      return `mark ${hex(m.value)}/${hex(m.mask)}`;
    case 'icmp6':
      return `ICMPv6 type ${m.type}`;
    case 'iface':
      return `${m.dir === 'in' ? 'in from' : 'out to'} ${m.name}`;
    case 'bridgePortIn':
      return `entered through ${m.port}`;
    case 'limit':
      // The node's ceiling, then (when set) each source address's own bucket.
      return `at most ${m.perSecond}/s for the node${m.perSource ? ` and ${m.perSource.perSecond}/s per source address` : ''}`;
  }
}

function lookup(l: SetLookup): string {
  const holds = l.found ? `holds ${l.member}${l.by && l.by !== l.member ? ` (as ${l.by})` : ''}` : `lacks ${l.member}`;
  return `set ${l.set} ${holds}${l.negate ? ' (an except set: the rule needs it absent)' : ''}`;
}

const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;
const hex = (n: number) => `0x${(n >>> 0).toString(16)}`;

/** The node check in words: same, or which part differs. */
export function formatNodeChecks(node: string, checks: readonly NodeCheck[]): string {
  if (checks.length === 0) return `node check on ${node}: ${node} decides no direction of this connection; nothing to compare\n`;
  const lines: string[] = [];
  for (const c of checks) {
    if (c.same) {
      const layered = c.chains.some((ch) => ch.layered) ? ', some chains above older rules a layered write left for the tidy' : '';
      lines.push(`node check on ${node}, IPv${c.family}: the kernel holds what explain judged by (the hook, ${count(c.chains.length, 'chain')}, ${count(c.sets.length, 'set')}${layered})`);
      continue;
    }
    lines.push(`node check on ${node}, IPv${c.family}: the kernel differs`);
    if (!c.hook) lines.push("  hook: mangle FORWARD's first rule is not Weir's hook to the top chain");
    for (const ch of c.chains) {
      if (ch.same) continue;
      lines.push(
        ch.kernel === null ? `  chain ${ch.chain}: missing from the kernel` : `  chain ${ch.chain}: line ${ch.firstDifference} differs (the kernel holds ${ch.kernel} lines, calc ${ch.expected})`,
      );
    }
    for (const s of c.sets) {
      if (s.same) continue;
      if (s.kernel === null) {
        lines.push(`  set ${s.set}: missing from the kernel`);
        continue;
      }
      const answer = s.kernel === s.expected ? '' : `the kernel ${s.kernel ? 'holds' : 'lacks'} ${s.member} (calc: ${s.expected ? 'holds' : 'lacks'}); `;
      lines.push(`  set ${s.set}: ${answer}${s.missing} members missing, ${s.extra} extra${s.examples.length > 0 ? ` (${s.examples.join(', ')})` : ''}`);
    }
  }
  return `${lines.join('\n')}\n`;
}
