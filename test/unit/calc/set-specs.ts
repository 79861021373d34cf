// SetSpecs built by hand for the set registry's tests: pods of a namespace, pods of namespaces
// by their labels, prefixes, and unions of those.

import type { SetSpec } from '../../../src/calc/rules.ts';
import { setKey } from '../../../src/calc/rules.ts';
import { parseCidr, prefixSet } from '../../../src/model/cidr.ts';
import type { Cidr } from '../../../src/model/cidr.ts';
import { parseSelector } from '../../../src/model/selector.ts';
import type { Labels, PodsPeer, Selector } from '../../../src/model/types.ts';

export function sel(matchLabels: Labels): Selector {
  const r = parseSelector({ matchLabels }, 'test');
  if ('errors' in r) throw new Error(JSON.stringify(r.errors));
  return r.selector;
}

/** Pods of one namespace with these labels (and, with `namedPort`, their TCP port of that name). */
export function inNamespace(ns: string, labels: Labels, namedPort?: string): SetSpec {
  const podSelector = sel(labels);
  const peer: PodsPeer = { kind: 'pods', key: `pods|ns=${ns}|${podSelector.key}`, namespace: ns, namespaceSelector: null, podSelector };
  return { family: 4, peer, ...(namedPort ? { namedPort: { protocol: 'TCP', name: namedPort } } : {}) };
}

/** Pods of every namespace whose labels match. */
export function byNamespaceLabels(nsLabels: Labels, labels: Labels): SetSpec {
  const namespaceSelector = sel(nsLabels);
  const podSelector = sel(labels);
  const peer: PodsPeer = { kind: 'pods', key: `pods|nssel=${namespaceSelector.key}|${podSelector.key}`, namespace: null, namespaceSelector, podSelector };
  return { family: 4, peer };
}

export function prefixes(...cidrs: string[]): SetSpec {
  return {
    family: 4,
    peer: prefixSet(
      4,
      cidrs.map((c) => parseCidr(c) as Cidr),
    ),
  };
}

export function union(...parts: SetSpec[]): SetSpec {
  return { family: 4, peer: { kind: 'union', key: `union|${parts.map(setKey).join('\n')}`, parts } };
}
