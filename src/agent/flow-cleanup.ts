// Deleting the tracked connections of pod addresses no rule dispatches any more, so that a pod
// given one of them later does not carry on its predecessor's flows. It runs beside the loop:
// each address costs walks of the kernel's whole conntrack table (docs/design/agent.md,
// "Figures behind the choices"), which must not hold up the next change's write.

import type { Clock } from '../clock.ts';
import type { Logger } from '../log.ts';
import type { Metrics } from '../metrics/index.ts';
import { codeOf, round } from './log-fields.ts';

/** Tries at deleting a released address's tracked connections, each after a write. */
export const FORGET_ATTEMPTS = 3;

/** What the cleanup needs from the dataplane (DataplanePort.forgetFlows). */
export interface FlowForgetter {
  /** Deletes the tracked connections of these addresses; resolves with how many went. */
  forgetFlows(addresses: readonly string[]): Promise<number>;
}

export interface FlowCleanupOptions {
  readonly dataplane: FlowForgetter;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly clock: Clock;
  /** A round of deletions has ended, whatever it did. */
  readonly onEnded: () => void;
}

export class FlowCleanup {
  readonly #o: FlowCleanupOptions;
  /** Addresses written out of dispatch whose connections are still to be deleted, with the
   *  failed tries so far. */
  readonly #toForget = new Map<string, number>();
  /** The round running beside the loop, if any. */
  #running: Promise<void> | null = null;
  #stopped = false;

  constructor(o: FlowCleanupOptions) {
    this.#o = o;
  }

  get running(): boolean {
    return this.#running !== null;
  }

  /** Addresses a write has just stopped dispatching: their connections are to be deleted. */
  add(addresses: Iterable<string>): void {
    for (const a of addresses) this.#toForget.set(a, 0);
  }

  /** No round starts after this; one running ends on its own (whenDone). */
  stop(): void {
    this.#stopped = true;
  }

  /** Resolves when the round under way, if any, has ended. */
  async whenDone(): Promise<void> {
    await this.#running;
  }

  /**
   * Starts a round for every address owed, unless one runs: addresses added meanwhile go in the
   * next round, started when this one succeeds. A failure waits for the next write (the caller
   * starts after each), FORGET_ATTEMPTS tries in all, so that a broken conntrack cannot make
   * every write retry more.
   */
  start(): void {
    if (this.#running !== null || this.#toForget.size === 0 || this.#stopped) return;
    const { clock, dataplane, log, metrics } = this.#o;
    const addresses = [...this.#toForget.keys()];
    const t0 = clock.now();
    let again = false;
    this.#running = dataplane
      .forgetFlows(addresses)
      .then(
        (entries) => {
          for (const a of addresses) this.#toForget.delete(a);
          log.debug({ addresses, entries, ms: round(clock.now() - t0) }, 'forgot the tracked connections of released pod addresses');
          again = true;
        },
        (err: unknown) => {
          const code = codeOf(err);
          metrics.errors.inc({ reason: code });
          const abandoned: string[] = [];
          for (const a of addresses) {
            const tries = (this.#toForget.get(a) ?? 0) + 1;
            if (tries < FORGET_ATTEMPTS) this.#toForget.set(a, tries);
            else {
              this.#toForget.delete(a);
              abandoned.push(a);
            }
          }
          if (abandoned.length > 0)
            log.error(
              { err, code, addresses: abandoned },
              `could not delete the tracked connections of released pod addresses in ${FORGET_ATTEMPTS} tries; a pod given one of them may carry on its flows`,
            );
          else log.warn({ err, code, addresses }, 'could not delete the tracked connections of released pod addresses; will retry after the next write');
        },
      )
      .finally(() => {
        this.#running = null;
        if (again) this.start();
        this.#o.onEnded();
      });
  }
}
