// Public surface of the dataplane stage: the factory, the runner seam and their types.

export {
  createDataplane,
  DEFAULT_MAX_SET_SIZE,
  type ApplyStats,
  type ApplyStep,
  type CleanupStats,
  type Dataplane,
  type DataplaneConfig,
  type DataplaneMetricHooks,
  type DataplaneStatus,
  type MemberRead,
  type ResyncOptions,
} from './dataplane.ts';
export { DEFAULT_LOCK_RETRY, type Backend, type BackendChoice, type RetryInfo, type RetryPolicy } from './iptables.ts';
export { IPVS_INTERFACE, type IpvsChoice } from './ipvs.ts';
export {
  DEFAULT_COMMAND_TIMEOUT_MS,
  processRunner,
  netnsRunner,
  recordingRunner,
  type CommandRunner,
  type RecordedCall,
  type RecordingRunner,
  type RunOptions,
  type RunResult,
} from '../exec/runner.ts';
