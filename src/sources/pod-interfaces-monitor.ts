// A watcher of the node's links (`ip -o monitor link`): it tells withPodInterfaces when a pod's
// bridge port comes, goes, joins the bridge or changes carrier, so a scan follows at once.

import type { CommandRunner } from '../exec/runner.ts';

/** What a link monitor tells withPodInterfaces. */
export interface LinkMonitorHandlers {
  /** The monitor listens: every link change from now on is told. */
  ready(): void;
  /** One or more links changed (or changes may have been lost): scan again. */
  change(): void;
  /** The monitor ended or could not start. Called at most once, never after close(). */
  exit(reason: string): void;
}

export interface LinkMonitorStream {
  /** Ends the monitor and waits until its process is gone. */
  close(): Promise<void>;
}

/** Starts one watcher of the links in the scans' network namespace per open(); restarts are
 *  the caller's (withPodInterfaces). */
export interface LinkMonitor {
  open(handlers: LinkMonitorHandlers): LinkMonitorStream;
}

const STDERR_KEEP = 2048;

/**
 * `ip -o monitor link`, started through `runner` so it watches the namespace the scans read
 * (`netnsRunner` wraps it in `ip netns exec`, which execs, so close() ends ip itself). A line on
 * stderr (`netlink receive error`: the socket overran) means events were lost: it counts as a
 * change.
 */
export function createLinkMonitor(runner: CommandRunner, opts: { readonly killAfterMs?: number } = {}): LinkMonitor {
  const args = ['-o', 'monitor', 'link'];
  return {
    open(h) {
      let closed = false;
      const child = runner.spawn('ip', args, { killAfterMs: opts.killAfterMs });
      let stderr = '';
      // A pid means the process runs; ip subscribes to link events right after it starts, and
      // the scan that ready() asks for comes a debounce later.
      if (child.pid !== undefined) queueMicrotask(() => !closed && h.ready());
      child.stdout?.on('data', () => {
        if (!closed) h.change();
      });
      child.stderr?.on('data', (chunk: Buffer) => {
        stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP);
        if (!closed) h.change();
      });
      const ended = child.ended.then((why) => {
        if (!closed) h.exit(`ip ${args.join(' ')} ${why}${stderr.trim() === '' ? '' : `: ${stderr.trim().split('\n').at(-1)}`}`);
        closed = true;
      });
      return {
        async close() {
          closed = true;
          child.kill();
          await ended;
        },
      };
    },
  };
}
