// The chart's Grafana dashboard and PrometheusRule, rendered by the real helm: off by default,
// rendered when asked, and every query and alert expression naming only metrics that Weir's own
// registries export (read from the modules that build them, not from a list kept here).

import assert from 'node:assert/strict';
import { readFile, rm, writeFile, mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import { DEFAULT_HEARTBEAT_MS } from '../../../src/status/node-reporter.ts';
import { run } from '../../support/run.ts';
import { CHART, find, type Obj, render } from './helm.ts';
import { exportedMetricNames, metricNamesIn } from './metric-names.ts';

const DASHBOARD_FILE = join(CHART, 'dashboards/weir.json');

/** Every panel, row panels' own panels included. */
function panelsOf(dashboard: Obj): Obj[] {
  return (dashboard.panels as Obj[]).flatMap((p) => [p, ...((p.panels as Obj[] | undefined) ?? [])]);
}

/** Every query of the dashboard: the panels' targets and the template variables'. */
function dashboardQueries(dashboard: Obj): { where: string; expr: string }[] {
  const out: { where: string; expr: string }[] = [];
  for (const p of panelsOf(dashboard)) for (const t of p.targets ?? []) out.push({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr });
  for (const v of dashboard.templating.list as Obj[]) if (v.type === 'query') out.push({ where: `variable ${v.name}`, expr: typeof v.query === 'string' ? v.query : v.query.query });
  return out;
}

function rulesOf(docs: readonly Obj[]): Obj[] {
  const rule = find(docs, 'PrometheusRule');
  assert.ok(rule, 'a PrometheusRule');
  return (rule.spec.groups as Obj[]).flatMap((g) => g.rules as Obj[]);
}
const alert = (docs: readonly Obj[], name: string): Obj => {
  const r = rulesOf(docs).find((x) => x.alert === name);
  assert.ok(r, `alert ${name}`);
  return r;
};

/** The names in `exprs` that Weir does not export, as `where: name` lines. */
function unexported(exported: ReadonlySet<string>, exprs: readonly { where: string; expr: string }[]): string[] {
  return exprs.flatMap(({ where, expr }) =>
    metricNamesIn(expr)
      .filter((n) => !exported.has(n))
      .map((n) => `${where}: ${n}`),
  );
}

describe('the chart: Grafana dashboard and PrometheusRule', () => {
  let exported: Set<string>;
  before(async () => {
    exported = await exportedMetricNames();
  });

  test('the name check reads every metric of an expression, and refuses those Weir does not export', () => {
    assert.deepEqual(metricNamesIn('sum by (node) (rate(weir_a_total{x="y"}[5m])) > 0 or on(instance) group_left(z) up offset 5m'), ['weir_a_total', 'up']);
    assert.deepEqual(metricNamesIn('label_values(weir_b, instance)'), ['weir_b']);
    assert.deepEqual(metricNamesIn('histogram_quantile(0.99, sum by (le) (rate(weir_c_bucket{i=~"$instance"}[$__rate_interval])))'), ['weir_c_bucket']);
    assert.deepEqual(unexported(exported, [{ where: 'e', expr: 'up == 0 and weir_dataplane_rules > 0 or kube_pod_status_ready' }]), ['e: up', 'e: kube_pod_status_ready']);
    // A histogram is queried through its series, never by its own name.
    assert.deepEqual(unexported(exported, [{ where: 'h', expr: 'weir_dataplane_apply_duration_seconds' }]), ['h: weir_dataplane_apply_duration_seconds']);
  });

  test('neither the dashboard nor the PrometheusRule nor the controller PodMonitor is rendered by default', async () => {
    const docs = await render();
    assert.equal(
      docs.find((d) => d.kind === 'ConfigMap'),
      undefined,
    );
    assert.equal(find(docs, 'PrometheusRule'), undefined);
    assert.equal(find(docs, 'PodMonitor'), undefined);
  });

  test('the dashboard file is valid JSON: a titled panel with a query for each thing shown per node, each query naming only metrics Weir exports', async () => {
    const dashboard = JSON.parse(await readFile(DASHBOARD_FILE, 'utf8')) as Obj;
    assert.equal(dashboard.uid, 'weir');
    const panels = panelsOf(dashboard).filter((p) => p.type !== 'row');
    const ids = panelsOf(dashboard).map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length, 'panel ids are unique');
    for (const p of panels) {
      assert.ok(p.title && p.description, `panel ${p.id} has a title and a description`);
      assert.ok(p.targets.length > 0 && p.targets.every((t: Obj) => typeof t.expr === 'string' && t.expr !== ''), `panel "${p.title}" has queries`);
    }
    const titles = panels.map((p) => p.title);
    for (const shown of ['Ready', 'Age of the last successful write', 'Apply latency', 'Policies', 'Rules, chains and ipsets', 'Audit events by verdict', 'Lost audit events', 'Status lag'])
      assert.ok(titles.includes(shown), `a panel "${shown}"`);
    const queries = dashboardQueries(dashboard);
    assert.ok(queries.length >= panels.length);
    assert.deepEqual(unexported(exported, queries), []);
  });

  test('enabled, the dashboard is a ConfigMap with the sidecar label holding the file as it is', async () => {
    const docs = await render(['--set', 'grafanaDashboard.enabled=true']);
    const cm = find(docs, 'ConfigMap', 'weir-dashboard');
    assert.ok(cm);
    assert.equal(cm.metadata.namespace, 'kube-system');
    assert.equal(cm.metadata.labels.grafana_dashboard, '1');
    assert.equal(cm.metadata.labels['app.kubernetes.io/instance'], 'weir');
    assert.deepEqual(Object.keys(cm.data), ['weir.json']);
    assert.deepEqual(JSON.parse(cm.data['weir.json']), JSON.parse(await readFile(DASHBOARD_FILE, 'utf8')));

    const relabelled = await render([
      '--set',
      'grafanaDashboard.enabled=true',
      '--set-string',
      'grafanaDashboard.labels.grafana_dashboard=yes',
      '--set',
      'grafanaDashboard.annotations.grafana_folder=Network',
    ]);
    const other = find(relabelled, 'ConfigMap', 'weir-dashboard')!;
    assert.equal(other.metadata.labels.grafana_dashboard, 'yes');
    assert.deepEqual(other.metadata.annotations, { grafana_folder: 'Network' });
  });

  test('enabled, the PrometheusRule has every alert, each expression naming only metrics Weir exports', async () => {
    const docs = await render(['--set', 'prometheusRule.enabled=true', '--set', 'prometheusRule.labels.release=prometheus']);
    const rule = find(docs, 'PrometheusRule')!;
    assert.equal(rule.apiVersion, 'monitoring.coreos.com/v1');
    assert.equal(rule.metadata.namespace, 'kube-system');
    assert.equal(rule.metadata.labels.release, 'prometheus');
    const rules = rulesOf(docs);
    assert.deepEqual(rules.map((r) => r.alert).sort(), [
      'WeirAgentNoSuccessfulWrite',
      'WeirAgentNotReady',
      'WeirApplyFailures',
      'WeirAuditEventsLost',
      'WeirAuditReaderDown',
      'WeirControllerMetricsAbsent',
      'WeirPolicyNotEnforced',
    ]);
    for (const r of rules) {
      assert.ok(r.labels?.severity, `${r.alert} has a severity`);
      assert.ok(r.annotations?.summary && r.annotations?.description, `${r.alert} says what and why`);
    }
    assert.deepEqual(
      unexported(
        exported,
        rules.map((r) => ({ where: r.alert, expr: r.expr })),
      ),
      [],
    );
    assert.equal(alert(docs, 'WeirAgentNotReady').for, '5m');
    assert.match(alert(docs, 'WeirPolicyNotEnforced').expr, /weir_policy_not_enforced_seconds\) > 600$/);
  });

  test('the no-write window is three resync intervals, and a node status is stale after the heartbeat and three more, from agent.resyncInterval', async () => {
    const heartbeat = DEFAULT_HEARTBEAT_MS / 1000;
    for (const [resync, window, stale] of [
      [undefined, '90s', heartbeat + 90],
      ['10', '30s', heartbeat + 30],
      ['2.5', '7500ms', heartbeat + 7.5],
    ] as const) {
      const docs = await render(['--set', 'prometheusRule.enabled=true', ...(resync === undefined ? [] : ['--set-json', `agent.resyncInterval=${resync}`])]);
      assert.equal(alert(docs, 'WeirAgentNoSuccessfulWrite').expr, `increase(weir_dataplane_applies_total{result="ok"}[${window}]) == 0`, `resync ${resync}`);
      assert.match(alert(docs, 'WeirAgentNotReady').expr, new RegExp(`weir_node_status_last_sync_timestamp_seconds\\) > ${String(stale).replace('.', '\\.')}\\)$`), `resync ${resync}`);
    }
  });

  test('without the audit log, no audit alerts', async () => {
    const docs = await render(['--set', 'prometheusRule.enabled=true', '--set', 'audit.enabled=false']);
    assert.deepEqual(
      rulesOf(docs)
        .map((r) => r.alert)
        .filter((a) => a.startsWith('WeirAudit')),
      [],
    );
  });

  test("enabled, the controller's PodMonitor scrapes the controller replicas' metrics port, and the agents' stays as it was", async () => {
    const docs = await render(['--set', 'controllerPodMonitor.enabled=true', '--set', 'controllerPodMonitor.labels.release=prometheus', '--set', 'controllerPodMonitor.interval=15s']);
    const pm = find(docs, 'PodMonitor', 'weir-controller')!;
    assert.ok(pm);
    assert.equal(pm.metadata.labels.release, 'prometheus');
    assert.deepEqual(pm.spec.selector.matchLabels, find(docs, 'Deployment', 'weir-controller')!.spec.selector.matchLabels);
    assert.deepEqual(pm.spec.namespaceSelector, { matchNames: ['kube-system'] });
    assert.deepEqual(pm.spec.podMetricsEndpoints, [{ port: 'metrics', path: '/metrics', interval: '15s' }]);
    assert.equal(docs.filter((d) => d.kind === 'PodMonitor').length, 1, "the agents' PodMonitor is metrics.podMonitor's");
  });

  test('every expression parses, by promtool where it is installed', async (t) => {
    const which = await run('sh', ['-c', 'command -v promtool']);
    if (which.code !== 0) {
      t.skip('promtool is not installed (Debian: apt-get install prometheus)');
      return;
    }
    const docs = await render(['--set', 'prometheusRule.enabled=true']);
    const dashboard = JSON.parse(await readFile(DASHBOARD_FILE, 'utf8')) as Obj;
    const recorded = dashboardQueries(dashboard)
      .filter((q) => !q.expr.startsWith('label_values('))
      .map((q, i) => ({ record: `weir:dashboard:${i}`, expr: q.expr.replaceAll('$__rate_interval', '1m').replaceAll('$instance', '.*').replaceAll('$node', '.*') }));
    const dir = await mkdtemp(join(tmpdir(), 'weir-promtool-'));
    try {
      const file = join(dir, 'rules.json');
      await writeFile(file, JSON.stringify({ groups: [...find(docs, 'PrometheusRule')!.spec.groups, { name: 'dashboard', rules: recorded }] }));
      const r = await run(which.stdout.trim(), ['check', 'rules', file]);
      assert.equal(r.code, 0, r.stdout + r.stderr);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
