// Reading a simulated node's netfilter state and a pod's sockets for the Services tests:
// which rules kube-proxy and Weir hold, in which order, and which peer address a pod saw.

import { execa } from 'execa';
import type { Family } from '../../src/model/types.ts';
import type { IptablesBackend } from './kube-proxy.ts';

const SAVE: Readonly<Record<Family, string>> = { 4: 'iptables', 6: 'ip6tables' };

export async function iptablesSave(netns: string, backend: IptablesBackend, family: Family, table?: string): Promise<string> {
  const args = ['netns', 'exec', netns, `${SAVE[family]}-${backend}-save`, ...(table ? ['-t', table] : [])];
  return (await execa('ip', args)).stdout;
}

/** The rule specs of one chain of a save, in order (text after `-A CHAIN `). */
export function chainRules(save: string, table: string, chain: string): string[] {
  const out: string[] = [];
  let inTable = false;
  for (const line of save.split('\n')) {
    if (line.startsWith('*')) inTable = line === `*${table}`;
    else if (inTable && line.startsWith(`-A ${chain} `)) out.push(line.slice(chain.length + 4));
  }
  return out;
}

/** Every line of a save that belongs to kube-proxy (its chains, declarations and jumps), per
 *  table, without packet counters: what Weir must never change. */
export function kubeLines(save: string): string[] {
  const out: string[] = [];
  let table = '';
  for (const line of save.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1);
    else if (/KUBE-/.test(line)) out.push(`${table} ${line.replace(/ \[\d+:\d+\]$/, '')}`);
  }
  return out;
}

/** kube-proxy's nftables table of a family (nftables mode), without counters; '' if absent. */
export async function kubeProxyTable(netns: string, family: Family): Promise<string> {
  const r = await execa('ip', ['netns', 'exec', netns, 'nft', 'list', 'table', family === 4 ? 'ip' : 'ip6', 'kube-proxy'], { reject: false });
  return r.exitCode === 0 ? r.stdout.replace(/counter packets \d+ bytes \d+/g, 'counter') : '';
}

/** Position (0-based) of Weir's hook in a builtin chain's rules, or -1. */
export function hookIndex(rules: readonly string[]): number {
  return rules.findIndex((r) => r.includes('--comment "weir:hook"') || r.includes('--comment weir:hook'));
}

/** Peers of a pod's server sockets in TIME-WAIT (the server closes first, so every finished
 *  probe leaves one), as "address port"; IPv4-mapped IPv6 shown as IPv4. */
export async function timeWaitPeers(podNetns: string): Promise<Set<string>> {
  const out = (await execa('ip', ['netns', 'exec', podNetns, 'ss', '-Htn', 'state', 'time-wait'])).stdout;
  const peers = new Set<string>();
  for (const line of out.split('\n')) {
    const cols = line.trim().split(/\s+/);
    const peer = cols[cols.length - 1];
    const m = /^\[?(.*?)\]?:(\d+)$/.exec(peer ?? '');
    if (m) peers.add(`${m[1].replace(/^::ffff:/, '')} ${m[2]}`);
  }
  return peers;
}
