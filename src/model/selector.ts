// Kubernetes label selectors: validation (as strict as the API server), a canonical form
// whose key is equal for equal meanings, and a fast matcher.

import { compareStrings } from './order.ts';
import type { Labels, PolicyError, Requirement, Selector, SelectorOperator } from './types.ts';

export type SelectorResult = { readonly selector: Selector } | { readonly errors: PolicyError[] };

const OPERATORS: ReadonlySet<string> = new Set<SelectorOperator>(['In', 'NotIn', 'Exists', 'DoesNotExist']);
const SELECTOR_FIELDS = ['matchLabels', 'matchExpressions'] as const;
const REQUIREMENT_FIELDS = ['key', 'operator', 'values'] as const;
const MAX_NAME = 63;
const MAX_PREFIX = 253;

const MATCH_ALL: Selector = { key: '', requirements: [] };

/** The empty selector `{}`: matches every object in its scope. */
export function matchAllSelector(): Selector {
  return MATCH_ALL;
}

export function isMatchAll(sel: Selector): boolean {
  return sel.requirements.length === 0;
}

/** Validates a LabelSelector and returns its canonical form, or every error found.
 *  A missing selector (null/undefined) means "not given": callers decide what that means
 *  before calling; here it is reported as required. */
export function parseSelector(raw: unknown, path: string): SelectorResult {
  const errors: PolicyError[] = [];
  if (raw === null || raw === undefined) return { errors: [{ path, message: 'required' }] };
  if (!isPlainObject(raw)) {
    return { errors: [{ path, message: `must be a label selector object (matchLabels and/or matchExpressions), got ${describeValue(raw)}` }] };
  }
  checkKnownFields(raw, path, SELECTOR_FIELDS, errors);
  const reqs: Requirement[] = [];

  const matchLabels = raw.matchLabels;
  const mlPath = `${path}.matchLabels`;
  if (matchLabels !== null && matchLabels !== undefined) {
    if (!isPlainObject(matchLabels)) {
      errors.push({ path: mlPath, message: `must be an object of label key to value, got ${describeValue(matchLabels)}` });
    } else {
      for (const k of Object.keys(matchLabels)) {
        const v = matchLabels[k];
        if (v === undefined) continue;
        const p = `${mlPath}[${JSON.stringify(k)}]`;
        const keyProblem = labelKeyProblem(k);
        if (keyProblem !== null) errors.push({ path: p, message: `invalid label key ${quote(k)}: ${keyProblem}` });
        if (typeof v !== 'string') {
          errors.push({ path: p, message: `label value must be a string, got ${describeValue(v)}` });
          continue;
        }
        const valueProblem = labelValueProblem(v);
        if (valueProblem !== null) errors.push({ path: p, message: `invalid label value ${quote(v)}: ${valueProblem}` });
        if (keyProblem === null && valueProblem === null) reqs.push({ key: k, operator: 'In', values: [v] });
      }
    }
  }

  const exprs = raw.matchExpressions;
  const mePath = `${path}.matchExpressions`;
  if (exprs !== null && exprs !== undefined) {
    if (!Array.isArray(exprs)) {
      errors.push({ path: mePath, message: `must be a list of requirements, got ${describeValue(exprs)}` });
    } else {
      for (let i = 0; i < exprs.length; i++) {
        const r = parseRequirement(exprs[i], `${mePath}[${i}]`, errors);
        if (r !== null) reqs.push(r);
      }
    }
  }

  if (errors.length > 0) return { errors };
  return { selector: canonicalSelector(reqs) };
}

