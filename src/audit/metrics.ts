// The audit log's metrics, registered in the registry the agent passes down (no global one).

import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

/** Where an audit event or line was lost: the kernel's queue to tcpdump overflowed (queue), a
 *  record could not be decoded (malformed), its NFLOG prefix named no current audit rule
 *  (unknown-prefix), more distinct lines waited than the bound (overflow), the file could not
 *  take it (write), or the agent measured kernel rate limiting (ratelimit). */
export type LostWhere = 'queue' | 'malformed' | 'unknown-prefix' | 'overflow' | 'write' | 'ratelimit';

export interface AuditMetrics {
  readonly events: Counter<'verdict'>;
  readonly lines: Counter;
  readonly lost: Counter<'where'>;
  readonly capped: Counter<'namespace'>;
  readonly readerUp: Gauge;
  readonly readerRestarts: Counter;
  readonly readDelay: Histogram;
}

export function createAuditMetrics(registry: Registry): AuditMetrics {
  const registers = [registry];
  return {
    events: new Counter({
      name: 'weir_audit_events_total',
      help: 'Audit events read from the kernel and matched to an audit rule, by verdict (allow, deny, would-deny)',
      labelNames: ['verdict'],
      registers,
    }),
    lines: new Counter({
      name: 'weir_audit_lines_total',
      help: "Audit lines written (a flow's first event makes a line at once; its later events of each second make one more)",
      registers,
    }),
    lost: new Counter({
      name: 'weir_audit_lost_total',
      help: 'Audit events or lines lost, by where: queue (kernel queue to the reader overflowed), malformed, unknown-prefix, overflow (too many lines waiting), write (file), ratelimit',
      labelNames: ['where'],
      registers,
    }),
    capped: new Counter({
      name: 'weir_audit_events_capped_total',
      help: "Audit events not written because the node's cap on lines (--audit-rate a second) was spent, by the namespace of their source pod (empty: a source that is no pod)",
      labelNames: ['namespace'],
      registers,
    }),
    readerUp: new Gauge({ name: 'weir_audit_reader_up', help: '1 while the audit reader (tcpdump on the NFLOG group) listens, else 0', registers }),
    readerRestarts: new Counter({ name: 'weir_audit_reader_restarts_total', help: 'Audit reader (tcpdump) restarts after it exited or wrote a corrupt stream', registers }),
    readDelay: new Histogram({
      name: 'weir_audit_read_delay_seconds',
      help: "Time from the kernel's timestamp of a logged packet to the agent reading it (a flow's first line is written then; later events wait for their one-second window)",
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    }),
  };
}
