// The audit log: reader -> catalog.lookup(prefix) -> pod names -> deduplication (a flow's first
// line at once, the rest of each second folded into one) -> the node's cap on lines -> JSON
// lines in a rotated file. A side stage: the agent hands it the model's events (applyModel,
// cheap and synchronous) and it reads calc's catalog; it never calls into the reconcile loop,
// and nothing it does can fail or delay enforcement. Every event it cannot turn into a line is
// counted: in weir_audit_events_capped_total when the cap refused it, else in
// weir_audit_lost_total.

import type { Registry } from 'prom-client';
import type { AuditCatalog, AuditTag, ClusterPolicyRuleRef, PolicyRef } from '../calc/audit-tags.ts';
import type { WeirError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ModelEvent } from '../model/types.ts';
import { type Clock, systemClock } from '../clock.ts';
import { AddressBook } from './addresses.ts';
import { TokenBucket } from './cap.ts';
import { Deduper, dedupeKey } from './dedupe.ts';
import { createAuditMetrics } from './metrics.ts';
import type { NflogEvent } from './pcap.ts';
import { type AuditReader, createTcpdumpReader, type ReaderHandlers } from './reader.ts';
import { createAuditWriter } from './writer.ts';

/** What the agent fills from its flags (AgentConfig.audit, plus the node's name). */
export interface AuditLogConfig {
  /** Written into every line. */
  readonly node: string;
  /** The NFLOG group the audit rules log to (--audit-nflog-group). */
  readonly nflogGroup: number;
  /** The node's cap on lines written a second (--audit-rate), bursts of twice that: a line
   *  beyond it is not written, and its events are counted by the namespace of their source.
   *  The lines that may wait for their window are bounded at 8 x rate. */
  readonly rate: number;
  /** --audit-log-file: absolute path; its directory is created. */
  readonly file: string;
  /** --audit-log-max-size: bytes before the file is rotated. */
  readonly maxSize: number;
  /** --audit-log-max-files: rotated files kept. */
  readonly maxFiles: number;
  /** --audit-stdout: every line on standard output too. */
  readonly stdout: boolean;
  /** The argv that runs tcpdump, tcpdump last. Default ['tcpdump'] (the agent's own network
   *  namespace). */
  readonly tcpdump?: readonly string[];
  /** The user tcpdump runs as (the reader's `user`): default 'tcpdump' when the agent is root. */
  readonly tcpdumpUser?: string | null;
  /** After a flow's first line, written at once, its events of each window are folded into one
   *  line. Default 1000 ms. */
  readonly dedupeWindowMs?: number;
  /** Deleted pods' addresses stay named: how many, how long. Default 10,000 and 5 min. */
  readonly deletedPods?: { readonly max?: number; readonly ttlMs?: number };
}

export interface AuditLogDeps {
  readonly config: AuditLogConfig;
  /** calc's catalog of audit prefixes; read on every event, never written. */
  readonly catalog: AuditCatalog;
  /** The agent's registry: the weir_audit_* metrics are registered here. */
  readonly registry: Registry;
  readonly log: Logger;
  /** Wall clock: deduplication windows and the read delay. */
  readonly clock?: Clock;
  /** Every error the reader or the file reports (the agent counts them in weir_errors_total). */
  readonly onError?: (err: WeirError | Error) => void;
  /** Another reader (tests); default: tcpdump on config.nflogGroup. */
  readonly reader?: (handlers: ReaderHandlers) => AuditReader;
  /** Where --audit-stdout writes; default process.stdout. */
  readonly stdout?: NodeJS.WritableStream;
}

export interface Endpoint {
  readonly ip: string;
  /** null for a protocol without ports (ICMP) or a non-first fragment. */
  readonly port: number | null;
  /** Empty for an address that is no pod (an ipBlock peer, a host outside the cluster). */
  readonly namespace: string;
  readonly pod: string;
}

/** The schema of the lines this version writes (docs/design/audit.md, "The line"): raised when
 *  a field changes meaning or goes; a new optional field keeps it. */
export const AUDIT_LINE_VERSION = 1 as const;

