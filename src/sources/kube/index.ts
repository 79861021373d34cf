// Public surface of the kube source.

export { createKubeSource } from './source.ts';
export type { KubeSourceOptions } from './source.ts';
export type { WatchEvent, WatchTransition } from './reflector.ts';
export { backoffDelay, DEFAULT_KUBE_TIMINGS } from './timings.ts';
export type { KubeTimings } from './timings.ts';
