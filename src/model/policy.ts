// NetworkPolicy spec -> CompiledPolicy. The spec is untrusted (manifest mode reads files
// directly), so every field is checked and every error reported with its path; errors the
// source found outside the spec (RawNetworkPolicy.errors) count the same. An invalid policy
// keeps no rules: its pods stay isolated in the directions it names (fail closed).

import { aggregateCidrs, cidrCovers, formatCidr, parseCidr, prefixSet } from './cidr.ts';
import type { Cidr } from './cidr.ts';
import { readPolicyAnnotations } from './annotations.ts';
import { checkKnownFields, describeValue, exact, isPlainObject, matchAllSelector, parseSelector, quote, selectorOrNull } from './selector.ts';
import { Pool } from './pool.ts';
import { PROTOCOLS, policyKey } from './types.ts';
import type { CompiledPolicy, IpBlockPeer, Peer, PolicyError, PolicyRule, PortMatch, Protocol, RawNetworkPolicy, Selector } from './types.ts';

const SPEC_FIELDS = ['podSelector', 'policyTypes', 'ingress', 'egress'] as const;
const INGRESS_RULE_FIELDS = ['from', 'ports'] as const;
const EGRESS_RULE_FIELDS = ['to', 'ports'] as const;
const PEER_FIELDS = ['podSelector', 'namespaceSelector', 'ipBlock'] as const;
const IPBLOCK_FIELDS = ['cidr', 'except'] as const;
const PORT_FIELDS = ['protocol', 'port', 'endPort'] as const;
const PROTOCOL_SET: ReadonlySet<string> = new Set<string>(PROTOCOLS);
const MAX_PORT = 65535;
const MAX_PORT_NAME = 15;

/** Hard limits per policy (docs/design/model.md). Every agent compiles every policy, so what
 *  one policy may cost must be bounded whatever its size: past a limit the policy is invalid,
 *  reported at the path where the limit was crossed, and fails closed like any invalid one.
 *  Counted over every rule of the spec, whether or not policyTypes enforces its direction. */
export const LIMITS = {
  /** cidr and except entries of all ipBlocks: each becomes at most one set member. */
  ipBlockPrefixes: 50_000,
  /** podSelector/namespaceSelector peers: each becomes a set per family. */
  selectorPeers: 1_000,
  /** Rules the policy compiles to: each peer times each port (an empty list counts as one),
   *  summed over its rules; the ipBlocks without except of one rule share a set and count once. */
  rules: 10_000,
  /** Errors listed for one policy; the rest are counted in one last error. */
  errors: 100,
} as const;

/** What the policy has used of each limit so far, in spec order. */
interface Tally {
  prefixes: number;
  selectorPeers: number;
  rules: number;
}

interface Directions {
  readonly ingress: boolean;
  readonly egress: boolean;
}

export function compilePolicy(raw: RawNetworkPolicy): CompiledPolicy {
  // What the source found wrong outside the spec comes first: the policy is then invalid,
  // yet its spec is still read, so it isolates exactly what it would have.
  const errors: PolicyError[] = [...(raw.errors ?? [])];
  const meta = {
    ...readPolicyAnnotations(raw.annotations, errors),
    key: policyKey(raw.namespace, raw.name),
    namespace: raw.namespace,
    name: raw.name,
    uid: raw.uid,
    generation: raw.generation,
  };
  const spec = raw.spec;
  if (!isPlainObject(spec)) {
    errors.push({ path: 'spec', message: `must be an object, got ${describeValue(spec)}` });
    return { ...meta, podSelector: null, ingress: [], egress: [], errors: capPolicyErrors(errors) };
  }
  checkKnownFields(spec, 'spec', SPEC_FIELDS, errors);

  let podSelector: Selector | null = null;
  if (spec.podSelector === undefined || spec.podSelector === null) {
    errors.push({ path: 'spec.podSelector', message: 'required; use {} to select every pod of the namespace' });
  } else {
    const r = parseSelector(spec.podSelector, 'spec.podSelector');
    if ('errors' in r) errors.push(...r.errors);
    else podSelector = r.selector;
  }

  const directions = readDirections(spec, errors);
  // Rules of a direction the policy does not isolate are still validated, as the API server does.
  const tally: Tally = { prefixes: 0, selectorPeers: 0, rules: 0 };
  const ingress = compileRules(spec.ingress, 'spec.ingress', 'from', raw.namespace, tally, errors);
  const egress = compileRules(spec.egress, 'spec.egress', 'to', raw.namespace, tally, errors);

  if (errors.length > 0) {
    return { ...meta, podSelector, ingress: directions.ingress ? [] : null, egress: directions.egress ? [] : null, errors: capPolicyErrors(errors) };
  }
  return {
    ...meta,
    podSelector,
    ingress: directions.ingress ? ingress : null,
    egress: directions.egress ? egress : null,
    errors: [],
  };
}

