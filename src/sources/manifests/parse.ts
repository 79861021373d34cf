// One manifest file's text into model objects: YAML (multi-document) or JSON, Lists
// flattened, recognised kinds converted. Problems come back as data; the source logs them.
// An object of a recognised kind that cannot be read fails closed (see extractObjects).

import { basename } from 'node:path';
import { loadAll, YAMLException } from 'js-yaml';
import { ManifestObjectError, ManifestParseError, WeirError } from '../../errors.ts';
import { capPolicyErrors } from '../../model/policy.ts';
import { formatPolicyErrors, INVALID_CLUSTER_POLICY_EFFECT } from '../../model/policy-errors.ts';
import type { PolicyError } from '../../model/types.ts';
import { namespaceNameOf, readClusterNetworkPolicy, readNetworkPolicy, toNamespace, toNode, toPod } from '../convert.ts';
import type { ModelUpsert } from '../view.ts';
import type { ManifestItem } from './merge.ts';

export interface ManifestProblem {
  readonly level: 'warn' | 'debug';
  readonly message: string;
  readonly error?: ManifestObjectError;
}

export interface ExtractResult {
  readonly items: ManifestItem[];
  readonly problems: ManifestProblem[];
}

/** The kinds Weir reads, with their apiVersions. Other kinds are not ours and are ignored; one
 *  of these kinds with another apiVersion is a mistake, and fails closed like broken metadata.
 *  A ClusterNetworkPolicy's two versions have one schema (the API server serves both). */
const RECOGNISED: Readonly<Record<string, readonly string[]>> = {
  Pod: ['v1'],
  Namespace: ['v1'],
  Node: ['v1'],
  NetworkPolicy: ['networking.k8s.io/v1'],
  ClusterNetworkPolicy: ['policy.networking.k8s.io/v1beta1', 'policy.networking.k8s.io/v1alpha2'],
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

/**
 * Recognised objects converted to model items, in file order; Lists are flattened. What cannot
 * be read fails closed rather than vanish:
 * - a NetworkPolicy whose metadata or apiVersion is wrong is kept, invalid: it allows nothing
 *   and the pods it selects stay isolated (in every namespace if its namespace is unreadable);
 * - a ClusterNetworkPolicy likewise: it denies its subjects' traffic where it has rules;
 * - a Namespace that cannot be read makes its pods no peer of any policy (merge.ts);
 * - a Pod or Node that cannot be read is left out: the model does not know the pod, so its
 *   node drops its traffic and it is in no peer set.
 */
export function extractObjects(file: string, docs: readonly unknown[]): ExtractResult {
  const result: ExtractResult = { items: [], problems: [] };
  docs.forEach((doc, i) => {
    visit(file, doc, `document ${i + 1}`, result);
  });
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
    rec.items.forEach((item, j) => {
      visit(file, item, `${where} item ${j + 1}`, out);
    });
    return;
  }
  // Own keys only: a document of kind `constructor` or `toString` is no kind of ours.
  const wanted = Object.hasOwn(RECOGNISED, kind) ? RECOGNISED[kind] : undefined;
  if (wanted === undefined) {
    out.problems.push({ level: 'debug', message: `${file}: ${where}: ${String(apiVersion)} ${kind} is not used by Weir; ignored` });
    return;
  }
  const report = (detail: string, outcome: string) => {
    const error = new ManifestObjectError(file, where, `${detail}; ${outcome}`);
    out.problems.push({ level: 'warn', message: error.message, error });
  };
  const versions = wanted.join(' or ');
  const versionError: PolicyError | null =
    typeof apiVersion === 'string' && wanted.includes(apiVersion)
      ? null
      : { path: 'apiVersion', message: apiVersion === undefined ? `is missing (expected ${versions})` : `${JSON.stringify(apiVersion)} is not ${versions}` };

  if (kind === 'NetworkPolicy') {
    const { policy, anyNamespace } = readNetworkPolicy(rec, `(unreadable metadata: ${basename(file)} ${where})`, versionError === null ? [] : [versionError]);
    if (policy.errors !== undefined && policy.errors.length > 0) {
      const scope = anyNamespace ? ' in every namespace' : '';
      // Worded as the policy's status will word them; capped the same way.
      report(
        `NetworkPolicy ${policy.namespace || '(namespace unreadable)'}/${policy.name}: ${formatPolicyErrors(capPolicyErrors(policy.errors))}`,
        `kept as invalid: it allows nothing, and the pods it selects stay isolated${scope}`,
      );
    }
    out.items.push(anyNamespace ? { kind: 'AnyNamespacePolicy', policy } : { kind: 'NetworkPolicy', op: 'upsert', object: policy });
    return;
  }
  if (kind === 'ClusterNetworkPolicy') {
    // Cluster-scoped: a stand-in for an unreadable name is all it needs to stay in force.
    const policy = readClusterNetworkPolicy(rec, `(unreadable metadata: ${basename(file)} ${where})`, versionError === null ? [] : [versionError]);
    if (policy.errors !== undefined && policy.errors.length > 0) {
      report(`ClusterNetworkPolicy ${policy.name}: ${formatPolicyErrors(capPolicyErrors(policy.errors))}`, `kept as invalid: it ${INVALID_CLUSTER_POLICY_EFFECT}`);
    }
    out.items.push({ kind: 'ClusterNetworkPolicy', op: 'upsert', object: policy });
    return;
  }
  const warn = (message: string) => out.problems.push({ level: 'warn', message: `${file}: ${where}: ${message}` });
  let failure = versionError !== null ? `${kind}: apiVersion ${versionError.message}` : '';
  if (failure === '') {
    try {
      out.items.push(convert(kind, rec, warn));
      return;
    } catch (err) {
      if (!(err instanceof WeirError)) throw err;
      failure = err.message;
    }
  }
  if (kind === 'Namespace') {
    out.items.push({ kind: 'UnreadableNamespace', name: namespaceNameOf(rec) });
    report(failure, 'skipped: its pods are no peer of any policy until it can be read');
  } else if (kind === 'Pod') {
    report(failure, 'skipped: its node drops its traffic and it is no peer of any policy');
  } else {
    report(failure, 'skipped');
  }
}

function convert(kind: string, obj: Record<string, unknown>, warn: (m: string) => void): ModelUpsert {
  switch (kind) {
    case 'Pod':
      return { kind: 'Pod', op: 'upsert', object: toPod(obj, warn) };
    case 'Namespace':
      return { kind: 'Namespace', op: 'upsert', object: toNamespace(obj) };
    default:
      return { kind: 'Node', op: 'upsert', object: toNode(obj, warn) };
  }
}