/** One line of the audit log, in the order its fields are written. */
export interface AuditLine {
  readonly version: typeof AUDIT_LINE_VERSION;
  /** RFC 3339, milliseconds, UTC: the kernel's time of the line's first connection. */
  readonly time: string;
  readonly node: string;
  readonly verdict: AuditTag['verdict'];
  readonly direction: AuditTag['direction'];
  readonly policy: { readonly namespace: string; readonly name: string; readonly rule: number } | ClusterPolicyRuleRef | null;
  readonly reason?: 'default-deny';
  readonly isolatedBy?: readonly PolicyRef[];
  /** The source port of the line's first connection. */
  readonly src: Endpoint;
  readonly dst: Endpoint;
  readonly protocol: string;
  /** Connections this line stands for: 1 for a flow's first line, written at once; the
   *  connections of a window for a line that folds them. */
  count: number;
}

export interface AuditStats {
  readonly linesWaiting: number;
  readonly addresses: number;
  readonly deletedAddresses: number;
}

/** The one interface the agent uses. Construction does no I/O. */
export interface AuditLog {
  /** Opens the file and starts the reader; never throws for either (both retry). */
  start(): Promise<void>;
  /** The model's events, in the batches calc gets them: only Pod events are used. */
  applyModel(events: readonly ModelEvent[]): void;
  /** Stops the reader, writes every waiting line, closes the file. */
  stop(): Promise<void>;
  stats(): AuditStats;
}

const NO_POD = { namespace: '', pod: '' };