/**
 * Shares what compiled policies repeat: policies made from one template (a chart's, a team's)
 * have equal pod selectors and rule lists, and a compiled rule list is about 1 KB. At 20k
 * policies of bench/synthetic.ts's shapes: 1,145 -> 431 bytes a policy, pool included.
 */
export class PolicyParts {
  readonly #selectors = new Pool<Selector | null>();
  readonly #rules = new Pool<readonly PolicyRule[] | null>();

  share(p: CompiledPolicy): CompiledPolicy {
    return {
      ...p,
      podSelector: this.#selectors.get(JSON.stringify(p.podSelector), p.podSelector),
      ingress: this.#rules.get(JSON.stringify(p.ingress), p.ingress),
      egress: this.#rules.get(JSON.stringify(p.egress), p.egress),
    };
  }
}

/** The first LIMITS.errors errors, and how many more, counted at the top-level field (spec,
 *  metadata) where the listing stopped: a status or a log line stays readable. */
export function capPolicyErrors(errors: readonly PolicyError[]): readonly PolicyError[] {
  if (errors.length <= LIMITS.errors) return errors;
  const more = errors.length - LIMITS.errors;
  const field = /^[^.[]*/.exec(errors[LIMITS.errors].path)?.[0] || 'spec';
  return [...errors.slice(0, LIMITS.errors), { path: field, message: `${more} more errors not listed (at most ${LIMITS.errors} are)` }];
}

/** policyTypes, or its default: Ingress always, Egress only when spec.egress has rules.
 *  An unreadable policyTypes isolates both directions. */
function readDirections(spec: Record<string, unknown>, errors: PolicyError[]): Directions {
  const types = spec.policyTypes;
  // The API server defaults an empty list like a missing one.
  if (types === undefined || types === null || (Array.isArray(types) && types.length === 0)) {
    const eg = spec.egress;
    // A malformed egress field (not a list) still shows intent to police egress: isolate.
    return { ingress: true, egress: eg !== undefined && eg !== null && !(Array.isArray(eg) && eg.length === 0) };
  }
  if (!Array.isArray(types)) {
    errors.push({ path: 'spec.policyTypes', message: `must be a list of Ingress and/or Egress, got ${describeValue(types)}` });
    return { ingress: true, egress: true };
  }
  let ingress = false;
  let egress = false;
  let readable = true;
  for (let i = 0; i < types.length; i++) {
    const t: unknown = types[i];
    if (t === 'Ingress') ingress = true;
    else if (t === 'Egress') egress = true;
    else {
      errors.push({ path: `spec.policyTypes[${i}]`, message: `unsupported policy type ${describeValue(t)}; expected Ingress or Egress` });
      readable = false;
    }
  }
  return readable ? { ingress, egress } : { ingress: true, egress: true };
}

function compileRules(raw: unknown, path: string, peerField: 'from' | 'to', namespace: string, tally: Tally, errors: PolicyError[]): PolicyRule[] {
  if (raw === undefined || raw === null) return [];
  if (!Array.isArray(raw)) {
    errors.push({ path, message: `must be a list of rules, got ${describeValue(raw)}` });
    return [];
  }
  const fields = peerField === 'from' ? INGRESS_RULE_FIELDS : EGRESS_RULE_FIELDS;
  const rules: PolicyRule[] = [];
  for (let i = 0; i < raw.length; i++) {
    const item: unknown = raw[i];
    const p = `${path}[${i}]`;
    if (!isPlainObject(item)) {
      // The API server would read null as {} (allow all); refuse rather than open traffic.
      errors.push({ path: p, message: `must be an object with ${peerField} and ports, got ${describeValue(item)}` });
      continue;
    }
    checkKnownFields(item, p, fields, errors);
    const peers = compilePeers(item[peerField], `${p}.${peerField}`, namespace, tally, errors);
    const ports = compilePorts(item.ports, `${p}.ports`, errors);
    const before = tally.rules;
    tally.rules += ruleCount(peers) * (ports === null ? 1 : ports.length);
    if (before <= LIMITS.rules && tally.rules > LIMITS.rules) {
      errors.push({
        path: p,
        message: `the policy compiles to more than ${LIMITS.rules} rules (each peer times each port, summed over its rules; ipBlocks without except in one rule count as one peer); Weir accepts at most ${LIMITS.rules}`,
      });
    }
    rules.push({ peers, ports });
  }
  return exact(rules);
}

/** Peer alternatives of one rule as calc builds them: the ipBlocks without except share one. */
function ruleCount(peers: readonly Peer[] | null): number {
  if (peers === null) return 1;
  let n = 0;
  let plain = 0;
  for (const peer of peers) {
    if (peer.kind === 'ipBlock' && peer.except === null) plain = 1;
    else n++;
  }
  return n + plain;
}

// ---- Peers -----------------------------------------------------------------------------

function compilePeers(raw: unknown, path: string, namespace: string, tally: Tally, errors: PolicyError[]): Peer[] | null {
  if (raw === undefined || raw === null) return null;
  if (!Array.isArray(raw)) {
    errors.push({ path, message: `must be a list of peers, got ${describeValue(raw)}` });
    return null;
  }
  if (raw.length === 0) return null;
  const peers: Peer[] = [];
  for (let i = 0; i < raw.length; i++) {
    const peer = compilePeer(raw[i], `${path}[${i}]`, namespace, tally, errors);
    if (peer !== null) peers.push(peer);
  }
  return exact(peers);
}

function compilePeer(raw: unknown, path: string, namespace: string, tally: Tally, errors: PolicyError[]): Peer | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with podSelector, namespaceSelector or ipBlock, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, PEER_FIELDS, errors);
  const hasPods = raw.podSelector !== undefined && raw.podSelector !== null;
  const hasNs = raw.namespaceSelector !== undefined && raw.namespaceSelector !== null;
  const hasIp = raw.ipBlock !== undefined && raw.ipBlock !== null;
  if (hasIp && (hasPods || hasNs)) {
    errors.push({ path, message: 'ipBlock cannot be combined with podSelector or namespaceSelector in one peer; use separate peers' });
  } else if (!hasIp && !hasPods && !hasNs) {
    errors.push({ path, message: 'must specify podSelector, namespaceSelector or ipBlock' });
  } else if (!hasIp && ++tally.selectorPeers === LIMITS.selectorPeers + 1) {
    errors.push({ path, message: `more than ${LIMITS.selectorPeers} podSelector/namespaceSelector peers in one policy; Weir accepts at most ${LIMITS.selectorPeers}` });
  }

  // Parse every part even when the combination is wrong, so that all errors are reported.
  const podSelector = hasPods ? selectorOrNull(raw.podSelector, `${path}.podSelector`, errors) : null;
  const nsSelector = hasNs ? selectorOrNull(raw.namespaceSelector, `${path}.namespaceSelector`, errors) : null;
  const ipBlock = hasIp ? compileIpBlock(raw.ipBlock, `${path}.ipBlock`, tally, errors) : null;
  if (errors.length > before) return null;

  if (ipBlock !== null) return ipBlock;
  const pods = podSelector ?? matchAllSelector();
  if (nsSelector !== null) {
    return { kind: 'pods', key: `pods|nssel=${nsSelector.key}|${pods.key}`, namespace: null, namespaceSelector: nsSelector, podSelector: pods };
  }
  return { kind: 'pods', key: `pods|ns=${namespace}|${pods.key}`, namespace, namespaceSelector: null, podSelector: pods };
}

