// Waiting on a cluster that converges asynchronously: the agents enforce, and the status
// writers report, some time after a change; there is no revision to wait for as in manifest mode.

import type { Cluster } from '../../src/sim/cluster.ts';
import { diffMatrix, expectMatrix, type Matrix, probeMatrix, renderMatrix, type Cell } from '../../src/sim/prober.ts';
import { forgetProbeFlows } from './conntrack.ts';

/** Polls `fn` until `good` holds of its result; throws with the last result or error. */
export async function eventually<T>(what: string, fn: () => Promise<T>, good: (v: T) => boolean, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: T | undefined;
  let err: unknown;
  while (Date.now() < deadline) {
    try {
      last = await fn();
      if (good(last)) return last;
    } catch (e) {
      err = e;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`${what}: not reached; last ${JSON.stringify(last)?.slice(0, 1500)} ${err ? String(err) : ''}`);
}

/** Probes the full truth table until it matches, and throws with the last diff and the
 *  agents' errors otherwise. */
export async function expectConverged(cluster: Cluster, allowed: (c: Cell) => boolean, what: string, agentErrors: () => string[], timeoutMs = 10_000): Promise<Matrix> {
  const expected = expectMatrix(cluster, {}, allowed);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await forgetProbeFlows(cluster);
    const actual = await probeMatrix(cluster);
    const diff = diffMatrix(expected, actual);
    if (diff.length === 0) return actual;
    if (Date.now() > deadline) {
      throw new Error(
        `${what}: ${diff.length} cells differ:\n  ${diff.slice(0, 30).join('\n  ')}\n\nexpected:\n${renderMatrix(expected)}\n\nactual:\n${renderMatrix(actual)}\n\nagent errors:\n${agentErrors().join('\n') || 'none'}`,
      );
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Retries `check` (which throws until it holds) every `everyMs` until it passes; after
 *  `timeoutMs`, its last failure is thrown. */
export async function untilPasses(check: () => void | Promise<void>, timeoutMs = 5_000, everyMs = 10): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, everyMs));
    }
  }
}
