// Public surface of the sources stage: the Source contract, the manifest source and the
// conversion of Kubernetes objects into model objects that every source shares.

export type { Source, SourceBatch } from './types.ts';
export { createManifestSource, DEFAULT_DEBOUNCE_MS, DEFAULT_POLL_MS } from './manifests/source.ts';
export type { ManifestSourceOptions } from './manifests/source.ts';
export { manifestRevision } from './manifests/merge.ts';
export { toNamespace, toNetworkPolicy, toNode, toPod } from './convert.ts';
export type { ConvertWarning } from './convert.ts';
export { createKubeSource } from './kube/index.ts';
export type { KubeSourceOptions, KubeTimings, WatchEvent } from './kube/index.ts';
