// /healthz and /readyz of the loop: whether writes are owed, running, failing or done. Codes
// only: the details (payload lines, policy names, addresses in stderr) stay in the logs, never
// in an HTTP body.

/** /healthz fails after this many resync intervals without a successful write. */
export const UNHEALTHY_AFTER_RESYNC_INTERVALS = 3;
/** The same bound when the periodic resync is off. */
export const DEFAULT_UNHEALTHY_AFTER_MS = 90_000;

/** Why the loop is or is not ready. */
export type ReadyReason = 'Ready' | 'NotSynced' | 'ApplyFailed' | 'ChangesPending';

export interface Readiness {
  readonly ready: boolean;
  /** The source revision the kernel holds. */
  readonly revision: string;
  readonly reason: ReadyReason;
  /** The error code of the last failed write (ApplyFailed only). */
  readonly error?: string;
}

export type HealthReason = 'Ok' | 'NoWriteSucceeded' | 'WriteHung';

export interface Health {
  readonly healthy: boolean;
  readonly reason: HealthReason;
  /** The error code of the last failed write, if any. */
  readonly error?: string;
}

/** The last failed write: its code for the probes, its message for the status. */
export interface WriteError {
  readonly code: string;
  readonly message: string;
}

/** What the probes read besides the writes: the loop's own state. */
export interface LoopState {
  /** The source has delivered its first complete view. */
  readonly synced: boolean;
  /** The source revision the kernel holds. */
  readonly revision: string;
  /** Batches are queued, or taken into calc but not written yet. */
  readonly pending: boolean;
}

/** The bound of /healthz: `given`, or UNHEALTHY_AFTER_RESYNC_INTERVALS resync intervals, or
 *  DEFAULT_UNHEALTHY_AFTER_MS when the periodic resync is off. */
export function unhealthyAfterMs(resyncIntervalMs: number, given?: number): number {
  return given ?? (resyncIntervalMs > 0 ? UNHEALTHY_AFTER_RESYNC_INTERVALS * resyncIntervalMs : DEFAULT_UNHEALTHY_AFTER_MS);
}

/** Since when a write has been owed, since when one has run, and how the last one ended. */
export class WriteHealth {
  readonly #unhealthyAfterMs: number;
  /** Since when a write has been wanted without one succeeding (null: nothing owed). */
  #owedSince: number | null = null;
  #writeStartedAt: number | null = null;
  #lastError: WriteError | null = null;

  constructor(unhealthyAfterMs: number) {
    this.#unhealthyAfterMs = unhealthyAfterMs;
  }

  /** A write is wanted from `now`, unless one already was. */
  owe(now: number): void {
    this.#owedSince ??= now;
  }

  started(now: number): void {
    this.#owedSince ??= now;
    this.#writeStartedAt = now;
  }

  failed(error: WriteError): void {
    this.#writeStartedAt = null;
    this.#lastError = error;
  }

  succeeded(): void {
    this.#writeStartedAt = null;
    this.#lastError = null;
    this.#owedSince = null;
  }

  get lastError(): WriteError | null {
    return this.#lastError;
  }

  readiness(loop: LoopState): Readiness {
    const { revision } = loop;
    if (!loop.synced) return { ready: false, revision, reason: 'NotSynced' };
    if (this.#lastError) return { ready: false, revision, reason: 'ApplyFailed', error: this.#lastError.code };
    if (loop.pending) return { ready: false, revision, reason: 'ChangesPending' };
    return { ready: true, revision, reason: 'Ready' };
  }

  /** Fails when writes are owed and none has succeeded for the bound: every try failed, or one
   *  hangs. A restart is then the remedy (kubelet's liveness probe). */
  health(now: number): Health {
    const error = this.#lastError ? { error: this.#lastError.code } : {};
    if (this.#writeStartedAt !== null && now - this.#writeStartedAt > this.#unhealthyAfterMs) return { healthy: false, reason: 'WriteHung', ...error };
    if (this.#owedSince !== null && now - this.#owedSince > this.#unhealthyAfterMs) return { healthy: false, reason: 'NoWriteSucceeded', ...error };
    return { healthy: true, reason: 'Ok' };
  }
}
