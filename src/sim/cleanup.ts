// Last-chance cleanup of simulated clusters when the process ends without destroy(): normal
// exit, Ctrl-C (SIGINT), SIGTERM or SIGHUP. Cleanups are synchronous because 'exit' handlers
// cannot wait. After a signal we re-raise it once our handlers are gone, so the process ends
// exactly as it would have without us; a program with its own handler keeps control instead.

type Cleanup = () => void;

const SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
const cleanups = new Set<Cleanup>();
let installed = false;

function runAll(): void {
  for (const fn of [...cleanups]) {
    cleanups.delete(fn);
    try {
      fn();
    } catch (err) {
      process.stderr.write(`cleanup failed: ${String(err)}\n`);
    }
  }
}

function onSignal(signal: NodeJS.Signals): void {
  runAll();
  uninstall();
  if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
}

function install(): void {
  if (installed) return;
  installed = true;
  process.on('exit', runAll);
  for (const s of SIGNALS) process.on(s, onSignal);
}

function uninstall(): void {
  if (!installed) return;
  installed = false;
  process.off('exit', runAll);
  for (const s of SIGNALS) process.off(s, onSignal);
}

/** Runs `fn` once if the process exits or is signalled first; call the result to unregister.
 *  While any cleanup is registered, SIGINT/SIGTERM/SIGHUP run the cleanups and then end the
 *  process with the same signal (unless the program listens for it too). */
export function registerExitCleanup(fn: Cleanup): () => void {
  cleanups.add(fn);
  install();
  return () => {
    cleanups.delete(fn);
    if (cleanups.size === 0) uninstall();
  };
}