function parseRequirement(raw: unknown, path: string, errors: PolicyError[]): Requirement | null {
  if (!isPlainObject(raw)) {
    errors.push({ path, message: `must be an object with key, operator and values, got ${describeValue(raw)}` });
    return null;
  }
  const before = errors.length;
  checkKnownFields(raw, path, REQUIREMENT_FIELDS, errors);

  const key = raw.key;
  if (key === undefined || key === null) {
    errors.push({ path: `${path}.key`, message: 'required' });
  } else if (typeof key !== 'string') {
    errors.push({ path: `${path}.key`, message: `must be a string, got ${describeValue(key)}` });
  } else {
    const problem = labelKeyProblem(key);
    if (problem !== null) errors.push({ path: `${path}.key`, message: `invalid label key ${quote(key)}: ${problem}` });
  }

  const op = raw.operator;
  let operator: SelectorOperator | null = null;
  if (op === undefined || op === null) {
    errors.push({ path: `${path}.operator`, message: 'required; expected In, NotIn, Exists or DoesNotExist' });
  } else if (typeof op !== 'string' || !OPERATORS.has(op)) {
    errors.push({
      path: `${path}.operator`,
      message: `unsupported operator ${typeof op === 'string' ? quote(op) : describeValue(op)}; expected In, NotIn, Exists or DoesNotExist`,
    });
  } else {
    operator = op as SelectorOperator;
  }

  const rawValues = raw.values;
  const values: string[] = [];
  const vPath = `${path}.values`;
  if (rawValues !== undefined && rawValues !== null) {
    if (!Array.isArray(rawValues)) {
      errors.push({ path: vPath, message: `must be a list of strings, got ${describeValue(rawValues)}` });
    } else {
      for (let j = 0; j < rawValues.length; j++) {
        const v: unknown = rawValues[j];
        if (typeof v !== 'string') {
          errors.push({ path: `${vPath}[${j}]`, message: `must be a string, got ${describeValue(v)}` });
          continue;
        }
        const problem = labelValueProblem(v);
        if (problem !== null) errors.push({ path: `${vPath}[${j}]`, message: `invalid label value ${quote(v)}: ${problem}` });
        values.push(v);
      }
    }
  }
  if (operator === 'In' || operator === 'NotIn') {
    if (Array.isArray(rawValues) ? rawValues.length === 0 : rawValues === undefined || rawValues === null) {
      errors.push({ path: vPath, message: `must be non-empty when operator is ${operator}` });
    }
  } else if (operator !== null && Array.isArray(rawValues) && rawValues.length > 0) {
    errors.push({ path: vPath, message: `must be empty when operator is ${operator}` });
  }

  if (errors.length > before || operator === null || typeof key !== 'string') return null;
  return { key, operator, values: sortedUnique(values) };
}

/** Sorts and de-duplicates requirements and builds the canonical key. */
function canonicalSelector(reqs: Requirement[]): Selector {
  if (reqs.length === 0) return MATCH_ALL;
  reqs.sort(compareRequirements);
  const unique: Requirement[] = [];
  const parts: string[] = [];
  for (const r of reqs) {
    const last = unique[unique.length - 1];
    if (last !== undefined && compareRequirements(last, r) === 0) continue;
    unique.push(r);
    parts.push(requirementText(r));
  }
  return { key: parts.join(','), requirements: exact(unique) };
}

// Keys and values cannot contain ',', ' ', '(' or ')' once validated, so this text is unambiguous.
function requirementText(r: Requirement): string {
  switch (r.operator) {
    case 'In':
      return `${r.key} in (${r.values.join(',')})`;
    case 'NotIn':
      return `${r.key} notin (${r.values.join(',')})`;
    case 'Exists':
      return r.key;
    case 'DoesNotExist':
      return `!${r.key}`;
  }
}

function compareRequirements(a: Requirement, b: Requirement): number {
  const c = compareStrings(a.key, b.key) || compareStrings(a.operator, b.operator);
  if (c !== 0) return c;
  const n = Math.min(a.values.length, b.values.length);
  for (let i = 0; i < n; i++) {
    const d = compareStrings(a.values[i], b.values[i]);
    if (d !== 0) return d;
  }
  return a.values.length - b.values.length;
}

function sortedUnique(values: string[]): string[] {
  if (values.length < 2) return exact(values);
  values.sort(compareStrings);
  const out = [values[0]];
  for (let i = 1; i < values.length; i++) if (values[i] !== values[i - 1]) out.push(values[i]);
  return exact(out);
}

/** An exact-size copy of an array built by push: push leaves slack, and compiled policies and
 *  pods are held for as long as they exist (docs/performance.md, memory). */
export function exact<T>(grown: T[]): T[] {
  return grown.slice();
}

/** True when every requirement holds for these labels. NotIn and DoesNotExist hold when the
 *  label is absent. Hot path: no allocation. */
/** A selector read at `path`, or null with its errors added to `errors`. */
export function selectorOrNull(raw: unknown, path: string, errors: PolicyError[]): Selector | null {
  const r = parseSelector(raw, path);
  if ('errors' in r) {
    errors.push(...r.errors);
    return null;
  }
  return r.selector;
}

export function selectorMatches(sel: Selector, labels: Labels): boolean {
  const reqs = sel.requirements;
  for (let i = 0; i < reqs.length; i++) {
    const r = reqs[i];
    // hasOwn: valid label keys include "constructor" and "toString".
    const v = Object.hasOwn(labels, r.key) ? labels[r.key] : undefined;
    switch (r.operator) {
      case 'In':
        if (v === undefined || !r.values.includes(v)) return false;
        break;
      case 'NotIn':
        if (v !== undefined && r.values.includes(v)) return false;
        break;
      case 'Exists':
        if (v === undefined) return false;
        break;
      case 'DoesNotExist':
        if (v !== undefined) return false;
        break;
    }
  }
  return true;
}

