// Logs a status writer's failures once per change: a cluster that denies status writes (RBAC)
// must get one clear warning, not one per retry. Enforcement never waits on any of this.

import type { Logger } from '../log.ts';
import { KubeApiError } from '../kube/client.ts';
import type { PassResult } from '../pacer.ts';

export interface FailureLog {
  /** A pass failed: warns if this failure differs from the previous one, else logs at debug. */
  failed(err: unknown): void;
  /** A pass succeeded: says so once if it had been failing. */
  succeeded(): void;
}

/** `writer` names the writer in messages; `grant` says which RBAC rule it needs. */
export function createFailureLog(log: Logger, writer: string, grant: string): FailureLog {
  let last: string | null = null;
  return {
    failed(err) {
      const key = err instanceof KubeApiError ? `${err.status} ${err.reason} ${err.method} ${err.path} ${err.message}` : String(err);
      const error = err instanceof Error ? err.message : String(err);
      if (key === last) {
        log.debug({ writer, error }, 'status write failed again');
        return;
      }
      last = key;
      if (err instanceof KubeApiError && err.status === 403) {
        log.warn(
          { writer, error, grant },
          `${writer}: the API server forbids the status write (RBAC, or an admission policy); enforcement continues, status is not reported until the service account is granted: ${grant}`,
        );
      } else {
        log.warn({ writer, error }, `${writer}: status write failed; enforcement continues, retrying with backoff`);
      }
    },
    succeeded() {
      if (last === null) return;
      last = null;
      log.info({ writer }, `${writer}: status writes succeed again`);
    },
  };
}

/** A paced status writer's onResult (src/pacer.ts): a failed pass is logged unless the writer
 *  is stopping (its aborted requests are no news), a good one ends the failure, and every result
 *  goes on to `onWrite`. */
export function passReporter(failures: FailureLog, stopping: AbortSignal, onWrite?: (result: PassResult) => void): (result: PassResult, err?: unknown) => void {
  return (result, err) => {
    if (result === 'error') {
      if (!stopping.aborted) failures.failed(err);
    } else failures.succeeded();
    onWrite?.(result);
  };
}
