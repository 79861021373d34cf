// Leader election loop over one Lease: try to acquire or renew every third of the lease
// duration, handle write races (409) by reading again, release on stop. A holder that cannot
// renew within two thirds of the duration stops believing it holds the lease, so it stops
// writing before anybody else may take over.

import type { Logger } from '../log.ts';
import type { Clock } from '../clock.ts';
import type { FailureLog } from '../status/failures.ts';
import { isStatus } from '../kube/client.ts';
import type { KubeClient } from '../kube/client.ts';
import { decideLease, leaseBody, nextLeaseSpec, observe, parseLease } from './lease.ts';
import type { LeaseObservation, LeaseRecord } from './lease.ts';

export interface LeaseElectorOptions {
  readonly client: KubeClient;
  readonly clock: Clock;
  readonly log: Logger;
  readonly failures: FailureLog;
  readonly identity: string;
  readonly namespace: string;
  readonly name: string;
  readonly durationSeconds: number;
  /** Called when this process starts or stops holding the lease. */
  readonly onChange: (holder: boolean) => void;
}

export interface LeaseElector {
  start(): void;
  /** True while the lease is ours and was renewed recently enough to trust it. */
  isHolder(): boolean;
  /** Stops trying; releases the lease if held, so another agent takes over at once. */
  stop(): Promise<void>;
}

export function createLeaseElector(o: LeaseElectorOptions): LeaseElector {
  const { client, clock, log, identity, namespace, name } = o;
  const durationMs = o.durationSeconds * 1000;
  const periodMs = Math.max(1, Math.floor(durationMs / 3));
  const renewDeadlineMs = Math.floor((durationMs * 2) / 3);
  const path = `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/leases/${encodeURIComponent(name)}`;
  const collection = `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/leases`;
  const abort = new AbortController();
  const signal = abort.signal;

  let holding = false;
  let lastRenewMs = -Infinity;
  let observed: LeaseObservation | null = null;
  let timer: unknown = null;
  let running: Promise<void> | null = null;
  let stopped = false;

  const valid = (): boolean => holding && clock.now() < lastRenewMs + renewDeadlineMs;

  const setHolding = (v: boolean, holder?: string): void => {
    if (v === holding) return;
    holding = v;
    if (v) log.info({ lease: `${namespace}/${name}` }, 'acquired the policy status lease: this replica now writes NetworkPolicyStatus');
    else log.info({ lease: `${namespace}/${name}`, holder }, 'not holding the policy status lease');
    o.onChange(v);
  };

  async function read(): Promise<unknown> {
    try {
      return await client.send({ method: 'GET', path, signal });
    } catch (err) {
      if (isStatus(err, 404)) return null;
      throw err;
    }
  }

  async function tick(): Promise<void> {
    try {
      let raw = await read();
      for (let attempt = 0; ; attempt++) {
        const now = clock.now();
        const rec: LeaseRecord | null = raw === null ? null : parseLease(raw);
        if (rec !== null) observed = observe(observed, rec, now);
        const action = decideLease(rec, observed, identity, now, o.durationSeconds);
        if (action.kind === 'wait') {
          setHolding(false, action.holder);
          o.failures.succeeded();
          return;
        }
        const spec = nextLeaseSpec(action.kind, rec, identity, o.durationSeconds, now);
        try {
          if (action.kind === 'create' || rec === null) {
            await client.send({ method: 'POST', path: collection, body: leaseBody(namespace, name, spec), signal });
          } else {
            await client.send({ method: 'PUT', path, body: leaseBody(namespace, name, spec, rec.resourceVersion), signal });
          }
          lastRenewMs = now;
          setHolding(true);
          o.failures.succeeded();
          return;
        } catch (err) {
          // Somebody wrote the Lease since we read it: decide again on what they wrote.
          if (!isStatus(err, 409) || attempt >= 2) throw err;
          raw = await read();
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      o.failures.failed(err);
      if (holding && !valid()) setHolding(false);
    }
  }

  const schedule = (delayMs: number): void => {
    if (stopped) return;
    timer = clock.setTimeout(() => {
      timer = null;
      running = tick().finally(() => {
        running = null;
        schedule(periodMs);
      });
    }, delayMs);
  };

  return {
    start() {
      if (timer === null && running === null && !stopped) schedule(0);
    },
    isHolder: valid,
    async stop() {
      stopped = true;
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      abort.abort();
      await running;
      if (!holding) return;
      holding = false;
      try {
        const raw = await client.send({ method: 'GET', path });
        const rec = parseLease(raw);
        if (rec.holder !== identity) return;
        const spec = nextLeaseSpec('release', rec, identity, o.durationSeconds, clock.now());
        await client.send({ method: 'PUT', path, body: leaseBody(namespace, name, spec, rec.resourceVersion) });
        log.info({ lease: `${namespace}/${name}` }, 'released the policy status lease');
      } catch (err) {
        // It expires on its own.
        log.debug({ error: err instanceof Error ? err.message : String(err) }, 'could not release the policy status lease');
      }
    },
  };
}
