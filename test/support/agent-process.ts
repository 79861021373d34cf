// A real `weir agent` (or `weir controller`) process inside a node's network namespace, run as
// on the node's host network: a LoggedProcess (logged-process.ts) started with the image's
// Node flags.

import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.ts';
import { LoggedProcess } from './logged-process.ts';

export type { LogRecord } from './logged-process.ts';

const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

export class AgentProcess extends LoggedProcess {
  /** `weir agent --node-name NODE ARGS`, or with `command` another command of the CLI
   *  (`controller`), run in that node's namespace as on its host network. */
  constructor(node: string, netns: string, args: readonly string[], command: readonly string[] = ['agent', '--node-name', node]) {
    super(node, {
      label: `${command[0]} on ${node}`,
      command: 'ip',
      // With the image's Node flags, so memory figures are the product's.
      args: ['netns', 'exec', netns, process.execPath, ...NODE_FLAGS, MAIN, ...command, ...args],
      graceMs: 3000,
    });
  }
}