function compileIpBlock(raw: unknown, path: string, tally: Tally, errors: PolicyError[]): IpBlockPeer | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with cidr and except, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, IPBLOCK_FIELDS, errors);
  // False once the policy holds more prefixes than the limit: the rest is neither parsed nor
  // kept. The path is made only when needed: a large list would otherwise make one per entry.
  const withinLimit = (p: () => string): boolean => {
    tally.prefixes++;
    if (tally.prefixes === LIMITS.ipBlockPrefixes + 1) {
      errors.push({
        path: p(),
        message: `the policy's ipBlocks hold more than ${LIMITS.ipBlockPrefixes} prefixes (cidr and except entries); Weir accepts at most ${LIMITS.ipBlockPrefixes} per policy`,
      });
    }
    return tally.prefixes <= LIMITS.ipBlockPrefixes;
  };

  let cidr: Cidr | null = null;
  const cidrText = raw.cidr;
  if (cidrText === undefined || cidrText === null) {
    errors.push({ path: `${path}.cidr`, message: 'required' });
  } else if (!withinLimit(() => `${path}.cidr`)) {
    // reported once, above
  } else if (typeof cidrText !== 'string') {
    errors.push({ path: `${path}.cidr`, message: `must be a string, got ${describeValue(cidrText)}` });
  } else {
    const c = parseCidr(cidrText);
    if ('error' in c) errors.push({ path: `${path}.cidr`, message: c.error });
    else cidr = c;
  }

  const excepts: Cidr[] = [];
  const rawExcept = raw.except;
  if (rawExcept !== undefined && rawExcept !== null) {
    if (!Array.isArray(rawExcept)) {
      errors.push({ path: `${path}.except`, message: `must be a list of CIDRs, got ${describeValue(rawExcept)}` });
    } else {
      for (let i = 0; i < rawExcept.length; i++) {
        const text: unknown = rawExcept[i];
        const p = () => `${path}.except[${i}]`;
        if (!withinLimit(p)) continue;
        if (typeof text !== 'string') {
          errors.push({ path: p(), message: `must be a string, got ${describeValue(text)}` });
          continue;
        }
        const e = parseCidr(text);
        if ('error' in e) {
          errors.push({ path: p(), message: e.error });
        } else if (cidr !== null && e.family !== cidr.family) {
          errors.push({ path: p(), message: `IPv${e.family} except ${quote(text)} in an IPv${cidr.family} ipBlock` });
        } else if (cidr !== null && !(e.prefix > cidr.prefix && cidrCovers(cidr, e))) {
          errors.push({ path: p(), message: `${quote(text)} must be strictly inside cidr ${quote(String(cidrText))}` });
        } else {
          excepts.push(e);
        }
      }
    }
  }
  if (errors.length > before || cidr === null) return null;
  // Excepts stay a set of their own, never subtracted into prefixes: that would cost up to
  // (prefix bits) prefixes per except. Merging stops at cidr's halves, so none is a /0.
  const except = excepts.length === 0 ? null : prefixSet(cidr.family, aggregateCidrs(excepts, cidr.prefix + 1));
  return { kind: 'ipBlock', family: cidr.family, cidr: formatCidr(cidr), except };
}

