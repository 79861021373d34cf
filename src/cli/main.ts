#!/usr/bin/env node
// The weir command: agent, controller, render, explain, cleanup, uninstall, demo.

import { hostname } from 'node:os';
import v8 from 'node:v8';
import { startAgent } from '../agent/agent.ts';
import { startController } from '../controller/controller.ts';
import { makeNames } from '../calc/index.ts';
import { createDataplane, processRunner } from '../dataplane/index.ts';
import { ConfigError, WeirError } from '../errors.ts';
import { createLogger } from '../log.ts';
import { parse, toConfig, toControllerConfig, toUninstallConfig, usage } from './flags.ts';
import { runUninstall } from '../lifecycle/uninstall.ts';
import { loadKubeConfig } from '../kube/kubeconfig.ts';
import { AFTER_START_V8_FLAGS } from './node-flags.ts';
import { formatRendered, render } from './render.ts';
import { waitForSignal } from './signals.ts';

async function main(argv: readonly string[]): Promise<number> {
  // explain has flags of its own (--port, -o) that the other commands' parser refuses.
  if (argv[0] === 'explain') return (await import('./explain.ts')).runExplain(argv.slice(1), process.env);
  const { command, values } = parse(argv, process.env);
  if (values.help || command === undefined || command === 'help') {
    console.log(usage());
    return command === undefined && !values.help ? 2 : 0;
  }
  switch (command) {
    case 'agent': {
      const cfg = toConfig(values, { nodeName: true, manifestsDir: false });
      const log = createLogger(cfg.logLevel);
      const agent = await startAgent(cfg, {
        log,
        onFirstWrite: cfg.favourMemory
          ? () => {
              v8.setFlagsFromString(AFTER_START_V8_FLAGS);
              log.info({ flags: AFTER_START_V8_FLAGS }, 'first full state written; V8 now favours memory (--favour-memory)');
            }
          : undefined,
      });
      const restart = await Promise.race([waitForSignal().then(() => null), agent.exitRequested]);
      log.info(restart ?? 'stopping');
      await agent.stop();
      return restart === null ? 0 : 1;
    }
    case 'controller': {
      const cfg = toControllerConfig(values, hostname());
      const log = createLogger(cfg.logLevel);
      const controller = await startController(cfg, { log });
      const restart = await Promise.race([waitForSignal().then(() => null), controller.exitRequested]);
      log.info(restart ?? 'stopping');
      await controller.stop();
      return restart === null ? 0 : 1;
    }
    case 'render': {
      const cfg = toConfig(values, { nodeName: true, manifestsDir: true });
      const log = createLogger(values['log-level'] === undefined ? 'warn' : cfg.logLevel);
      process.stdout.write(formatRendered(await render(cfg, log)));
      return 0;
    }
    case 'cleanup': {
      const cfg = toConfig(values, { nodeName: false, manifestsDir: false });
      const log = createLogger(cfg.logLevel);
      const dp = createDataplane({ runner: processRunner(), names: makeNames(cfg.chainPrefix), families: cfg.families, backend: cfg.backend, log });
      const stats = await dp.cleanup();
      log.info(stats, 'removed everything Weir owned');
      return 0;
    }
    case 'uninstall': {
      const cfg = toUninstallConfig(values);
      const log = createLogger(cfg.logLevel);
      const report = await runUninstall(loadKubeConfig(cfg.kubeconfig), cfg, log);
      // Exit 0 even with nodes unconfirmed: they are named above, and a failed hook would hold
      // the release (and its other, already open, nodes) in place.
      log.info({ token: report.token, removed: report.removed.length, unconfirmed: report.unconfirmed.map((u) => u.node) }, 'uninstall hook done');
      return 0;
    }
    case 'demo': {
      const { runDemo } = await import('../demo/demo.ts');
      return runDemo(values);
    }
    default:
      throw new ConfigError([`unknown command "${command}"; expected agent, controller, render, explain, cleanup, uninstall or demo`]);
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof WeirError) {
      console.error(`weir: ${err.message}`);
      if (err.cause) console.error(`  caused by: ${err.cause instanceof Error ? err.cause.message : String(err.cause)}`);
      process.exit(err instanceof ConfigError ? 2 : 1);
    }
    console.error(err);
    process.exit(1);
  },
);
