// A small typed wrapper around iptables-restore / iptables-save for the mangle and filter
// tables (Weir's chains, and its one filter rule): picks
// the backend binaries, retries transient xtables-lock failures, and parses save output just
// enough to find chains, rules and comments.

import { backoffMs } from '../backoff.ts';
import { CommandError, RestoreError, XtablesLockError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { Family } from '../model/types.ts';
import type { CommandRunner } from '../exec/runner.ts';

export type Backend = 'nft' | 'legacy';
export type BackendChoice = Backend | 'auto';

/** What a restore does when another program holds the xtables lock (legacy backend). */
export interface RetryPolicy {
  /** Retries after the first attempt... */
  readonly attempts: number;
  /** ...waiting this long before the first, doubling (the shared backoff)... */
  readonly delayMs: number;
  /** ...up to this (default 5 s). */
  readonly maxDelayMs?: number;
  /** How long one attempt waits for the lock (`--wait=N`, whole seconds, default 5, as
   *  kube-proxy). A bare `--wait` waits forever: a stuck holder would hang the loop unseen. */
  readonly waitSeconds?: number;
}
export const DEFAULT_LOCK_RETRY: RetryPolicy = { attempts: 3, delayMs: 200 };
export const DEFAULT_LOCK_WAIT_SECONDS = 5;
const DEFAULT_LOCK_MAX_DELAY_MS = 5_000;

export interface RetryInfo {
  readonly tool: string;
  readonly family: Family | undefined;
  /** 1 for the first retry. */
  readonly attempt: number;
  readonly delayMs: number;
}

export function tool(backend: Backend, family: Family, op?: 'save' | 'restore'): string {
  return `${family === 4 ? 'iptables' : 'ip6tables'}-${backend}${op === undefined ? '' : `-${op}`}`;
}

/** Another process holds the xtables lock (legacy backend), or the kernel asked us to retry. */
export function isTransient(exitCode: number, stderr: string): boolean {
  return /xtables lock/i.test(stderr) || (exitCode === 4 && /temporarily unavailable/i.test(stderr));
}

export interface Iptables {
  readonly backend: Backend;
  /** Applies a payload (mangle, then filter) with `--noflush`; throws RestoreError, or
   *  XtablesLockError when the lock stayed held through every retry. */
  restore(family: Family, payload: string): Promise<void>;
  /** `iptables-save -t mangle` then `-t filter` output, concatenated; throws CommandError
   *  (WEIR_KERNEL_READ_FAILED). */
  save(family: Family): Promise<string>;
  /** The rule specs of one chain (`iptables -t <table> -S <chain>`, without `-A <chain> `), in
   *  order. Far cheaper than save on nft, which translates every rule of every table it reads.
   *  A read beside the loop (the hook check), so started off the event loop's thread; throws
   *  CommandError (WEIR_KERNEL_READ_FAILED), also when the chain does not exist. */
  listChain(family: Family, table: string, chain: string): Promise<string[]>;
}

export interface IptablesOptions {
  readonly runner: CommandRunner;
  readonly backend: Backend;
  readonly log: Logger;
  readonly retry?: RetryPolicy;
  readonly sleep?: (ms: number) => Promise<void>;
  readonly onRetry?: (info: RetryInfo) => void;
}

/** The tables Weir reads: its chains' (mangle) and its one rule's (filter). */
export const SAVED_TABLES = ['mangle', 'filter'] as const;

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export function createIptables(opts: IptablesOptions): Iptables {
  const retry = opts.retry ?? DEFAULT_LOCK_RETRY;
  const backoff = { initialMs: retry.delayMs, maxMs: retry.maxDelayMs ?? DEFAULT_LOCK_MAX_DELAY_MS };
  // Legacy listing takes the xtables lock too; nft ignores the flag.
  const waitArg = `--wait=${Math.max(1, Math.ceil(retry.waitSeconds ?? DEFAULT_LOCK_WAIT_SECONDS))}`;
  const restoreArgs = ['--noflush', waitArg];
  const wait = opts.sleep ?? sleep;
  return {
    backend: opts.backend,
    async restore(family, payload) {
      const cmd = tool(opts.backend, family, 'restore');
      for (let attempt = 1; ; attempt++) {
        const r = await opts.runner.run(cmd, restoreArgs, { input: payload });
        if (r.exitCode === 0) return;
        if (!isTransient(r.exitCode, r.stderr)) throw new RestoreError(cmd, family, r.stderr, payload);
        if (attempt > retry.attempts) throw new XtablesLockError(cmd, family, attempt, r.stderr);
        const delayMs = backoffMs(attempt, backoff);
        opts.log.warn({ cmd, family, attempt, of: retry.attempts, delayMs, stderr: r.stderr.trim() }, 'xtables lock busy, retrying');
        opts.onRetry?.({ tool: cmd, family, attempt, delayMs });
        await wait(delayMs);
      }
    },
    async save(family) {
      const cmd = tool(opts.backend, family, 'save');
      // Two tables, not all: nat can hold kube-proxy's many Service rules, and printing them
      // costs (nft still fetches every table: the hook check lists single chains instead).
      let out = '';
      for (const table of SAVED_TABLES) {
        const args = ['-t', table];
        const r = await opts.runner.run(cmd, args);
        if (r.exitCode !== 0) throw new CommandError('WEIR_KERNEL_READ_FAILED', cmd, args, r.exitCode, r.stderr);
        out += r.stdout.endsWith('\n') || r.stdout === '' ? r.stdout : `${r.stdout}\n`;
      }
      return out;
    },
    async listChain(family, table, chain) {
      const cmd = tool(opts.backend, family);
      const args = ['-t', table, '-S', chain, waitArg];
      const r = await opts.runner.run(cmd, args);
      if (r.exitCode !== 0) throw new CommandError('WEIR_KERNEL_READ_FAILED', cmd, args, r.exitCode, r.stderr);
      // `-S` prints `-P` and `-A` lines as save does, without the table header.
      return parseSave(`*${table}\n${r.stdout}`, table).get(chain) ?? [];
    },
  };
}

// ---- Backend detection --------------------------------------------------------------------

/** Chains kubelet/kube-proxy create in the mangle table of whichever backend the node uses. */
const HINT_CHAINS = /^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) /m;

