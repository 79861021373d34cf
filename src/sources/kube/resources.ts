// The kinds Weir watches: where they live in the API and how one raw object becomes the model
// object the reflector holds (the shared conversion of ../convert.ts), compared as JSON for
// exact diffs.

import { decodeNamespace, decodePod } from '../../kube/core-v1-proto.ts';
import { rawRefOf } from '../../kube/collection.ts';
import { isRecord } from '../../records.ts';
import type { Codec, Collection, Decoded, RawRef } from '../../kube/collection.ts';
import type { ObjectKind, Pod, RawNetworkPolicy } from '../../model/types.ts';
import { toClusterNetworkPolicy, toNamespace, toNetworkPolicy, toNode, toPod } from '../convert.ts';
import { type Interner, ValueInterner } from '../intern.ts';
import { objectKey, sameJson } from '../view.ts';
import type { ModelUpsert, ViewEntry } from '../view.ts';

export interface Resource extends Collection<ObjectKind> {
  readonly namespaced: boolean;
}

/** ClusterNetworkPolicy of sigs.k8s.io/network-policy-api v0.3.0: v1beta1 is its storage version. */
export const CLUSTER_NETWORK_POLICIES_PATH = '/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies';

/** Namespaces and nodes before pods and policies, the order of the first batch's events. Pods
 *  and Namespaces are listed as protobuf: the API server serves it faster than JSON, and
 *  skipping what Weir does not read decodes it faster than JSON.parse (docs/performance.md).
 *  Policies need their whole spec, and there is one Node: both stay JSON. */
export function resourcesFor(nodeName: string | undefined): readonly Resource[] {
  return [
    { kind: 'Namespace', path: '/api/v1/namespaces', namespaced: false, protobuf: decodeNamespace },
    // Only this agent's node: its podCIDRs are all Weir needs from nodes. The controller,
    // which enforces nothing, watches none.
    ...(nodeName === undefined ? [] : [{ kind: 'Node', path: '/api/v1/nodes', namespaced: false, fieldSelector: `metadata.name=${nodeName}` } as const]),
    { kind: 'Pod', path: '/api/v1/pods', namespaced: true, protobuf: decodePod },
    { kind: 'NetworkPolicy', path: '/apis/networking.k8s.io/v1/networkpolicies', namespaced: true },
    // A CRD of network-policy-api, which a cluster may not have installed: then there are none.
    { kind: 'ClusterNetworkPolicy', path: CLUSTER_NETWORK_POLICIES_PATH, namespaced: false, optional: true },
  ];
}

export interface Converted {
  readonly entry: ViewEntry;
  /** namespace/name (or name): at most one object holds a name at a time, whatever its uid. */
  readonly name: string;
  /** Problems the conversion survived (an invalid pod IP dropped). */
  readonly warnings: readonly string[];
}

const NO_WARNINGS: readonly string[] = [];

/** Converts one raw API object; throws the WeirError of ../convert.ts when it cannot. `intern`
 *  shares what pods repeat (../intern.ts). */
export function convertObject(res: Resource, raw: unknown, intern?: Interner): Converted {
  let warnings: string[] | undefined;
  const warn = (m: string) => void (warnings ??= []).push(m);
  let upsert: ModelUpsert;
  switch (res.kind) {
    case 'Pod':
      upsert = { kind: 'Pod', op: 'upsert', object: toPod(raw, warn, intern) };
      break;
    case 'Namespace':
      upsert = { kind: 'Namespace', op: 'upsert', object: toNamespace(raw) };
      break;
    case 'Node':
      upsert = { kind: 'Node', op: 'upsert', object: toNode(raw, warn) };
      break;
    case 'NetworkPolicy':
      // Needs only metadata: the spec goes through as received and the model validates it.
      upsert = { kind: 'NetworkPolicy', op: 'upsert', object: toNetworkPolicy(raw) };
      break;
    case 'ClusterNetworkPolicy':
      // As a NetworkPolicy: metadata read here, the spec validated by the model.
      upsert = { kind: 'ClusterNetworkPolicy', op: 'upsert', object: toClusterNetworkPolicy(raw) };
      break;
  }
  const entry: ViewEntry = { key: objectKey(upsert), upsert, file: res.path };
  // Every object of the cluster is held with its warnings: most have none, and share one array.
  return { entry, name: nameOfUpsert(upsert), warnings: warnings ?? NO_WARNINGS };
}

function nameOfUpsert(u: ModelUpsert): string {
  return u.kind === 'Pod' || u.kind === 'NetworkPolicy' ? `${u.object.namespace}/${u.object.name}` : u.object.name;
}

/** Identity read leniently from a raw object ("default" namespace when missing, as
 *  ../convert.ts does). */
export function rawRef(res: Resource, raw: unknown): RawRef {
  return rawRefOf(raw, res.namespaced);
}

/** A model object of one of the kinds, as the reflectors hold it. */
export type ModelObject = ModelUpsert['object'];

/** The upsert of `object`, a `res.kind` object. */
export function upsertOf(res: Resource, object: ModelObject): ModelUpsert {
  return { kind: res.kind, op: 'upsert', object } as ModelUpsert;
}

/** Stands in a held policy for the spec it no longer carries. Not JSON, so it never equals a
 *  spec, and compilePolicy would reject it if it ever reached the model. */
const SPEC_HELD_BY_GENERATION = Symbol('spec held by generation');

/**
 * What the source holds of a policy between events. Its spec is needed only to compile it, and
 * the API server raises metadata.generation with every change of the spec, so a policy is held
 * without it (most of its memory: docs/performance.md) and compared by generation. One whose
 * generation the server did not set (convert.ts then says 1) keeps its spec (see decode).
 */
const heldPolicy = (policy: RawNetworkPolicy): RawNetworkPolicy => ({ ...policy, spec: SPEC_HELD_BY_GENERATION });

const hasGeneration = (raw: unknown): boolean => {
  const md = isRecord(raw) ? raw.metadata : undefined;
  return isRecord(md) && typeof md.generation === 'number' && md.generation >= 1;
};

/** How the reflector of `res` decodes: model objects themselves (a view entry wrapping each
 *  would cost memory per object), keyed by model key (a pod by uid). Two held policies are the
 *  same if all but their specs are equal, generation included; a held policy is never the same
 *  as one with its spec (whose generation, if the server did not set it, says nothing). */
export function resourceCodec(res: Resource): Codec<ModelObject> {
  const intern = new ValueInterner();
  return {
    decode(raw): Decoded<ModelObject> {
      const { entry, name, warnings } = convertObject(res, raw, intern);
      const object = entry.upsert.object;
      // ClusterNetworkPolicies are few: held with their spec, compared by it.
      const held = entry.upsert.kind === 'NetworkPolicy' && hasGeneration(raw) ? heldPolicy(entry.upsert.object) : undefined;
      return { key: entry.key, name, value: object, held, warnings };
    },
    same: sameJson,
    ref: (raw) => rawRef(res, raw),
    keyOf: (held) => objectKey({ kind: res.kind, op: 'upsert', object: held } as ModelUpsert),
    // A late delete of an older pod of the same name must not remove the new one.
    deletes: (held, ref) => res.kind !== 'Pod' || ref.uid === '' || (held as Pod).uid === ref.uid,
  };
}
