// What the scale benches (agent-scale, controller-scale) print around their figures: the
// machine and source they ran on, section headers that flag load, and readings of a Prometheus
// text exposition.

import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { loadAverage } from './populate-cluster.ts';

const REPO = fileURLToPath(new URL('../', import.meta.url));

export const log = (s = ''): void => console.log(s);
export const mb = (x: number | undefined): string => (x === undefined || Number.isNaN(x) ? '-' : `${x.toFixed(0)} MB`);
/** An environment variable's space-separated words (extra flags). */
export const words = (v: string | undefined): string[] => (v ?? '').split(' ').filter((f) => f !== '');

/** Printed before every section: above 1 the figures were taken under load. */
export function section(title: string): void {
  const load = loadAverage();
  log(`\n== ${title}  (load average ${load.toFixed(2)}${load > 1 ? ': UNDER LOAD, figures of this section were taken while other work shared the cores' : ''})`);
}

/** Cores, memory, kernel, Node and load; with `iptables`, its version too (the agent's tool). */
export function machine(o: { iptables?: boolean } = {}): string {
  const nproc = spawnSync('nproc', { encoding: 'utf8' }).stdout.trim();
  const kernel = spawnSync('uname', ['-r'], { encoding: 'utf8' }).stdout.trim();
  const ipt = o.iptables ? `, ${spawnSync('iptables', ['--version'], { encoding: 'utf8' }).stdout.trim()}` : '';
  const mem = /MemTotal:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1];
  const load = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  return `${nproc} cores, ${Math.round(Number(mem) / 1024 / 1024)} GB RAM, kernel ${kernel}${ipt}, node ${process.version}, load average ${load}`;
}

/** The commit, and how many files of src/ differ from it (`how`: built or run as they were). */
export function sourceState(how: 'built' | 'run'): string {
  const git = (args: string[]) => spawnSync('git', ['-C', REPO, ...args], { encoding: 'utf8' }).stdout.trim();
  const dirty = git(['status', '--porcelain', '--', 'src', 'scripts/build.ts']).split('\n').filter(Boolean).length;
  return `commit ${git(['rev-parse', '--short', 'HEAD'])}${dirty > 0 ? ` + ${dirty} uncommitted file(s) in src/ (${how} as they were)` : ''}`;
}

/** A gauge or counter of a Prometheus text exposition, summed over the series that pass `filter`. */
export function metric(text: string, name: string, filter: (labels: string) => boolean = () => true): number | undefined {
  let v: number | undefined;
  for (const line of text.split('\n')) {
    const m = /^(\w+)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (m && m[1] === name && filter(m[2] ?? '')) v = (v ?? 0) + Number(m[3]);
  }
  return v;
}

/** What V8 holds, beside RSS, from the metrics named `prefix`nodejs_*: a gap between them is
 *  memory the heap no longer uses that the process has not returned, or buffers outside the heap. */
export function heap(text: string, prefix: string): string {
  const g = (name: string) => {
    const v = metric(text, `${prefix}nodejs_${name}`);
    return v === undefined ? '-' : (v / 2 ** 20).toFixed(0);
  };
  return `V8 heap used ${g('heap_size_used_bytes')} of ${g('heap_size_total_bytes')} MB, external ${g('external_memory_bytes')} MB`;
}
