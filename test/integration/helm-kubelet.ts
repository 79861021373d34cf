// What a kubelet does with the chart's DaemonSet, done by hand on a simulated node: the pod the
// DaemonSet controller would create for a node, its environment resolved as the kubelet
// resolves it (downward API fields read from the pod object itself, $(VAR) references), and
// its container run as written, inside the node's network namespace:
//   - the same command, args and env. The image does not exist as a runnable thing here, so
//     its entrypoint (the Dockerfile's ENTRYPOINT, `node --max-semi-space-size=2 --expose-gc /app/dist/cli/main.js`) is mapped to
//     this checkout's `src/cli/main.ts` run by the Node 24 of node_modules; nothing else is.
//   - the container's mounts: a private mount namespace where /run is a fresh tmpfs (standing
//     in for the image's own /run), holding only the DaemonSet's hostPath volumes (an emptyDir
//     is a fresh directory of the test's own, mounted where it asks) and the
//     service account token the kubelet projects (a token bound to the pod, from the
//     TokenRequest API); with readOnlyRootFilesystem the root is remounted read-only, and
//     /sys and /proc/sys are read-only as in any unprivileged container.
//   - the container's capabilities: `setpriv` keeps exactly the securityContext's (after
//     `drop: [ALL]`, only what it adds), so iptables, ipset and `ip -n` run with no more.
//   - in-cluster configuration, as the kubelet provides it: KUBERNETES_SERVICE_HOST/PORT
//     point at the API server's bridge inside the node (standing in for the `kubernetes`
//     Service's address, which kube-proxy would route), and the token files at
//     /var/run/secrets/kubernetes.io/serviceaccount.
// What is not simulated: seccomp and AppArmor profiles, cgroup limits, the image's own files.

import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { LoggedProcess } from '../support/logged-process.ts';
import type { Obj } from './api-cluster.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const DOCKERFILE = join(REPO, 'Dockerfile');
const MAIN = join(REPO, 'src/cli/main.ts');

/** The image's paths, mapped to this checkout: the only liberty taken with the container. */
const IMAGE_PATHS: Readonly<Record<string, string>> = {
  node: process.execPath,
  '/app/dist/cli/main.js': MAIN,
};

/** The capabilities container runtimes (containerd, CRI-O, Docker) grant by default. */
const RUNTIME_DEFAULT_CAPS = ['CHOWN', 'DAC_OVERRIDE', 'FSETID', 'FOWNER', 'MKNOD', 'NET_RAW', 'SETGID', 'SETUID', 'SETFCAP', 'SETPCAP', 'NET_BIND_SERVICE', 'SYS_CHROOT', 'KILL', 'AUDIT_WRITE'];

/** The image's PATH (Debian's, as the node image sets it). */
const IMAGE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The Dockerfile's exec-form ENTRYPOINT or CMD (the last one: the final stage's). */
export function imageConfig(instruction: 'ENTRYPOINT' | 'CMD'): string[] | undefined {
  const line = readFileSync(DOCKERFILE, 'utf8')
    .split('\n')
    .filter((l) => new RegExp(`^\\s*${instruction}\\s`, 'i').test(l))
    .at(-1);
  if (line === undefined) return undefined;
  const parsed = JSON.parse(line.replace(/^\s*\w+\s+/, '')) as unknown;
  if (!Array.isArray(parsed) || !parsed.every((x) => typeof x === 'string')) throw new Error(`${DOCKERFILE}: ${instruction} is not in exec form: ${line}`);
  return parsed;
}

/** The pod the DaemonSet controller creates for a node (then bound there, as the scheduler would). */
export function daemonSetPod(ds: Obj, node: string): Obj {
  return workloadPod(ds, node, { 'pod-template-generation': String(ds.metadata.generation ?? 1) });
}

/** A pod of a Deployment's template bound to a node, as its ReplicaSet and the scheduler would
 *  make it (owned by the Deployment itself: no ReplicaSet exists without a controller manager). */
export function deploymentPod(deployment: Obj, node: string): Obj {
  return workloadPod(deployment, node, {});
}

/** The pod a Job's controller would make, bound to a node. */
export function jobPod(job: Obj, node: string): Obj {
  return workloadPod(job, node, {});
}

