// The real-cluster tier's tools: a cluster from scripts/cluster.sh (kubelet, containerd,
// Flannel, kube-proxy on two nodes), Weir installed by its chart, and the few verbs the tests
// need: kubectl and helm as an operator runs them, a command on a node, and a connection
// attempt from one pod to another made inside the pod (`agnhost connect`, as the upstream
// e2e suite probes).

import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { eventually } from '../support/eventually.ts';
import { ok, type Run, run } from '../support/run.ts';

export const REPO = fileURLToPath(new URL('../../', import.meta.url));
const CLUSTER_SH = join(REPO, 'scripts/cluster.sh');
export const AGNHOST = 'registry.k8s.io/e2e-test-images/agnhost:2.59';
export const NODES = ['node-1', 'node-2'] as const;

export { eventually, ok, type Run, run };

/** Each test process has a cluster of its own name, apart from any a developer keeps up. */
const clusterEnv = { ...process.env, WEIR_CLUSTER_NAME: process.env.WEIR_CLUSTER_NAME ?? `t${process.pid % 1_000_000}` };
const clusterSh = (args: readonly string[], passStderr = false) => run(CLUSTER_SH, args, { env: clusterEnv, passStderr });
const script = async (args: readonly string[], passStderr = false) => ok(`scripts/cluster.sh ${args.join(' ')}`, await clusterSh(args, passStderr));

/** What `scripts/NAME build` prints last: its binary, or the directory of its binaries. */
const built = async (scriptName: string) =>
  ok(`scripts/${scriptName} build`, await run(join(REPO, 'scripts', scriptName), ['build']))
    .trim()
    .split('\n')
    .pop() ?? '';

/** The upstream e2e NetworkPolicy specs' binary (scripts/cluster.sh build makes it). */
export async function e2eBinary(): Promise<string> {
  return (await script(['e2e-binary'])).trim();
}

/** The upstream ClusterNetworkPolicy conformance tests' binary (hack/npapi; scripts/cluster.sh build makes it). */
export async function npapiBinary(): Promise<string> {
  return (await script(['npapi-binary'])).trim();
}

export interface RealCluster {
  readonly kubeconfig: string;
  /** The environment that names this cluster to scripts/cluster.sh. */
  readonly env: NodeJS.ProcessEnv;
  kubectl(args: readonly string[], input?: string): Promise<Run>;
  /** kubectl that must succeed: resolves to its stdout. */
  k(args: readonly string[], input?: string): Promise<string>;
  helm(args: readonly string[]): Promise<Run>;
  /** Runs a command on a node (its network, mount and PID namespaces). */
  onNode(node: string, args: readonly string[]): Promise<Run>;
  /** Kills a node daemon (flanneld, kube-proxy) and starts it again. */
  restart(node: string, daemon: string): Promise<void>;
  /** Imports an OCI image archive into every node's containerd as `name`. */
  loadImage(archive: string, name: string): Promise<void>;
  down(): Promise<void>;
}

/** Brings the cluster up (building what is missing), with Weir's CRDs applied. */
export async function clusterUp(): Promise<RealCluster> {
  const out = await script(['up'], true);
  const kubeconfig = out.trim().split('\n').pop() ?? '';
  const kubectlBin = join(await built('control-plane.sh'), 'kubectl');
  const helmBin = await built('helm.sh');
  const env = { ...process.env, KUBECONFIG: kubeconfig };
  const kubectl = (args: readonly string[], input?: string) => run(kubectlBin, ['--request-timeout=30s', ...args], { input, env });
  const cluster: RealCluster = {
    kubeconfig,
    env: clusterEnv,
    kubectl,
    k: async (args, input) => ok(`kubectl ${args.join(' ')}`, await kubectl(args, input)),
    helm: (args) => run(helmBin, args, { env }),
    onNode: (node, args) => clusterSh(['node-exec', node, ...args]),
    restart: async (node, daemon) => void (await script(['restart', node, daemon])),
    loadImage: async (archive, name) => void (await script(['load-image', archive, name])),
    down: async () => void (await script(['purge'], true)),
  };
  await cluster.k(['apply', '-f', join(REPO, 'crds')]);
  return cluster;
}