// ---- Label key / value syntax (apimachinery validation, without regexes) ---------------

function isAlnum(c: number): boolean {
  return (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
}
function isLowerAlnum(c: number): boolean {
  return (c >= 48 && c <= 57) || (c >= 97 && c <= 122);
}

/** Name part of a qualified name, and a label value when non-empty:
 *  [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])? */
function nameCharsOk(s: string): boolean {
  const n = s.length;
  if (!isAlnum(s.charCodeAt(0)) || !isAlnum(s.charCodeAt(n - 1))) return false;
  for (let i = 1; i < n - 1; i++) {
    const c = s.charCodeAt(i);
    if (!isAlnum(c) && c !== 45 /* - */ && c !== 95 /* _ */ && c !== 46 /* . */) return false;
  }
  return true;
}

/** DNS-1123 subdomain: dot-separated labels of [a-z0-9-], each starting and ending alnum. */
function dnsSubdomainOk(s: string): boolean {
  let start = 0;
  for (let i = 0; i <= s.length; i++) {
    if (i < s.length && s.charCodeAt(i) !== 46) continue;
    if (i === start) return false; // empty label
    if (!isLowerAlnum(s.charCodeAt(start)) || !isLowerAlnum(s.charCodeAt(i - 1))) return false;
    for (let j = start + 1; j < i - 1; j++) {
      const c = s.charCodeAt(j);
      if (!isLowerAlnum(c) && c !== 45) return false;
    }
    start = i + 1;
  }
  return true;
}

const NAME_RULE = 'must be letters, digits, "-", "_" or ".", starting and ending with a letter or digit';

/** Why a label key is invalid, or null when it is valid. */
export function labelKeyProblem(key: string): string | null {
  if (key.length === 0) return 'must not be empty';
  const slash = key.indexOf('/');
  let name = key;
  if (slash >= 0) {
    if (key.indexOf('/', slash + 1) >= 0) return 'must contain at most one "/"';
    const prefix = key.slice(0, slash);
    name = key.slice(slash + 1);
    if (prefix.length === 0) return 'prefix before "/" must not be empty';
    if (prefix.length > MAX_PREFIX) return `prefix must be at most ${MAX_PREFIX} characters`;
    if (!dnsSubdomainOk(prefix)) {
      return 'prefix must be a DNS subdomain: lower-case letters, digits, "-" and ".", each dot-separated part starting and ending with a letter or digit';
    }
    if (name.length === 0) return 'name after "/" must not be empty';
  }
  if (name.length > MAX_NAME) return `name part must be at most ${MAX_NAME} characters`;
  if (!nameCharsOk(name)) return `name part ${NAME_RULE}`;
  return null;
}

/** Why a label value is invalid, or null when it is valid (the empty value is valid). */
export function labelValueProblem(value: string): string | null {
  if (value.length === 0) return null;
  if (value.length > MAX_NAME) return `must be at most ${MAX_NAME} characters`;
  if (!nameCharsOk(value)) return NAME_RULE;
  return null;
}

// ---- Validation helpers shared with policy.ts -------------------------------------------

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Short description of an untrusted value for an error message. */
export function describeValue(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  switch (typeof v) {
    case 'string':
      return quote(v);
    case 'number':
    case 'boolean':
    case 'bigint':
      return String(v);
    case 'object':
      return 'an object';
    default:
      return typeof v;
  }
}

/** JSON-quoted, cut short so that garbage input cannot flood a log line. */
export function quote(s: string): string {
  return JSON.stringify(s.length > 80 ? `${s.slice(0, 77)}...` : s);
}

/** Reports fields the schema does not know: a typo such as `matchlabels` would otherwise
 *  silently widen a selector and open traffic. Undefined values count as absent. */
export function checkKnownFields(obj: Record<string, unknown>, path: string, known: readonly string[], errors: PolicyError[]): void {
  for (const k of Object.keys(obj)) {
    if (obj[k] === undefined || known.includes(k)) continue;
    errors.push({ path: `${path}.${k}`, message: `unknown field; expected ${orList(known)}` });
  }
}

function orList(items: readonly string[]): string {
  return items.length === 1 ? items[0] : `${items.slice(0, -1).join(', ')} or ${items[items.length - 1]}`;
}
