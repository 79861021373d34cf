// A synthetic cluster for the benchmark: sizes are parameters, content is deterministic.
// Pods spread over namespaces and nodes round-robin, so "this node" gets pods of many
// namespaces, and policies mix every peer kind the engine handles.

import type { ModelEvent, Namespace, Pod, RawNetworkPolicy } from '../src/model/types.ts';

export interface SyntheticSize {
  readonly pods: number;
  readonly namespaces: number;
  readonly policies: number;
  readonly localPods: number;
  /** Pod i goes to node (i + i div nodes) mod nodes instead of i mod nodes: a namespace's pods
   *  then land on different nodes even when the node count divides the namespace count (at 1,000
   *  nodes and 10k namespaces i mod nodes puts all of a namespace's pods on one node). Each
   *  node still gets pods 0.. of its own range, once each. */
  readonly spreadNamespaces?: boolean;
}

export const NODE = 'node-0';
const TIERS = ['web', 'api', 'db'];

/** Like Flannel, every node has its own pod range: a /20 per node (k is the pod's index on it).
 *  IPv6 in canonical form, as convert.ts hands pod IPs to calc (node 0's "fd00::0:3" is not). */
export function podIps(node: number, k: number): string[] {
  return [`10.${node >> 4}.${((node & 15) << 4) | ((k >> 8) & 15)}.${k & 255}`, node === 0 ? (k === 0 ? 'fd00::' : `fd00::${k.toString(16)}`) : `fd00::${node.toString(16)}:${k.toString(16)}`];
}

export function makePod(i: number, size: SyntheticSize, labels?: Pod['labels']): Pod {
  const nodes = Math.max(1, Math.round(size.pods / size.localPods));
  const ns = `ns-${i % size.namespaces}`;
  const node = size.spreadNamespaces ? (i + Math.floor(i / nodes)) % nodes : i % nodes;
  return {
    uid: `uid-${i}`,
    namespace: ns,
    name: `pod-${i}`,
    labels: labels ?? { app: `app${Math.floor(i / size.namespaces) % 5}`, tier: TIERS[Math.floor(i / size.namespaces) % 3] },
    nodeName: `node-${node}`,
    hostNetwork: false,
    phase: 'Running',
    terminating: false,
    ips: podIps(node, Math.floor(i / nodes)),
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
  };
}

export function makeNamespace(i: number, extra: Record<string, string> = {}): Namespace {
  return { name: `ns-${i}`, labels: { team: `t${i % 50}`, env: i % 3 === 0 ? 'prod' : 'dev', ...extra } };
}

/** Policy j lives in namespace j % namespaces; its shape cycles through five kinds, so
 *  every namespace holds several kinds. */
export function makePolicy(j: number, size: SyntheticSize, generation = 1): RawNetworkPolicy {
  const nsIndex = j % size.namespaces;
  const ns = `ns-${nsIndex}`;
  let spec: unknown;
  switch ((j + Math.floor(j / size.namespaces)) % 5) {
    case 0:
      spec = { podSelector: {}, policyTypes: ['Ingress'] };
      break;
    case 1:
      spec = {
        podSelector: { matchLabels: { tier: 'db' } },
        ingress: [{ from: [{ podSelector: { matchLabels: { tier: 'api' } } }], ports: [{ port: 5432 }] }],
      };
      break;
    case 2:
      spec = {
        podSelector: { matchLabels: { tier: 'api' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: `t${nsIndex % 50}` } }, podSelector: { matchLabels: { tier: 'web' } } }], ports: [{ port: 'http' }] }],
      };
      break;
    case 3:
      spec = {
        podSelector: { matchLabels: { tier: 'web' } },
        egress: [
          { to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8', '192.168.0.0/16'] } }], ports: [{ protocol: 'TCP', port: 443 }] },
          { to: [{ namespaceSelector: { matchLabels: { env: 'prod' } } }], ports: [{ protocol: 'UDP', port: 53 }] },
        ],
      };
      break;
    default:
      spec = {
        podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['app1', 'app2'] }] },
        ingress: [{ from: [{ namespaceSelector: {} }, { ipBlock: { cidr: '172.16.0.0/12' } }], ports: [{ port: 8000, endPort: 9000 }] }],
      };
  }
  return { namespace: ns, name: `pol-${j}`, uid: `pol-uid-${j}`, generation, spec };
}

export function initialEvents(size: SyntheticSize): ModelEvent[] {
  const out: ModelEvent[] = [];
  for (let i = 0; i < size.namespaces; i++) out.push({ kind: 'Namespace', op: 'upsert', object: makeNamespace(i) });
  for (let j = 0; j < size.policies; j++) out.push({ kind: 'NetworkPolicy', op: 'upsert', object: makePolicy(j, size) });
  for (let i = 0; i < size.pods; i++) out.push({ kind: 'Pod', op: 'upsert', object: makePod(i, size) });
  return out;
}
