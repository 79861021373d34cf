// calc: model events in, the desired dataplane of this node and what changed out. Pure.
export { Calculator } from './calculator.ts';
export type { CalcConfig, PolicyReport } from './config.ts';
export type { MarkBits } from './rules.ts';
export { makeNames, validatePrefix, DEFAULT_PREFIX, MAX_CHAIN_NAME, MAX_SET_NAME } from './names.ts';
export type { Names } from './names.ts';
export { emptyDirty, isDirtyEmpty, mergeDirty } from './desired.ts';
export type * from './desired.ts';