function workloadPod(owner: Obj, node: string, extraLabels: Record<string, string>): Obj {
  const template = structuredClone(owner.spec.template) as Obj;
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      generateName: `${owner.metadata.name}-`,
      namespace: owner.metadata.namespace,
      labels: { ...template.metadata?.labels, ...extraLabels },
      annotations: template.metadata?.annotations,
      ownerReferences: [{ apiVersion: 'apps/v1', kind: owner.kind, name: owner.metadata.name, uid: owner.metadata.uid, controller: true, blockOwnerDeletion: true }],
    },
    spec: {
      ...template.spec,
      nodeName: node,
      affinity: {
        ...template.spec.affinity,
        nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchFields: [{ key: 'metadata.name', operator: 'In', values: [node] }] }] } },
      },
    },
  };
}

/** A downward API fieldRef, read from the pod object as the kubelet reads it. */
function fieldRef(pod: Obj, path: string): string {
  const label = /^metadata\.(labels|annotations)\['(.+)'\]$/.exec(path);
  if (label) return String(pod.metadata[label[1]]?.[label[2]] ?? '');
  const value = (
    {
      'metadata.name': pod.metadata.name,
      'metadata.namespace': pod.metadata.namespace,
      'metadata.uid': pod.metadata.uid,
      'spec.nodeName': pod.spec.nodeName,
      'spec.serviceAccountName': pod.spec.serviceAccountName,
      'status.hostIP': pod.status?.hostIP,
      'status.hostIPs': (pod.status?.hostIPs ?? []).map((h: Obj) => h.ip).join(','),
      'status.podIP': pod.status?.podIP,
      'status.podIPs': (pod.status?.podIPs ?? []).map((h: Obj) => h.ip).join(','),
    } as Record<string, string | undefined>
  )[path];
  if (value === undefined) throw new Error(`downward API field ${path} is not known to this test's kubelet, or not set on pod ${pod.metadata.name}`);
  return value;
}

/** Kubernetes' $(VAR) expansion: $$ is a literal $, an unknown reference stays as written. */
export function expand(s: string, env: ReadonlyMap<string, string>): string {
  return s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, name: string | undefined) => (name === undefined ? '$' : (env.get(name) ?? m)));
}

/** The container's environment as the kubelet builds it, in order, each value expanded
 *  against the ones before it; `base` is what the kubelet adds itself (service variables). */
export function containerEnv(pod: Obj, container: Obj, base: ReadonlyMap<string, string>): Map<string, string> {
  const env = new Map(base);
  for (const e of container.env ?? []) {
    if (e.valueFrom === undefined) env.set(e.name, expand(e.value ?? '', env));
    else if (e.valueFrom.fieldRef) env.set(e.name, fieldRef(pod, e.valueFrom.fieldRef.fieldPath));
    else throw new Error(`env ${e.name}: only values and fieldRefs are resolved by this test's kubelet, got ${JSON.stringify(e.valueFrom)}`);
  }
  return env;
}

/** The argv the container runs, as the runtime builds it: command (default: the image's
 *  ENTRYPOINT) then args (default, without a command: the image's CMD), $(VAR)s expanded;
 *  the command's image paths mapped to this checkout, its flags (Node's) kept. */
export function containerArgv(container: Obj, env: ReadonlyMap<string, string>): string[] {
  const command: string[] = container.command ?? imageConfig('ENTRYPOINT') ?? [];
  const args: string[] = container.args ?? (container.command === undefined ? (imageConfig('CMD') ?? []) : []);
  const mapped = command.map((a) => {
    if (a.startsWith('--')) return expand(a, env);
    const path = IMAGE_PATHS[expand(a, env)];
    if (path === undefined) throw new Error(`the container runs "${a}", which this test cannot map to this checkout (known: ${Object.keys(IMAGE_PATHS).join(', ')})`);
    return path;
  });
  return [...mapped, ...args.map((a) => expand(a, env))];
}

/** The capabilities the container holds (a root process: exactly its bounding set). */
export function containerCaps(container: Obj): string[] {
  const sc = container.securityContext ?? {};
  if (sc.privileged) throw new Error('a privileged container: this test runs only unprivileged ones');
  const drop: string[] = sc.capabilities?.drop ?? [];
  const add: string[] = sc.capabilities?.add ?? [];
  const base = drop.includes('ALL') ? [] : RUNTIME_DEFAULT_CAPS.filter((c) => !drop.includes(c));
  return [...new Set([...base, ...add])].map((c) => c.replace(/^CAP_/, '').toLowerCase());
}