export function createAuditLog(deps: AuditLogDeps): AuditLog {
  const { config, catalog, log } = deps;
  const clock = deps.clock ?? systemClock;
  const metrics = createAuditMetrics(deps.registry);
  const addresses = new AddressBook({ deletedMax: config.deletedPods?.max, deletedTtlMs: config.deletedPods?.ttlMs });
  const deduper = new Deduper<AuditLine>({ windowMs: config.dedupeWindowMs ?? 1000, maxPending: 8 * config.rate });
  const writer = createAuditWriter({
    file: config.file,
    maxSize: config.maxSize,
    maxFiles: config.maxFiles,
    stdout: config.stdout ? (deps.stdout ?? process.stdout) : undefined,
    log,
    clock,
    onError: (err) => deps.onError?.(err),
    onLost: (n) => metrics.lost.inc({ where: 'write' }, n),
  });
  const cap = new TokenBucket(config.rate, 2 * config.rate, clock.now());
  let timer: unknown;
  let timerAt = Number.POSITIVE_INFINITY;
  let started = false;
  const unknownSeen = new Set<string>();

  const endpoint = (ip: string, port: number | null): Endpoint => {
    const ref = addresses.lookup(ip) ?? NO_POD;
    return { ip, port, namespace: ref.namespace, pod: ref.pod };
  };

  const lineOf = (e: NflogEvent, tag: AuditTag): AuditLine => {
    const base = {
      version: AUDIT_LINE_VERSION,
      time: new Date(e.time).toISOString(),
      node: config.node,
      verdict: tag.verdict,
      direction: tag.direction,
      policy: policyOf(tag),
    };
    const why =
      tag.policy === null ? { ...(tag.reason ? { reason: tag.reason } : {}), ...(tag.isolatedBy ? { isolatedBy: tag.isolatedBy.map((r) => ({ namespace: r.namespace, name: r.name })) } : {}) } : {};
    return { ...base, ...why, src: endpoint(e.srcIp, e.srcPort), dst: endpoint(e.dstIp, e.dstPort), protocol: e.protocol, count: 1 };
  };

  /** Lines whose window closed, with the count each folded: each spends a token of the cap, or
   *  its events are counted as capped. */
  const write = (released: readonly { value: AuditLine; count: number }[], now: number) => {
    let written = 0;
    for (const { value, count } of released) {
      if (!cap.take(now)) {
        metrics.capped.inc({ namespace: value.src.namespace }, count);
        continue;
      }
      value.count = count;
      writer.write(JSON.stringify(value));
      written++;
    }
    if (written > 0) metrics.lines.inc(written);
  };

  /** One timer, at the oldest open window's end. */
  const arm = () => {
    const at = deduper.nextDue();
    if (at === undefined || at >= timerAt) return;
    if (timer !== undefined) clock.clearTimeout(timer);
    timerAt = at;
    timer = clock.setTimeout(
      () => {
        timer = undefined;
        timerAt = Number.POSITIVE_INFINITY;
        const now = clock.now();
        write(deduper.due(now), now);
        arm();
      },
      Math.max(0, at - clock.now()),
    );
  };

  const handlers: ReaderHandlers = {
    events(batch) {
      const now = clock.now();
      // Lines of windows already over go out before this batch's first lines.
      write(deduper.due(now), now);
      const verdicts = { allow: 0, deny: 0, 'would-deny': 0 };
      let unknown = 0;
      let overflow = 0;
      let first = 0;
      for (const e of batch) {
        const tag = catalog.lookup(e.prefix);
        if (tag === undefined) {
          unknown++;
          if (!unknownSeen.has(e.prefix) && unknownSeen.size < 100) {
            unknownSeen.add(e.prefix);
            log.debug({ prefix: e.prefix }, 'audit: an event of an NFLOG prefix no current audit rule has; dropped');
          }
          continue;
        }
        verdicts[tag.verdict]++;
        const delay = (now - e.time) / 1000;
        if (delay >= 0) metrics.readDelay.observe(delay);
        // Only lines spend the cap's tokens, not the events a window folds: a flow that goes on
        // costs one a window, whatever its rate.
        const added = deduper.add(
          dedupeKey(tag, e),
          now,
          () => lineOf(e, tag),
          () => cap.take(now),
        );
        if (added === 'new') {
          // A flow's first line does not wait for its window.
          writer.write(JSON.stringify(lineOf(e, tag)));
          first++;
        } else if (added === 'refused') metrics.capped.inc({ namespace: (addresses.lookup(e.srcIp) ?? NO_POD).namespace });
        else if (added === 'dropped') overflow++;
      }
      if (first > 0) metrics.lines.inc(first);
      for (const [verdict, n] of Object.entries(verdicts)) if (n > 0) metrics.events.inc({ verdict }, n);
      if (unknown > 0) metrics.lost.inc({ where: 'unknown-prefix' }, unknown);
      if (overflow > 0) metrics.lost.inc({ where: 'overflow' }, overflow);
      write(deduper.due(now), now);
      arm();
    },
    state(state, err) {
      metrics.readerUp.set(state === 'running' ? 1 : 0);
      if (state === 'starting' && started) metrics.readerRestarts.inc();
      if (state === 'starting') started = true;
      if (err !== undefined) deps.onError?.(err);
    },
    lost: (n) => metrics.lost.inc({ where: 'queue' }, n),
    malformed: (n) => metrics.lost.inc({ where: 'malformed' }, n),
  };

  const reader = deps.reader?.(handlers) ?? createTcpdumpReader({ group: config.nflogGroup, command: config.tcpdump ?? ['tcpdump'], user: config.tcpdumpUser, log, clock }, handlers);
  metrics.readerUp.set(0);

  return {
    async start() {
      await writer.start();
      started = false;
      reader.start();
    },
    applyModel(events) {
      addresses.apply(events);
    },
    async stop() {
      await reader.stop();
      if (timer !== undefined) clock.clearTimeout(timer);
      timer = undefined;
      timerAt = Number.POSITIVE_INFINITY;
      write(deduper.flush(), clock.now());
      await writer.stop();
      metrics.readerUp.set(0);
    },
    stats: () => ({ linesWaiting: deduper.size, addresses: addresses.size, deletedAddresses: addresses.deletedSize }),
  };
}

/** The line's policy: a NetworkPolicy rule, a ClusterNetworkPolicy rule with its tier, or none. */
function policyOf(tag: AuditTag): AuditLine['policy'] {
  const p = tag.policy;
  if (p === null) return null;
  if ('kind' in p) return { kind: p.kind, name: p.name, tier: p.tier, rule: p.rule };
  return { namespace: p.namespace, name: p.name, rule: p.rule };
}