// ---- Ports -----------------------------------------------------------------------------

function compilePorts(raw: unknown, path: string, errors: PolicyError[]): PortMatch[] | null {
  if (raw === undefined || raw === null) return null;
  if (!Array.isArray(raw)) {
    errors.push({ path, message: `must be a list of ports, got ${describeValue(raw)}` });
    return null;
  }
  if (raw.length === 0) return null;
  const ports: PortMatch[] = [];
  for (let i = 0; i < raw.length; i++) {
    const port = compilePort(raw[i], `${path}[${i}]`, errors);
    if (port !== null) ports.push(port);
  }
  return exact(ports);
}

function isInteger(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v);
}

function compilePort(raw: unknown, path: string, errors: PolicyError[]): PortMatch | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with protocol, port and endPort, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, PORT_FIELDS, errors);

  let protocol: Protocol = 'TCP';
  const proto = raw.protocol;
  if (proto !== undefined && proto !== null) {
    if (typeof proto === 'string' && PROTOCOL_SET.has(proto)) protocol = proto as Protocol;
    else errors.push({ path: `${path}.protocol`, message: `unsupported protocol ${describeValue(proto)}; expected TCP, UDP or SCTP` });
  }

  const port = raw.port;
  let number: number | null = null;
  let name: string | null = null;
  if (port !== undefined && port !== null) {
    if (typeof port === 'string') {
      const problem = portNameProblem(port);
      if (problem !== null) errors.push({ path: `${path}.port`, message: problem });
      else name = port;
    } else if (isInteger(port)) {
      if (port < 1 || port > MAX_PORT) errors.push({ path: `${path}.port`, message: `must be from 1 to ${MAX_PORT}, got ${port}` });
      else number = port;
    } else {
      errors.push({ path: `${path}.port`, message: `must be a port number or a named port, got ${describeValue(port)}` });
    }
  }

  const end = raw.endPort;
  let endPort: number | null = null;
  if (end !== undefined && end !== null) {
    const p = `${path}.endPort`;
    if (!isInteger(end)) errors.push({ path: p, message: `must be a port number, got ${describeValue(end)}` });
    else if (port === undefined || port === null) errors.push({ path: p, message: 'requires port' });
    else if (typeof port === 'string') errors.push({ path: p, message: `requires a numeric port, not the named port ${quote(port)}` });
    else if (end > MAX_PORT) errors.push({ path: p, message: `must be at most ${MAX_PORT}, got ${end}` });
    else if (number !== null && end < number) errors.push({ path: p, message: `must be greater than or equal to port (${number}), got ${end}` });
    else endPort = end;
  }

  if (errors.length > before) return null;
  if (name !== null) return { protocol, name };
  if (number === null) return { protocol };
  // endPort equal to port is the single port: one canonical form for one meaning.
  if (endPort !== null && endPort > number) return { protocol, port: number, endPort };
  return { protocol, port: number };
}

/** IANA_SVC_NAME: 1-15 of [a-z0-9-], at least one letter, no leading, trailing or double '-'. */
function portNameProblem(s: string): string | null {
  const what = `invalid named port ${quote(s)}`;
  if (s.length === 0) return `${what}: must not be empty`;
  if (s.length > MAX_PORT_NAME) return `${what}: must be at most ${MAX_PORT_NAME} characters`;
  let letter = false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 97 && c <= 122) letter = true;
    else if (!(c >= 48 && c <= 57) && c !== 45) return `${what}: must contain only lower-case letters, digits and "-"`;
  }
  if (!letter) {
    return `${what}: must contain at least one letter (for a port number, write it without quotes)`;
  }
  if (s.charCodeAt(0) === 45 || s.charCodeAt(s.length - 1) === 45) return `${what}: must not start or end with "-"`;
  if (s.includes('--')) return `${what}: must not contain "--"`;
  return null;
}
