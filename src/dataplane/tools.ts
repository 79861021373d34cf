// The iptables and ipset tools a dataplane writes with. The iptables backend is chosen on first
// use, not at construction: `auto` reads the kernel, and a dataplane is built before the agent
// may touch it.

import type { Logger } from '../log.ts';
import type { CommandRunner } from '../exec/runner.ts';
import { createIpset, type Ipset } from './ipset.ts';
import { createIptables, detectBackend, type Backend, type BackendChoice, type Iptables, type RetryInfo, type RetryPolicy } from './iptables.ts';

export interface Tools {
  readonly iptables: Iptables;
  readonly ipset: Ipset;
}

export interface ToolsConfig {
  readonly runner: CommandRunner;
  readonly backend: BackendChoice;
  readonly log: Logger;
  readonly lockRetry?: RetryPolicy;
  readonly sleep?: (ms: number) => Promise<void>;
  readonly onRetry?: (info: RetryInfo) => void;
}

export interface Toolbox {
  /** The tools, choosing the backend on the first call. */
  get(): Promise<Tools>;
  /** The backend chosen, or undefined before the first get() finished. */
  backend(): Backend | undefined;
}

export function lazyTools(config: ToolsConfig): Toolbox {
  let tools: Tools | undefined;
  return {
    async get() {
      if (tools === undefined) {
        const backend = await detectBackend(config.runner, config.backend, config.log);
        tools = {
          iptables: createIptables({ runner: config.runner, backend, log: config.log, retry: config.lockRetry, sleep: config.sleep, onRetry: config.onRetry }),
          ipset: createIpset(config.runner),
        };
      }
      return tools;
    },
    backend: () => tools?.iptables.backend,
  };
}