/** `helm install weir charts/weir`, waiting until every agent is ready. */
export async function installWeir(c: RealCluster, extra: readonly string[] = []): Promise<void> {
  ok('helm install', await c.helm(['install', 'weir', join(REPO, 'charts/weir'), '-n', 'kube-system', '--wait', '--timeout', '180s', ...extra]));
  await agentsReady(c);
}

/** Waits until every node's NodePolicyStatus says Ready and Programmed. */
export async function agentsReady(c: RealCluster): Promise<void> {
  await eventually(
    'every node reports Ready and Programmed',
    () => c.k(['get', 'nodepolicystatuses', '-o', 'json']),
    (out) => {
      const items = (JSON.parse(out) as { items: { status?: { conditions?: { type: string; status: string }[] } }[] }).items;
      const cond = (i: (typeof items)[number], t: string) => i.status?.conditions?.find((x) => x.type === t)?.status === 'True';
      return items.length === NODES.length && items.every((i) => cond(i, 'Ready') && cond(i, 'Programmed'));
    },
    120_000,
  );
}

/** A pod serving TCP on port 80 (as the e2e suite's servers do), and UDP on 81 if asked,
 *  pinned to a node. */
export function agnhostPod(name: string, ns: string, node: string, labels: Record<string, string>, opts: { udp?: boolean } = {}): object {
  const serve = (proto: 'tcp' | 'udp', port: number) => ({
    name: proto,
    image: AGNHOST,
    command: ['/agnhost', 'serve-hostname', `--${proto}`, '--http=false', '--port', String(port)],
    ports: [{ containerPort: port, protocol: proto.toUpperCase() }],
  });
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: ns, labels },
    spec: { nodeName: node, terminationGracePeriodSeconds: 0, containers: [serve('tcp', 80), ...(opts.udp ? [serve('udp', 81)] : [])] },
  };
}

/** Creates the pods and resolves, once each runs, to their IPs by name. */
export async function runPods(c: RealCluster, ns: string, pods: readonly object[]): Promise<Record<string, string>> {
  await c.k(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: pods }));
  const names = pods.map((p) => (p as { metadata: { name: string } }).metadata.name);
  const ips: Record<string, string> = {};
  for (const name of names) {
    ips[name] = await eventually(
      `pod ${ns}/${name} running`,
      () => c.k(['-n', ns, 'get', 'pod', name, '-o', 'jsonpath={.status.phase} {.status.podIP}']),
      (s) => /^Running \S+$/.test(s),
      120_000,
    ).then((s) => s.split(' ')[1]!);
  }
  return ips;
}

/** One connection attempt from inside pod `from` (`agnhost connect`): true if it connected
 *  (for UDP: if the server answered). */
export async function connects(c: RealCluster, ns: string, from: string, ip: string, port = 80, timeoutS = 2, protocol: 'tcp' | 'udp' = 'tcp'): Promise<boolean> {
  const r = await c.kubectl(['-n', ns, 'exec', from, '-c', 'tcp', '--', '/agnhost', 'connect', `${ip}:${port}`, `--timeout=${timeoutS}s`, `--protocol=${protocol}`]);
  if (r.code === 0) return true;
  // agnhost says TIMEOUT or REFUSED on stderr and exits 1; anything else is the harness failing.
  if (/TIMEOUT|REFUSED/.test(r.stderr + r.stdout)) return false;
  throw new Error(`kubectl exec ${ns}/${from} connect ${ip}:${port} failed: ${r.stderr}${r.stdout}`);
}

/** Waits until `from` → `ip` gives `want` (a policy takes a moment to reach the node). */
export async function expectConnects(c: RealCluster, ns: string, from: string, ip: string, want: boolean, what: string): Promise<void> {
  await eventually(
    what,
    () => connects(c, ns, from, ip),
    (v) => v === want,
    20_000,
  );
}
