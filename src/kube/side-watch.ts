// A list+watch of one small collection beside the main source (the nodes' reports, the
// uninstall signal): real time, the status writers' retry bounds (jittered, as every reflector's),
// watch errors logged as warnings.

import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from '../log.ts';
import { DEFAULT_RETRY_MAX_MS, DEFAULT_RETRY_MIN_MS } from '../status/pacing.ts';
import type { KubeClient } from './client.ts';
import type { Codec, Collection } from './collection.ts';
import { createReflector, DEFAULT_LIST_WATCH_TIMINGS, type ListWatchTimings, type ReflectorSink } from './reflector.ts';

export interface SideWatchOptions {
  readonly client: KubeClient;
  readonly log: Logger;
  readonly relistMs?: ListWatchTimings['relistMs'];
}

/** Lists and watches until `signal` aborts; never rejects. */
export function watchCollection<T>(res: Collection, codec: Codec<T>, o: SideWatchOptions, sink: ReflectorSink<T>, signal: AbortSignal): Promise<void> {
  const reflector = createReflector(
    res,
    codec,
    {
      client: o.client,
      log: o.log,
      timings: o.relistMs ? { ...DEFAULT_LIST_WATCH_TIMINGS, relistMs: o.relistMs } : DEFAULT_LIST_WATCH_TIMINGS,
      backoff: { initialMs: DEFAULT_RETRY_MIN_MS, maxMs: DEFAULT_RETRY_MAX_MS },
      delay: (ms, s) => sleep(ms, undefined, { signal: s }).catch(() => {}),
      random: Math.random,
      now: () => performance.now(),
      onWatchEvent: (e) => {
        if (e.type === 'error') o.log.warn({ kind: e.kind, detail: e.detail }, 'watch error; restarting with backoff');
      },
    },
    sink,
  );
  return reflector.run(signal);
}
