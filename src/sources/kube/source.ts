// The kube source: Pods and NetworkPolicies of all namespaces, Namespaces and this agent's own
// Node (when it has one), list+watched from the API server and fed as model events. Nothing goes out before every
// kind has been listed once; the first batch is then the full state (synced: true), and each
// later batch is the exact diff since the batch before, coalesced over a few milliseconds.

import { setTimeout as sleep } from 'node:timers/promises';
import type { KubeConfig } from '@kubernetes/client-node';
import { ConfigError } from '../../errors.ts';
import type { Logger } from '../../log.ts';
import { diffChanges } from '../view.ts';
import type { KeyChange, ModelUpsert } from '../view.ts';
import type { Source, SourceBatch } from '../types.ts';
import { createKubeClient } from '../../kube/client.ts';
import type { KubeClient } from '../../kube/client.ts';
import { createReflector } from '../../kube/reflector.ts';
import type { Reflector, WatchEvent } from '../../kube/reflector.ts';
import type { ObjectKind } from '../../model/types.ts';
import { resourceCodec, resourcesFor, upsertOf } from './resources.ts';
import { DEFAULT_KUBE_TIMINGS } from './timings.ts';
import type { KubeTimings } from './timings.ts';

/** A watch transition of one of the source's four kinds. */
export type SourceWatchEvent = WatchEvent<ObjectKind>;

export interface KubeSourceOptions {
  readonly kubeConfig: KubeConfig;
  /** This agent's node: the only Node watched; none without it. */
  readonly nodeName?: string;
  readonly log: Logger;
  readonly timings?: Partial<KubeTimings>;
  /** Every watch transition, e.g. to count weir_watch_events_total{kind} ('event') and
   *  weir_watch_restarts_total{kind} ('restart'). Must not throw (it is caught and logged). */
  readonly onWatchEvent?: (e: SourceWatchEvent) => void;
  /** Waits between retries; resolves early when the signal aborts. Tests record the backoff. */
  readonly delay?: (ms: number, signal: AbortSignal) => Promise<void>;
  /** [0, 1), for jitter and the randomised watch timeouts and relist intervals. */
  readonly random?: () => number;
  /** Monotonic milliseconds, for the watchdog. */
  readonly now?: () => number;
  /** Called as each list starts; what it returns is called after each object the list takes
   *  in (the agent bounds its heap with it). */
  readonly startList?: () => () => void;
}

/** Resolves after `ms`, or as soon as `signal` aborts. */
async function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  await sleep(ms, undefined, { signal }).catch(() => {});
}

/**
 * `revision` of a batch: the number of batches this source has delivered since it started,
 * in decimal ("1" is the initial full state). It tells how far the consumer has got, not what
 * the cluster holds; it starts again at "1" when the agent restarts.
 */
export function createKubeSource(opts: KubeSourceOptions): Source {
  const { log, nodeName } = opts;
  const timings: KubeTimings = { ...DEFAULT_KUBE_TIMINGS, ...opts.timings };
  const resources = resourcesFor(nodeName);

  /** Keys changed since the last batch: what the consumer was sent for each (as the reflector
   *  held it) and what it is now (undefined: none). The reflectors hold the rest, as sent. */
  const pending = new Map<string, { readonly sent: ModelUpsert | undefined; now: ModelUpsert | undefined }>();
  const listed = new Set<string>();
  const reflectors: Reflector[] = [];
  let loops: Promise<void>[] = [];
  let client: KubeClient | null = null;
  let abort: AbortController | null = null;
  let onBatch: ((batch: SourceBatch) => void) | null = null;
  let synced = false;
  let seq = 0;
  let flushTimer: NodeJS.Timeout | null = null;
  let stopped = false;
  let started: (() => void) | null = null;

  function schedule(): void {
    // A fixed window from the first change, not reset by later ones, bounds the delay.
    if (flushTimer !== null || stopped) return;
    flushTimer = setTimeout(flush, timings.coalesceMs);
  }

  function flush(): void {
    if (flushTimer !== null) clearTimeout(flushTimer);
    flushTimer = null;
    if (stopped || onBatch === null) return;
    // A change undone within the window (A -> B -> A) yields nothing.
    const events = diffChanges(
      (function* (): Generator<KeyChange> {
        for (const [key, { sent, now }] of pending) yield [key, sent, now];
      })(),
    );
    pending.clear();
    if (events.length === 0 && seq > 0) return;
    seq++;
    const revision = String(seq);
    log.debug({ events: events.length, revision, resourceVersions: resourceVersions() }, `kube: ${events.length} change(s)`);
    try {
      onBatch({ events, synced: true, revision });
    } catch (err) {
      log.error({ err }, 'the kube batch handler failed');
    }
  }

  function resourceVersions(): Record<string, string> {
    const out: Record<string, string> = {};
    resources.forEach((r, i) => {
      out[r.kind] = reflectors[i]?.resourceVersion() ?? '';
    });
    return out;
  }

  return {
    start(cb: (batch: SourceBatch) => void): Promise<void> {
      if (onBatch !== null) return Promise.reject(new Error('the kube source was started twice'));
      if (opts.kubeConfig.getCurrentCluster() === null) {
        return Promise.reject(new ConfigError(['the kubeconfig has no current cluster (check its current-context)']));
      }
      onBatch = cb;
      const ctl = new AbortController();
      abort = ctl;
      const kubeClient = createKubeClient(opts.kubeConfig);
      client = kubeClient;
      const random = opts.random ?? Math.random;
      const deps = {
        client: kubeClient,
        log,
        timings,
        backoff: { initialMs: timings.backoffInitialMs, maxMs: timings.backoffMaxMs },
        delay: opts.delay ?? abortableDelay,
        random,
        now: opts.now ?? (() => performance.now()),
        onWatchEvent: opts.onWatchEvent ?? (() => {}),
        startList: opts.startList,
      };
      const ready = new Promise<void>((resolve) => (started = resolve));
      for (const res of resources) {
        const reflector = createReflector(res, resourceCodec(res), deps, {
          change(key, object, held) {
            const now = object === undefined ? undefined : upsertOf(res, object);
            const p = pending.get(key);
            if (p === undefined) pending.set(key, { sent: held === undefined ? undefined : upsertOf(res, held), now });
            else p.now = now;
            if (synced) schedule();
          },
          listed() {
            listed.add(res.kind);
            if (synced || listed.size < resources.length) return;
            synced = true;
            log.info({ node: nodeName, resourceVersions: resourceVersions() }, 'kube: every kind listed; sending the full state');
            flush();
            started?.();
          },
        });
        reflectors.push(reflector);
      }
      loops = reflectors.map((r) => r.run(ctl.signal));
      return ready;
    },

    async stop(): Promise<void> {
      stopped = true;
      if (flushTimer !== null) clearTimeout(flushTimer);
      flushTimer = null;
      abort?.abort();
      await Promise.allSettled(loops);
      await client?.close();
      started?.();
    },
  };
}
