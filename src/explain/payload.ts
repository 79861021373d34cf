// Where a rule of calc's chains lands in the payload the dataplane writes: one Rule may be
// rendered as several lines (a port list longer than one multiport match), so a chain's line
// numbers, which iptables shows, can run ahead of its rule indexes. Pure.

import type { Rule } from '../calc/desired.ts';
import { renderRuleBodies, splitPorts } from '../dataplane/render.ts';

/** The first payload line of each rule of a chain (1-based), per chain as calc holds it. */
const firsts = new WeakMap<readonly Rule[], number[]>();

/** The payload line (1-based) of the rule at `index` (0-based) that a packet to `dport`
 *  matches: the line of the port group holding it when the rule is split. */
export function payloadLine(rules: readonly Rule[], index: number, dport: number): number {
  let lines = firsts.get(rules);
  if (!lines) {
    lines = [];
    let next = 1;
    for (const r of rules) {
      lines.push(next);
      next += renderRuleBodies(r).length;
    }
    firsts.set(rules, lines);
  }
  const rule = rules[index];
  let group = 0;
  for (const m of rule.matches) {
    if (m.kind !== 'proto' || m.dports === undefined) continue;
    const groups = splitPorts(m.dports);
    if (groups.length > 1)
      group = Math.max(
        0,
        groups.findIndex((g) => g.some((r) => r.from <= dport && dport <= r.to)),
      );
  }
  return lines[index] + group;
}
