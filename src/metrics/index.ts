// Prometheus metrics: one registry built by the agent and passed down (no global registry).
// Names follow the conventions: weir_<subsystem>_<name>_<unit>, base units, _total counters.

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface Metrics {
  readonly registry: Registry;
  readonly applyDuration: Histogram<'step'>;
  readonly applies: Counter<'result'>;
  readonly errors: Counter<'reason'>;
  readonly sets: Gauge;
  readonly chains: Gauge;
  readonly rules: Gauge;
  readonly localPods: Gauge;
  readonly policies: Gauge<'state'>;
  readonly calcDuration: Histogram;
  readonly sourceEvents: Counter<'kind'>;
  readonly commandRetries: Counter<'command'>;
  readonly enforceLatency: Histogram;
  readonly watchEvents: Counter<'kind' | 'type'>;
  readonly watchRestarts: Counter<'kind' | 'reason'>;
  readonly statusWrites: Counter<'kind' | 'result'>;
  readonly driftRepairs: Counter<'what'>;
  readonly connectionsCut: Counter;
}

export function createMetrics(opts: { defaultMetrics?: boolean } = {}): Metrics {
  const registry = new Registry();
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: 'weir_' });
  const registers = [registry];
  return {
    registry,
    applyDuration: new Histogram({
      name: 'weir_dataplane_apply_duration_seconds',
      help: 'Time to write to the kernel, by step (read, sets, chains, destroy) and whole write (total: changes, tidy: what layered writes left, resync)',
      labelNames: ['step'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers,
    }),
    applies: new Counter({ name: 'weir_dataplane_applies_total', help: 'Dataplane applies by result', labelNames: ['result'], registers }),
    errors: new Counter({ name: 'weir_errors_total', help: 'Errors by reason (error code)', labelNames: ['reason'], registers }),
    sets: new Gauge({ name: 'weir_dataplane_ipsets', help: 'ipsets Weir holds in the kernel (both families)', registers }),
    chains: new Gauge({ name: 'weir_dataplane_chains', help: 'iptables chains Weir holds in the kernel (both families)', registers }),
    rules: new Gauge({ name: 'weir_dataplane_rules', help: 'iptables rules in Weir chains (both families)', registers }),
    localPods: new Gauge({ name: 'weir_local_pods', help: 'Pods of this node that Weir polices', registers }),
    policies: new Gauge({ name: 'weir_policies', help: 'NetworkPolicies known, by state (valid, invalid)', labelNames: ['state'], registers }),
    calcDuration: new Histogram({
      name: 'weir_calc_duration_seconds',
      help: 'Time to compile one batch of model events into the desired dataplane',
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5],
      registers,
    }),
    sourceEvents: new Counter({ name: 'weir_source_events_total', help: 'Model events received from the source, by kind', labelNames: ['kind'], registers }),
    commandRetries: new Counter({ name: 'weir_command_retries_total', help: 'Retried iptables/ipset commands (xtables lock held)', labelNames: ['command'], registers }),
    enforceLatency: new Histogram({
      name: 'weir_event_to_enforced_seconds',
      help: 'Time from a change reaching the agent to the kernel holding it',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    }),
    watchEvents: new Counter({ name: 'weir_watch_events_total', help: 'Watch events received from the API server, by kind and type', labelNames: ['kind', 'type'], registers }),
    watchRestarts: new Counter({ name: 'weir_watch_restarts_total', help: 'Watch restarts, by kind and reason (error, expired, watchdog, relist)', labelNames: ['kind', 'reason'], registers }),
    statusWrites: new Counter({ name: 'weir_status_writes_total', help: 'Status object writes, by kind and result', labelNames: ['kind', 'result'], registers }),
    driftRepairs: new Counter({
      name: 'weir_drift_repairs_total',
      help: 'Changes by other programs to what Weir owns, found between resyncs and repaired, by what (hook)',
      labelNames: ['what'],
      registers,
    }),
    connectionsCut: new Counter({
      name: 'weir_connections_cut_total',
      help: 'Tracked connections deleted because the rules written since deny them (weir.dev/cut-existing or --cut-existing)',
      registers,
    }),
  };
}
