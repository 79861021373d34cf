// The exact request paths and JSON bodies the status writers send. Server-side apply bodies
// hold only the fields their field manager owns: whatever a body leaves out, the manager gives
// up. Pure.

import type { PolicyRef, NodeStatus } from './node-status.ts';
import type { PolicyStatus } from './policy-status.ts';
import type { Condition } from './conditions.ts';
import { rfc3339 } from './conditions.ts';

export const GROUP = 'weir.dev';
export const VERSION = 'v1alpha1';
export const API_VERSION = `${GROUP}/${VERSION}`;
export const NODE_KIND = 'NodePolicyStatus';
export const POLICY_KIND = 'NetworkPolicyStatus';
export const NODE_PLURAL = 'nodepolicystatuses';
export const POLICY_PLURAL = 'networkpolicystatuses';

/** SIG Network's ClusterNetworkPolicy (network-policy-api v0.3.0), whose own status Weir writes. */
export const CLUSTER_POLICY_API_VERSION = 'policy.networking.k8s.io/v1beta1';
export const CLUSTER_POLICY_KIND = 'ClusterNetworkPolicy';
export const CLUSTER_POLICY_PLURAL = 'clusternetworkpolicies';

/** The aggregator's field manager; each agent uses agentFieldManager(node). */
export const AGGREGATOR_FIELD_MANAGER = 'weir-aggregator';
/** The API server refuses longer field manager names. */
export const MAX_FIELD_MANAGER = 128;

export function agentFieldManager(node: string): string {
  return `weir-agent-${node}`.slice(0, MAX_FIELD_MANAGER);
}

/** Query of a server-side apply: force, because each object has exactly one writer and a
 *  conflict can only come from a person's kubectl edit, which the writer should overrule. */
export function applyQuery(fieldManager: string): Record<string, string> {
  return { fieldManager, force: 'true' };
}

const seg = encodeURIComponent;

export function nodeStatusPath(node: string, subresource?: 'status'): string {
  return `/apis/${API_VERSION}/${NODE_PLURAL}/${seg(node)}${subresource ? `/${subresource}` : ''}`;
}

export function nodeStatusListPath(): string {
  return `/apis/${API_VERSION}/${NODE_PLURAL}`;
}

export function policyStatusPath(namespace: string, name: string, subresource?: 'status'): string {
  return `/apis/${API_VERSION}/namespaces/${seg(namespace)}/${POLICY_PLURAL}/${seg(name)}${subresource ? `/${subresource}` : ''}`;
}

/** Every NetworkPolicyStatus, all namespaces. */
export function policyStatusListPath(): string {
  return `/apis/${API_VERSION}/${POLICY_PLURAL}`;
}

export function clusterPolicyPath(name: string, subresource?: 'status'): string {
  return `/apis/${CLUSTER_POLICY_API_VERSION}/${CLUSTER_POLICY_PLURAL}/${seg(name)}${subresource ? `/${subresource}` : ''}`;
}

export function clusterPolicyListPath(): string {
  return `/apis/${CLUSTER_POLICY_API_VERSION}/${CLUSTER_POLICY_PLURAL}`;
}

export function nodePath(node: string): string {
  return `/api/v1/nodes/${seg(node)}`;
}

export function eventsPath(namespace: string, name?: string): string {
  return `/api/v1/namespaces/${seg(namespace)}/events${name === undefined ? '' : `/${seg(name)}`}`;
}

/** The object itself (created on first apply): only its owner, so that deleting the Node lets
 *  the garbage collector delete the status. */
export function nodeObjectBody(node: string, nodeUid: string): object {
  return {
    apiVersion: API_VERSION,
    kind: NODE_KIND,
    metadata: { name: node, ownerReferences: [{ apiVersion: 'v1', kind: 'Node', name: node, uid: nodeUid }] },
  };
}

/** For PATCH .../status: the API server ignores everything but status there. */
export function nodeStatusBody(node: string, status: NodeStatus): object {
  return { apiVersion: API_VERSION, kind: NODE_KIND, metadata: { name: node }, status };
}

export function policyObjectBody(policy: PolicyRef): object {
  return {
    apiVersion: API_VERSION,
    kind: POLICY_KIND,
    metadata: {
      name: policy.name,
      namespace: policy.namespace,
      ownerReferences: [{ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', name: policy.name, uid: policy.uid }],
    },
  };
}

export function policyStatusBody(policy: PolicyRef, status: PolicyStatus): object {
  return { apiVersion: API_VERSION, kind: POLICY_KIND, metadata: { name: policy.name, namespace: policy.namespace }, status };
}

/** For PATCH .../status of a ClusterNetworkPolicy: Weir's conditions alone (applied, so that
 *  other writers' conditions stay theirs), on the version read. A resourceVersion is the one
 *  precondition the status subresource honours (a uid is not checked there): the write fails
 *  with 409 rather than land on a namesake created since or on a newer generation. */
export function clusterPolicyStatusBody(name: string, resourceVersion: string, conditions: readonly Condition[]): object {
  return { apiVersion: CLUSTER_POLICY_API_VERSION, kind: CLUSTER_POLICY_KIND, metadata: { name, resourceVersion }, status: { conditions } };
}

/** DELETE options that delete only the object we looked at, not a namesake created since. */
export function deleteBody(uid: string): object {
  return { apiVersion: 'v1', kind: 'DeleteOptions', preconditions: { uid } };
}

export type EventType = 'Normal' | 'Warning';

export interface EventSeries {
  readonly ref: PolicyRef;
  readonly type: EventType;
  readonly reason: string;
  readonly message: string;
  readonly component: string;
  readonly host: string;
  readonly count: number;
  readonly firstMs: number;
  readonly lastMs: number;
}

/** A core/v1 Event on the NetworkPolicy, as kubectl describe shows it. */
export function eventBody(name: string, e: EventSeries): object {
  return {
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { name, namespace: e.ref.namespace },
    involvedObject: { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', namespace: e.ref.namespace, name: e.ref.name, uid: e.ref.uid },
    type: e.type,
    reason: e.reason,
    message: e.message,
    source: { component: e.component, host: e.host },
    reportingComponent: e.component,
    reportingInstance: e.host,
    firstTimestamp: rfc3339(e.firstMs),
    lastTimestamp: rfc3339(e.lastMs),
    count: e.count,
  };
}

/** The merge patch that adds repeats to an existing Event. */
export function eventRepeatBody(e: Pick<EventSeries, 'message' | 'count' | 'lastMs'>): object {
  return { count: e.count, lastTimestamp: rfc3339(e.lastMs), message: e.message };
}

/** client-go's scheme: the object's name, a dot, and the time in hex nanoseconds; the name is
 *  cut so that the whole stays a valid object name. */
export function eventName(objectName: string, nowMs: number, seq: number): string {
  const suffix = (BigInt(Math.floor(nowMs)) * 1_000_000n + BigInt(seq)).toString(16);
  return `${objectName.slice(0, 253 - suffix.length - 1)}.${suffix}`;
}
