// The audit log's public surface: one factory and its types. The stages (pcap, reader,
// addresses, dedupe, writer, metrics) are separate modules, tested on their own.

export { AUDIT_LINE_VERSION, type AuditLine, type AuditLog, type AuditLogConfig, type AuditLogDeps, type AuditStats, createAuditLog, type Endpoint } from './pipeline.ts';
export type { LostWhere } from './metrics.ts';
export type { ReaderState } from './reader.ts';
