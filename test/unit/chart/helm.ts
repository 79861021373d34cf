// The chart's unit tests' helm: the real binary from scripts/helm.sh (built once, cached), and
// `helm template` parsed into objects, as test/integration/helm-chart.test.ts renders it.

import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { ok, type Run, run } from '../../support/run.ts';

export const REPO = fileURLToPath(new URL('../../../', import.meta.url));
export const CHART = join(REPO, 'charts/weir');

// biome-ignore lint/suspicious/noExplicitAny: rendered Kubernetes objects of every kind
export type Obj = Record<string, any>;

let helmPath: Promise<string> | undefined;

/** Runs helm (built first when not cached); resolves whatever its exit status. */
export async function helm(args: readonly string[]): Promise<Run> {
  helmPath ??= run(join(REPO, 'scripts/helm.sh'), ['build'], { passStderr: true }).then((r) => ok('scripts/helm.sh build', r).trim());
  return run(await helmPath, args);
}

/** `helm template weir charts/weir -n kube-system ARGS`, one object per document. */
export async function render(args: readonly string[] = []): Promise<Obj[]> {
  const out = ok(`helm template ${args.join(' ')}`, await helm(['template', 'weir', CHART, '--namespace', 'kube-system', ...args]));
  return (loadAll(out) as (Obj | null)[]).filter((d): d is Obj => d !== null && typeof d === 'object');
}

export const find = (docs: readonly Obj[], kind: string, name?: string): Obj | undefined => docs.find((d) => d.kind === kind && (name === undefined || d.metadata.name === name));
