// The metric names Weir exports, read from the registries its own modules build (the agent's,
// the audit log's, the controller's), and the metric names a PromQL expression reads.

import { Registry } from 'prom-client';
import { createAuditMetrics } from '../../../src/audit/metrics.ts';
import { createControllerMetrics } from '../../../src/controller/metrics.ts';
import { createMetrics } from '../../../src/metrics/index.ts';

/** Every series name a query can name: a histogram's _bucket, _sum and _count, a summary's
 *  quantiles, _sum and _count, a counter's or a gauge's own name. */
export async function exportedMetricNames(): Promise<Set<string>> {
  const agent = createMetrics();
  createAuditMetrics(agent.registry);
  const controller = new Registry();
  createControllerMetrics(controller, { nodes: () => [], notEnforcedMs: () => 0 });
  const names = new Set<string>();
  for (const registry of [agent.registry, controller]) {
    for (const m of await registry.getMetricsAsJSON()) {
      // MetricType's values are these words.
      const type = String(m.type);
      if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(m.name + s);
      else if (type === 'summary') for (const s of ['', '_sum', '_count']) names.add(m.name + s);
      else names.add(m.name);
    }
  }
  return names;
}

const KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'and', 'or', 'unless', 'bool', 'offset', 'inf', 'nan']);

/** The metric names a PromQL expression (or a Grafana query: $variables, label_values) reads:
 *  every identifier that is not a function, a keyword, a label or inside a string, a label
 *  matcher or a range. */
export function metricNamesIn(expr: string): string[] {
  let s = expr.replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""');
  s = s.replace(/\blabel_values\(\s*([^,()]*?)\s*,\s*\w+\s*\)/g, ' $1 ').replace(/\blabel_values\(\s*\w+\s*\)/g, ' ');
  s = s.replace(/\$\{[^}]*\}|\$\w+/g, ' ');
  s = s.replace(/\{[^{}]*\}/g, ' ').replace(/\[[^\]]*\]/g, ' ');
  s = s.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  const names: string[] = [];
  // Numbers and durations first (5m, 1e3, 0.99), so that their letters are not taken for names.
  for (const m of s.matchAll(/\d+(?:\.\d+)?(?:e[+-]?\d+)?[a-z]*|[A-Za-z_:][A-Za-z0-9_:]*/gi)) {
    const word = m[0];
    if (/^\d/.test(word) || KEYWORDS.has(word.toLowerCase())) continue;
    const after = s.slice(m.index + word.length).trimStart();
    if (after.startsWith('(')) continue;
    names.push(word);
  }
  return names;
}
