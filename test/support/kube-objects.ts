// The Pod and NetworkPolicy objects the API-server tiers and the peer bench create through the
// API: a pod bound to its node by spec.nodeName (no kubelet runs it: its status is patched in),
// and a NetworkPolicy as kubectl writes it.

/** What a Pod object is made from: the conformance cast's pods and the peer bench's. */
export interface PodObjectDef {
  readonly namespace: string;
  readonly name: string;
  readonly node: string;
  readonly labels: Record<string, string>;
  readonly ports?: readonly { name: string; containerPort: number; protocol: 'TCP' | 'UDP' | 'SCTP' }[];
  readonly hostNetwork?: boolean;
}

export function podObject(p: PodObjectDef) {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: p.name, namespace: p.namespace, labels: p.labels },
    spec: {
      nodeName: p.node,
      hostNetwork: p.hostNetwork ?? false,
      containers: [{ name: 'server', image: 'registry.invalid/weir-sim-server', ports: p.ports ?? [] }],
    },
  };
}

export function policyObject(namespace: string, name: string, spec: unknown) {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { namespace, name }, spec };
}
