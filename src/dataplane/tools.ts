// The iptables and ipset tools a dataplane writes with. The iptables backend is chosen on first
// use, not at construction: `auto` reads the kernel, and a dataplane is built before the agent
// may touch it.

import { createIpset, type Ipset } from './ipset.ts';
import { createIptables, detectBackend, type Backend, type BackendChoice, type Iptables, type IptablesOptions } from './iptables.ts';

export interface Tools {
  readonly iptables: Iptables;
  readonly ipset: Ipset;
}

/** What iptables is built with, but the backend may be `auto`: chosen on first use. */
export type ToolsConfig = Omit<IptablesOptions, 'backend'> & { readonly backend: BackendChoice };

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
          iptables: createIptables({ ...config, backend }),
          ipset: createIpset(config.runner),
        };
      }
      return tools;
    },
    backend: () => tools?.iptables.backend,
  };
}
