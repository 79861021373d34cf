// One manifest file's text into model objects: YAML (multi-document) or JSON, Lists
// flattened, recognised kinds converted. Problems come back as data; the source logs them.

import { loadAll, YAMLException } from 'js-yaml';
import { ManifestObjectError, ManifestParseError, WeirError } from '../../errors.ts';
import { toNamespace, toNetworkPolicy, toNode, toPod } from '../convert.ts';
import type { ModelUpsert } from './view.ts';

export interface ManifestProblem {
  readonly level: 'warn' | 'debug';
  readonly message: string;
  readonly error?: ManifestObjectError;
}

export interface ExtractResult {
  readonly upserts: ModelUpsert[];
  readonly problems: ManifestProblem[];
}

/** The kinds Weir reads, by apiVersion and kind; anything else in a manifest is not ours. */
const RECOGNISED: Readonly<Record<string, string>> = {
  Pod: 'v1',
  Namespace: 'v1',
  Node: 'v1',
  NetworkPolicy: 'networking.k8s.io/v1',
};

/** The documents of one file. Throws ManifestParseError naming the 1-based line. */
export function parseManifest(file: string, text: string): unknown[] {
  const body = text.startsWith('\uFEFF') ? text.slice(1) : text;
  if (file.endsWith('.json')) {
    try {
      return [JSON.parse(body)];
    } catch (err) {
      const detail = err instanceof Error ? err.message : String(err);
      throw new ManifestParseError(file, jsonErrorLine(body, detail), detail, { cause: err });
    }
  }
  try {
    return loadAll(body, { filename: file });
  } catch (err) {
    if (err instanceof YAMLException) {
      const line = err.mark === undefined ? undefined : err.mark.line + 1;
      throw new ManifestParseError(file, line, err.reason, { cause: err });
    }
    throw new ManifestParseError(file, undefined, err instanceof Error ? err.message : String(err), { cause: err });
  }
}

/** V8 names the offset ("at position 57") or says the input ended; the line is counted. */
function jsonErrorLine(text: string, message: string): number | undefined {
  const m = /position (\d+)/.exec(message);
  const pos = m !== null ? Number(m[1]) : /end of JSON input/.test(message) ? text.length : undefined;
  if (pos === undefined) return undefined;
  let line = 1;
  for (let i = 0; i < Math.min(pos, text.length); i++) if (text.charCodeAt(i) === 10) line++;
  return line;
}

/** Recognised objects converted to model upserts, in file order; Lists are flattened. */
export function extractObjects(file: string, docs: readonly unknown[]): ExtractResult {
  const result: ExtractResult = { upserts: [], problems: [] };
  docs.forEach((doc, i) => visit(file, doc, `document ${i + 1}`, result));
  return result;
}

function visit(file: string, obj: unknown, where: string, out: ExtractResult): void {
  if (obj === null || obj === undefined) return; // an empty document, e.g. a trailing ---
  if (typeof obj !== 'object' || Array.isArray(obj)) {
    out.problems.push({ level: 'warn', message: `${file}: ${where} is not a Kubernetes object; ignored` });
    return;
  }
  const rec = obj as Record<string, unknown>;
  const { kind, apiVersion } = rec;
  if (typeof kind !== 'string' || kind === '') {
    out.problems.push({ level: 'warn', message: `${file}: ${where} has no kind; ignored` });
    return;
  }
  if (kind.endsWith('List') && Array.isArray(rec.items)) {
    rec.items.forEach((item, j) => visit(file, item, `${where} item ${j + 1}`, out));
    return;
  }
  const wanted = RECOGNISED[kind];
  if (wanted === undefined || (apiVersion !== undefined && apiVersion !== wanted)) {
    out.problems.push({ level: 'debug', message: `${file}: ${where}: ${String(apiVersion)} ${kind} is not used by Weir; ignored` });
    return;
  }
  const warn = (message: string) => out.problems.push({ level: 'warn', message: `${file}: ${where}: ${message}` });
  const skip = (detail: string) => {
    const error = new ManifestObjectError(file, where, `${detail}; skipped`);
    out.problems.push({ level: 'warn', message: error.message, error });
  };
  if (apiVersion === undefined) {
    skip(`${kind} has no apiVersion (expected ${wanted})`);
    return;
  }
  try {
    out.upserts.push(convert(kind, rec, warn));
  } catch (err) {
    if (!(err instanceof WeirError)) throw err;
    skip(err.message);
  }
}

function convert(kind: string, obj: Record<string, unknown>, warn: (m: string) => void): ModelUpsert {
  switch (kind) {
    case 'Pod':
      return { kind: 'Pod', op: 'upsert', object: toPod(obj, warn) };
    case 'Namespace':
      return { kind: 'Namespace', op: 'upsert', object: toNamespace(obj) };
    case 'Node':
      return { kind: 'Node', op: 'upsert', object: toNode(obj, warn) };
    default:
      return { kind: 'NetworkPolicy', op: 'upsert', object: toNetworkPolicy(obj) };
  }
}