interface BackendView {
  readonly available: boolean;
  readonly hinted: boolean;
  readonly rules: number;
}

async function viewBackend(runner: CommandRunner, backend: Backend): Promise<BackendView> {
  let available = false;
  let text = '';
  for (const family of [4, 6] as const) {
    try {
      const r = await runner.run(tool(backend, family, 'save'), []);
      available = true;
      if (r.exitCode === 0) text += r.stdout;
    } catch (err) {
      if (!(err instanceof CommandError && err.code === 'WEIR_COMMAND_MISSING')) throw err;
    }
  }
  return { available, hinted: hintedInMangle(text), rules: text.split('\n').filter((l) => l.startsWith('-A ')).length };
}

/** True if a hint chain is declared inside a `*mangle` section of save output. */
export function hintedInMangle(saveText: string): boolean {
  for (const section of saveText.split(/^\*/m)) {
    if (section.startsWith('mangle\n') && HINT_CHAINS.test(section)) return true;
  }
  return false;
}

/**
 * Chooses the iptables backend the rest of the node uses, the way kube-proxy's wrapper does:
 * the side holding kubelet's hint chains wins, then the side with more rules, then nft.
 */
export async function detectBackend(runner: CommandRunner, choice: BackendChoice, log: Logger): Promise<Backend> {
  if (choice !== 'auto') return choice;
  const nft = await viewBackend(runner, 'nft');
  const legacy = await viewBackend(runner, 'legacy');
  let backend: Backend;
  let reason: string;
  if (!legacy.available || !nft.available) {
    backend = legacy.available ? 'legacy' : 'nft';
    reason = 'only backend installed';
  } else if (nft.hinted !== legacy.hinted) {
    backend = nft.hinted ? 'nft' : 'legacy';
    reason = 'kubelet hint chain';
  } else if (legacy.rules > nft.rules) {
    backend = 'legacy';
    reason = 'more rules';
  } else {
    backend = 'nft';
    reason = nft.rules > legacy.rules ? 'more rules' : 'default';
  }
  log.info({ backend, reason, nftRules: nft.rules, legacyRules: legacy.rules }, 'iptables backend chosen');
  return backend;
}

// ---- iptables-save parsing ----------------------------------------------------------------

/**
 * Chains of one table in save output: name -> rule specs (the text after `-A <chain> `), in
 * kernel order. Every declared chain is present, empty ones too. Anything else is ignored.
 */
export function parseSave(text: string, table: string = 'filter'): Map<string, string[]> {
  const chains = new Map<string, string[]>();
  let inTable = false;
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (line.startsWith('*')) inTable = line.slice(1) === table;
    else if (!inTable || line === '' || line.startsWith('#')) continue;
    else if (line === 'COMMIT') inTable = false;
    else if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0];
      if (!chains.has(name)) chains.set(name, []);
    } else if (line.startsWith('-A ')) {
      const rest = line.slice(3);
      const sp = rest.indexOf(' ');
      const chain = sp < 0 ? rest : rest.slice(0, sp);
      const spec = sp < 0 ? '' : rest.slice(sp + 1);
      let rules = chains.get(chain);
      if (rules === undefined) chains.set(chain, (rules = []));
      rules.push(spec);
    }
  }
  return chains;
}

/** The text of a rule's `--comment`, unquoted, or undefined if it has none. */
export function commentOf(spec: string): string | undefined {
  const m = /(?:^|\s)--comment (?:"((?:[^"\\]|\\.)*)"|(\S+))/.exec(spec);
  if (!m) return undefined;
  return m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2];
}

/** The target of `-j X` / `-g X` in a rule spec. */
export function targetOf(spec: string): string | undefined {
  return /(?:^|\s)-[jg] (\S+)/.exec(spec)?.[1];
}
