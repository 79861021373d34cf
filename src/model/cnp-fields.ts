// The readers of a ClusterNetworkPolicy spec's smaller shapes, checked as the CRD checks them:
// its bounds, one-of objects, bounded lists, and the protocols and ports a rule matches.

import { checkKnownFields, describeValue, exact, isPlainObject } from './selector.ts';
import type { PolicyError, PortMatch, Protocol } from './types.ts';

/** nodes and domainNames are the experimental channel's: known, so refused by name. */
export const EXPERIMENTAL_PEERS: ReadonlySet<string> = new Set(['nodes', 'domainNames']);
const PROTOCOL_FIELDS = ['tcp', 'udp', 'sctp', 'destinationNamedPort'] as const;
const PROTOCOL_KEYS: Readonly<Record<string, Protocol>> = { tcp: 'TCP', udp: 'UDP', sctp: 'SCTP' };
const PROTOCOL_MATCH_FIELDS = ['destinationPort'] as const;
const PORT_FIELDS = ['number', 'range'] as const;
const RANGE_FIELDS = ['start', 'end'] as const;
/** A destinationNamedPort names no protocol: it is the container port of that name, whatever
 *  its protocol, so it stands for one named-port match per protocol. */
const NAMED_PORT_PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

/** The CRD's bounds (its maxItems, maxLength, minimum and maximum), enforced here too so that a
 *  manifest cannot exceed what the API server admits. They also bound what one policy costs. */
export const CNP_LIMITS = {
  /** Rules per direction. */
  rules: 25,
  /** from/to peers per rule. */
  peers: 25,
  /** CIDRs per networks peer. */
  networks: 25,
  /** protocols entries per rule. */
  protocols: 25,
  /** Characters of a rule name. */
  ruleName: 100,
  /** Characters of a networks CIDR. */
  cidr: 43,
  priority: 1000,
} as const;

/** Exactly one of `fields` set (null counts as absent): the CRD's minProperties/maxProperties 1.
 *  Returns the one set, or null after reporting. */
export function exactlyOne(obj: Record<string, unknown>, path: string, fields: readonly string[], errors: PolicyError[]): string | null {
  const set = fields.filter((f) => obj[f] !== undefined && obj[f] !== null);
  if (set.length === 1) return set[0];
  const list = fields.filter((f) => !EXPERIMENTAL_PEERS.has(f)).join(', ');
  errors.push({ path, message: set.length === 0 ? `must set one of ${list}` : `must set exactly one of ${list}, got ${set.join(' and ')}` });
  return null;
}

export function isInteger(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v);
}

/** A list of at most `max` items (reported at the first one past it); null when absent. */
export function readList(raw: unknown, path: string, what: string, max: number, errors: PolicyError[]): readonly unknown[] | null {
  if (raw === undefined || raw === null) return null;
  if (!Array.isArray(raw)) {
    errors.push({ path, message: `must be a list of ${what}, got ${describeValue(raw)}` });
    return null;
  }
  if (raw.length > max) errors.push({ path: `${path}[${max}]`, message: `more than ${max} ${what}; the API allows at most ${max}` });
  return raw;
}

export function compileProtocols(raw: unknown, path: string, errors: PolicyError[]): PortMatch[] | null {
  const list = readList(raw, path, 'protocols', CNP_LIMITS.protocols, errors);
  if (list === null) return null;
  if (list.length === 0) {
    errors.push({ path, message: 'must hold at least one entry; leave it out to match every protocol and port' });
    return null;
  }
  const ports: PortMatch[] = [];
  for (let i = 0; i < list.length; i++) ports.push(...compileProtocol(list[i], `${path}[${i}]`, errors));
  return exact(ports);
}

function compileProtocol(raw: unknown, path: string, errors: PolicyError[]): PortMatch[] {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with one of ${PROTOCOL_FIELDS.join(', ')}, got ${describeValue(raw)}` });
    return [];
  }
  const before = errors.length;
  checkKnownFields(raw, path, PROTOCOL_FIELDS, errors);
  const which = exactlyOne(raw, path, PROTOCOL_FIELDS, errors);
  const out: PortMatch[] = [];
  for (const key of Object.keys(PROTOCOL_KEYS)) {
    if (raw[key] === undefined || raw[key] === null) continue;
    const port = compileDestinationPort(raw[key], `${path}.${key}`, PROTOCOL_KEYS[key], errors);
    if (port !== null) out.push(port);
  }
  const named = raw.destinationNamedPort;
  if (named !== undefined && named !== null) {
    if (typeof named !== 'string') errors.push({ path: `${path}.destinationNamedPort`, message: `must be a string, got ${describeValue(named)}` });
    else if (named === '') errors.push({ path: `${path}.destinationNamedPort`, message: 'must not be empty' });
    // Any name the API admits: one that no container port can have matches nothing.
    else for (const protocol of NAMED_PORT_PROTOCOLS) out.push({ protocol, name: named });
  }
  return errors.length > before || which === null ? [] : out;
}

/** `tcp: {destinationPort: {number} | {range: {start, end}}}` (and udp, sctp alike). */
function compileDestinationPort(raw: unknown, path: string, protocol: Protocol, errors: PolicyError[]): PortMatch | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with destinationPort, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, PROTOCOL_MATCH_FIELDS, errors);
  const dp = raw.destinationPort;
  const dpPath = `${path}.destinationPort`;
  if (dp === undefined || dp === null) {
    errors.push({ path: dpPath, message: `required; to match every ${protocol} port, leave protocols out or list the range 1 to 65535` });
    return null;
  }
  if (!isPlainObject(dp)) {
    errors.push({ path: dpPath, message: `must be an object with number or range, got ${describeValue(dp)}` });
    return null;
  }
  checkKnownFields(dp, dpPath, PORT_FIELDS, errors);
  const which = exactlyOne(dp, dpPath, PORT_FIELDS, errors);
  let port: PortMatch | null = null;
  if (dp.number !== undefined && dp.number !== null) {
    const n = portNumber(dp.number, `${dpPath}.number`, errors);
    if (n !== null) port = { protocol, port: n };
  }
  if (dp.range !== undefined && dp.range !== null) port = readRange(dp.range, `${dpPath}.range`, protocol, errors);
  return errors.length > before || which === null ? null : port;
}

function readRange(raw: unknown, path: string, protocol: Protocol, errors: PolicyError[]): PortMatch | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with start and end, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, RANGE_FIELDS, errors);
  const bound = (field: 'start' | 'end'): number | null => {
    const v = raw[field];
    if (v === undefined || v === null) {
      errors.push({ path: `${path}.${field}`, message: 'required' });
      return null;
    }
    return portNumber(v, `${path}.${field}`, errors);
  };
  const start = bound('start');
  const end = bound('end');
  // The CRD's CEL rule: a range of one port is written as a number.
  if (start !== null && end !== null && start >= end) errors.push({ path, message: `start (${start}) must be less than end (${end})` });
  return errors.length > before || start === null || end === null ? null : { protocol, port: start, endPort: end };
}

function portNumber(v: unknown, path: string, errors: PolicyError[]): number | null {
  if (isInteger(v) && v >= 1 && v <= 65535) return v;
  errors.push({ path, message: `must be a port number from 1 to 65535, got ${describeValue(v)}` });
  return null;
}