const q = (s: string): string => `'${s.replaceAll("'", `'\\''`)}'`;

export interface RunSpec {
  readonly pod: Obj;
  readonly container: Obj;
  /** The node's network namespace. */
  readonly netns: string;
  /** A directory of the test's own for staging mounts and the token files. */
  readonly dir: string;
  /** The bound service account token, the cluster CA, the pod's namespace. */
  readonly token: string;
  readonly caCrt: string;
  /** What the kubelet's in-cluster variables name: the API server as seen from the node. */
  readonly apiHost: string;
  readonly apiPort: number;
}

/** The shell script that sets up the container's mounts and capabilities, then execs its
 *  command; run as `ip netns exec NETNS unshare --mount --propagation slave bash SCRIPT`.
 *  `skipped` lists the mounts it could not make without writing to this machine's root. */
export async function containerScript(spec: RunSpec): Promise<{ script: string; skipped: string[] }> {
  const { pod, container, dir } = spec;
  const env = containerEnv(
    pod,
    container,
    new Map([
      ['KUBERNETES_SERVICE_HOST', spec.apiHost],
      ['KUBERNETES_SERVICE_PORT', String(spec.apiPort)],
      ['KUBERNETES_SERVICE_PORT_HTTPS', String(spec.apiPort)],
    ]),
  );
  const argv = containerArgv(container, env);
  // The pod's user and group apply to every container that does not set its own.
  const podSc = pod.spec.securityContext ?? {};
  const sc = { runAsUser: podSc.runAsUser, runAsGroup: podSc.runAsGroup, ...container.securityContext };
  const caps = containerCaps(container);
  const stage = join(dir, 'stage');
  const sa = join(dir, 'serviceaccount');
  await mkdir(stage, { recursive: true });
  await mkdir(sa, { recursive: true });
  await writeFile(join(sa, 'token'), spec.token, { mode: 0o644 });
  await writeFile(join(sa, 'ca.crt'), spec.caCrt, { mode: 0o644 });
  await writeFile(join(sa, 'namespace'), pod.metadata.namespace, { mode: 0o644 });

  const volumes = new Map<string, Obj>((pod.spec.volumes ?? []).map((v: Obj) => [v.name, v]));
  const lines = [
    'set -euo pipefail',
    // Never the machine's own mount namespace: everything below is for this process alone.
    '[ "$(readlink /proc/self/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ] || { echo "container: not in a private mount namespace" >&2; exit 99; }',
    'mount --make-rslave /',
  ];
  const mounts: string[] = [];
  // Mounted last: one over /tmp would hide the stage and token files the others come from.
  const emptyDirs: string[] = [];
  const skipped: string[] = [];
  (container.volumeMounts ?? []).forEach((m: Obj, i: number) => {
    const v = volumes.get(m.name);
    if (v?.emptyDir !== undefined) {
      // A fresh directory of the test's own, over a mount point of this machine's root.
      if (!existsSync(m.mountPath)) throw new Error(`emptyDir ${m.name}: no mount point ${m.mountPath} in this machine's root, which stands in for the image`);
      const src = join(stage, `v${i}`);
      lines.push(`mkdir -p ${q(src)}`);
      // Over a parent of the code the container runs (a checkout under /tmp, as in CI), that
      // code is bound back inside it, through a holding place in the fresh /run.
      const under = (p: string) => p === m.mountPath || p.startsWith(`${m.mountPath.replace(/\/$/, '')}/`);
      const keep = [REPO.replace(/\/$/, ''), dirname(process.execPath)].filter((p, j, all) => under(p) && !all.slice(0, j).some((o) => p.startsWith(`${o}/`)));
      const held = keep.map((p, j) => [p, `/run/.weir-kept-${i}-${j}`]);
      for (const [p, hold] of held) emptyDirs.push(`mkdir -p ${q(hold)}`, `mount --rbind ${q(p)} ${q(hold)}`);
      emptyDirs.push(`mount --bind ${q(src)} ${q(m.mountPath)}`, `mount --make-rprivate ${q(m.mountPath)}`);
      for (const [p, hold] of held) emptyDirs.push(`mkdir -p ${q(p)}`, `mount --rbind ${q(hold)} ${q(p)}`);
      return;
    }
    if (v?.hostPath === undefined) throw new Error(`volume ${m.name}: only hostPath and emptyDir volumes are simulated`);
    const host: string = v.hostPath.path;
    const type: string = v.hostPath.type ?? '';
    const target: string = m.mountPath.replace(/^\/var\/run(?=\/|$)/, '/run');
    const src = join(stage, `v${i}`);
    const exists = existsSync(host);
    const isFile = exists ? !statSync(host).isDirectory() : type === 'FileOrCreate' || type === 'File';
    if (!exists && (type === 'File' || type === 'Directory' || type === 'Socket' || type === 'CharDevice' || type === 'BlockDevice')) {
      throw new Error(`hostPath ${host} (type ${type}) does not exist on this node: the kubelet would not start the pod`);
    }
    // The runtime makes mount points inside the image's root; this machine's root stands in
    // for it and is never written, so a mount point is made only inside the fresh /run, or in a
    // private tmpfs over its parent (/var/log/weir: the image's /var/log has nothing else).
    const inRun = target === '/run' || target.startsWith('/run/');
    const parent = dirname(target);
    // Only under /var/log, whose files the container never needs: a tmpfs over a parent like
    // /lib would hide the machine's libraries, which stand in for the image's.
    const overParent = !inRun && !existsSync(target) && !isFile && parent.startsWith('/var/log') && existsSync(parent);
    if (!inRun && !existsSync(target) && !overParent) {
      skipped.push(`${m.mountPath} (from ${host}): no such mount point in this machine's root, which stands in for the image`);
      return;
    }
    if (overParent) mounts.push(`mount -t tmpfs -o mode=0755,size=4m weir-container-dir ${q(parent)}`, `mkdir -p ${q(target)}`);
    lines.push(isFile ? `touch ${q(src)}` : `mkdir -p ${q(src)}`);
    // A missing unchecked or *OrCreate path would be created on the node; here an empty
    // stand-in of the test's own takes its place, so that the machine is not changed.
    if (exists) lines.push(`mount --rbind ${q(host)} ${q(src)}`);
    if (inRun) mounts.push(isFile ? `touch ${q(target)}` : `mkdir -p ${q(target)}`);
    mounts.push(`mount --rbind ${q(src)} ${q(target)}`);
    if (m.readOnly) mounts.push(`mount -o remount,bind,ro ${q(target)}`);
    mounts.push(`mount ${m.mountPropagation === 'HostToContainer' ? '--make-rslave' : '--make-rprivate'} ${q(target)}`);
  });
  lines.push('mount -t tmpfs -o mode=0755,size=4m weir-container-run /run', ...mounts);
  if (pod.spec.automountServiceAccountToken !== false) {
    const target = '/run/secrets/kubernetes.io/serviceaccount';
    lines.push(`mkdir -p ${target}`, `mount --bind ${q(sa)} ${target}`, `mount -o remount,bind,ro ${target}`);
  }
  lines.push('mount -o remount,bind,ro /sys', 'mount --bind /proc/sys /proc/sys', 'mount -o remount,bind,ro /proc/sys', ...emptyDirs);
  if (sc.readOnlyRootFilesystem) lines.push('mount -o remount,bind,ro /run', 'mount -o remount,bind,ro /');
  lines.push(`cd ${q(REPO)}`);
  const setpriv = [
    'setpriv',
    `--reuid=${sc.runAsUser ?? 0}`,
    `--regid=${sc.runAsGroup ?? 0}`,
    '--clear-groups',
    '--inh-caps=-all',
    `--bounding-set=-all${caps.map((c) => `,+${c}`).join('')}`,
    ...(sc.allowPrivilegeEscalation === false ? ['--no-new-privs'] : []),
    '--',
  ];
  const envs = [['PATH', IMAGE_PATH], ['HOSTNAME', pod.spec.nodeName], ...env].map(([k, v]) => `${k}=${v}`);
  lines.push(`exec ${[...setpriv, 'env', '-i', ...envs, ...argv].map(q).join(' ')}`);
  return { script: lines.join('\n') + '\n', skipped };
}

/** A container's process on a simulated node: the container script run in the node's
 *  namespace, in a private mount namespace and a process group of its own. */
export class ContainerProcess extends LoggedProcess {
  readonly netns: string;
  /** The pod object as the API server holds it, and the container of it that runs here. */
  readonly pod: Obj;
  readonly container: Obj;
  /** Mounts of the container that could not be simulated (see containerScript). */
  readonly skippedMounts: readonly string[];

  constructor(opts: { node: string; netns: string; pod: Obj; container: Obj; script: string; skippedMounts: readonly string[] }) {
    // The script execs down to the container's process, so the child is that process.
    super(opts.node, {
      label: `container ${opts.container.name} on ${opts.node}`,
      command: 'ip',
      args: ['netns', 'exec', opts.netns, 'unshare', '--mount', '--propagation', 'slave', 'bash', opts.script],
      ownGroup: true,
      plainLinesAreErrors: true,
      graceMs: 5000,
    });
    this.netns = opts.netns;
    this.pod = opts.pod;
    this.container = opts.container;
    this.skippedMounts = opts.skippedMounts;
  }
}
