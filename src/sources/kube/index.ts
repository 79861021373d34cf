// Public surface of the kube source.

export { createKubeSource } from './source.ts';
export type { KubeSourceOptions, SourceWatchEvent as WatchEvent } from './source.ts';
export type { WatchTransition } from '../../kube/reflector.ts';
export { DEFAULT_KUBE_TIMINGS } from './timings.ts';
export type { KubeTimings } from './timings.ts';
