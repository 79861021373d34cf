// core/v1 Events on NetworkPolicies (rejections, apply failures), so that `kubectl describe
// networkpolicy` shows them. One series per (policy, type, reason): the first occurrence is
// written at once, repeats within the window are counted and written together (a PATCH of the
// series' count), at most one write per series per window. Best effort: a failed write is
// logged and dropped, and record() never waits.

import { eventBody, eventName, eventRepeatBody, eventsPath } from '../status/bodies.ts';
import type { EventType } from '../status/bodies.ts';
import { systemClock } from '../clock.ts';
import { truncate } from '../status/conditions.ts';
import { createFailureLog } from '../status/failures.ts';
import { createKubeClient, isStatus, MERGE_PATCH } from '../kube/client.ts';
import type { PolicyRef } from '../status/node-status.ts';
import { delayUntilNext, type StatusWriterOptions } from '../status/pacing.ts';

export interface EventRecorderOptions extends StatusWriterOptions {
  /** source.component and reportingComponent, e.g. 'weir-controller'. */
  readonly component: string;
  /** source.host and reportingInstance: the replica's name. */
  readonly host: string;
  /** At most one write per series per this many ms. */
  readonly windowMs?: number;
  /** Writes waiting beyond this are dropped (an event storm must not grow memory). */
  readonly maxQueued?: number;
  /** Called after every attempted write. */
  readonly onWrite?: (result: 'ok' | 'error') => void;
}

export interface EventRecorder {
  /** Counts the event and schedules its write; returns at once and never throws. */
  record(ref: PolicyRef, type: EventType, reason: string, message: string): void;
  /** Drops what is still waiting and waits for the write in flight. */
  stop(): Promise<void>;
}

export const DEFAULT_EVENT_WINDOW_MS = 60_000;
export const DEFAULT_MAX_QUEUED_EVENTS = 1_000;
/** Series kept for counting repeats; idle ones beyond this are forgotten. */
const MAX_SERIES = 5_000;
const MAX_EVENT_MESSAGE = 1_024;
const GRANT = "create, patch on events in the NetworkPolicies' namespaces";

interface Series {
  readonly ref: PolicyRef;
  readonly type: EventType;
  readonly reason: string;
  message: string;
  /** The Event on the server, once written. */
  name: string | null;
  count: number;
  firstMs: number;
  lastWriteMs: number | null;
  /** Occurrences not written yet. */
  pending: number;
  pendingFirstMs: number;
  pendingLastMs: number;
  timer: unknown;
  queued: boolean;
}

export function createEventRecorder(o: EventRecorderOptions): EventRecorder {
  const clock = o.clock ?? systemClock;
  const log = o.log.child({ component: 'status', events: o.component });
  const client = createKubeClient(o.kubeConfig, o.onRequest ? { onRequest: o.onRequest } : {});
  const failures = createFailureLog(log, 'events', GRANT);
  const windowMs = o.windowMs ?? DEFAULT_EVENT_WINDOW_MS;
  const maxQueued = o.maxQueued ?? DEFAULT_MAX_QUEUED_EVENTS;
  const abort = new AbortController();
  const signal = abort.signal;
  const series = new Map<string, Series>();
  const queue: Series[] = [];
  let draining: Promise<void> | null = null;
  let seq = 0;
  let stopped = false;

  const enqueue = (s: Series): void => {
    if (stopped) return;
    if (queue.length >= maxQueued) {
      log.debug({ reason: s.reason, policy: `${s.ref.namespace}/${s.ref.name}` }, 'event queue full: event dropped');
      return;
    }
    s.queued = true;
    queue.push(s);
    kick();
  };

  const kick = (): void => {
    if (draining !== null || queue.length === 0 || stopped) return;
    // Started on a later tick: record() runs on the enforcement path and does no I/O work.
    draining = Promise.resolve()
      .then(drain)
      .finally(() => {
        draining = null;
        kick(); // whatever was queued while the last write finished
      });
  };

  async function drain(): Promise<void> {
    for (let s = queue.shift(); s !== undefined && !stopped; s = queue.shift()) {
      s.queued = false;
      let result: 'ok' | 'error' = 'ok';
      try {
        await write(s);
        failures.succeeded();
      } catch (err) {
        if (stopped) return;
        failures.failed(err);
        result = 'error';
      }
      try {
        o.onWrite?.(result);
      } catch {
        // A faulty callback must not stop the recorder.
      }
    }
  }

  async function write(s: Series): Promise<void> {
    const n = s.pending;
    if (n === 0) return;
    s.pending = 0;
    const now = clock.now();
    s.lastWriteMs = now;
    if (s.name !== null) {
      try {
        await client.send({
          method: 'PATCH',
          path: eventsPath(s.ref.namespace, s.name),
          body: eventRepeatBody({ count: s.count + n, lastMs: s.pendingLastMs, message: s.message }),
          contentType: MERGE_PATCH,
          signal,
        });
        s.count += n;
        return;
      } catch (err) {
        // Events expire (one hour by default): start a new series.
        if (!isStatus(err, 404)) throw err;
        s.name = null;
      }
    }
    const name = eventName(s.ref.name, now, seq++);
    const base = { ref: s.ref, type: s.type, reason: s.reason, message: s.message, component: o.component, host: o.host };
    await client.send({
      method: 'POST',
      path: eventsPath(s.ref.namespace),
      body: eventBody(name, { ...base, count: n, firstMs: s.pendingFirstMs, lastMs: s.pendingLastMs }),
      signal,
    });
    s.name = name;
    s.count = n;
    s.firstMs = s.pendingFirstMs;
  }

  const forgetIdle = (now: number): void => {
    for (const [k, s] of series) {
      if (series.size <= MAX_SERIES) return;
      if (!s.queued && s.timer === null && s.pending === 0 && (s.lastWriteMs ?? 0) + windowMs <= now) series.delete(k);
    }
  };

  return {
    record(ref, type, reason, message) {
      if (stopped) return;
      const now = clock.now();
      const k = `${ref.namespace}\0${ref.name}\0${ref.uid}\0${type}\0${reason}`;
      let s = series.get(k);
      if (s === undefined) {
        if (series.size >= MAX_SERIES) forgetIdle(now);
        s = { ref, type, reason, message: '', name: null, count: 0, firstMs: now, lastWriteMs: null, pending: 0, pendingFirstMs: now, pendingLastMs: now, timer: null, queued: false };
        series.set(k, s);
      }
      if (s.pending === 0) s.pendingFirstMs = now;
      s.pending++;
      s.pendingLastMs = now;
      s.message = truncate(message, MAX_EVENT_MESSAGE);
      if (s.queued || s.timer !== null) return;
      const delay = delayUntilNext(s.lastWriteMs, 0, now, { minIntervalMs: windowMs, retryMinMs: 0, retryMaxMs: 0 });
      if (delay === 0) {
        enqueue(s);
        return;
      }
      const due = s;
      s.timer = clock.setTimeout(() => {
        due.timer = null;
        enqueue(due);
      }, delay);
    },
    async stop() {
      stopped = true;
      for (const s of series.values()) if (s.timer !== null) clock.clearTimeout(s.timer);
      queue.length = 0;
      abort.abort();
      await draining;
      await client.close();
    },
  };
}
