// Connectivity matrices: every (source, target, family, proto, port) probed at once from inside
// the sources' namespaces, plus the expected-matrix builder, a diff and a text rendering used by
// assertions and by the demo.

import { connect } from 'node:net';
import { ConfigError, WeirError } from '../errors.ts';
import { FAMILIES, type Family, familyOf } from '../model/types.ts';
import type { Cluster, Endpoint } from './cluster.ts';
import { onLines, type ProbeProto, type ProbeRequest, type ProbeResult } from './probe-protocol.ts';

/** Long enough for a first packet's neighbour resolution, short enough to keep a wave quick. */
export const DEFAULT_PROBE_TIMEOUT_MS = 250;
export const DEFAULT_RETRIES = 1;
/** How long past its own timeout a server may take to answer before we call it broken. */
const ANSWER_GRACE_MS = 5_000;
const PROTOS: readonly ProbeProto[] = ['tcp', 'udp'];

export type MatrixCluster = Pick<Cluster, 'pods' | 'external' | 'endpoint' | 'ports'>;

export interface MatrixOptions {
  /** Endpoint keys. Default: every pod, then the external host. */
  readonly sources?: readonly string[];
  /** Endpoint keys. Default: every pod. */
  readonly targets?: readonly string[];
  /** Default: the cluster's ports. */
  readonly ports?: readonly number[];
  readonly protos?: readonly ProbeProto[];
  readonly families?: readonly Family[];
  /** Per probe. Default DEFAULT_PROBE_TIMEOUT_MS. */
  readonly timeoutMs?: number;
  /** Extra waves for the cells that failed; a blocked cell costs (retries + 1) timeouts.
   *  Default DEFAULT_RETRIES. A drop is a drop on every wave, so retries only absorb
   *  scheduling stalls on a loaded machine (a starved server misses its timeout). */
  readonly retries?: number;
}

export interface Cell {
  readonly source: string;
  readonly target: string;
  readonly family: Family;
  readonly proto: ProbeProto;
  readonly port: number;
}

export interface Matrix {
  readonly sources: readonly string[];
  readonly targets: readonly string[];
  readonly families: readonly Family[];
  readonly protos: readonly ProbeProto[];
  readonly ports: readonly number[];
  /** cellKey -> allowed. Only cells where both ends have the family exist. */
  readonly cells: ReadonlyMap<string, boolean>;
}

export function cellKey(c: Cell): string {
  return `${c.source}|${c.target}|${c.family}|${c.proto}|${c.port}`;
}

interface Plan {
  readonly shape: Omit<Matrix, 'cells'>;
  readonly probes: readonly { readonly cell: Cell; readonly from: Endpoint; readonly ip: string }[];
}

function ipOf(ep: Endpoint, family: Family): string | undefined {
  return ep.ips.find((ip) => familyOf(ip) === family);
}

/** The cells a matrix covers. Single-stack ends are skipped for the family they lack. */
export function planMatrix(cluster: MatrixCluster, opts: MatrixOptions = {}): Plan {
  const pods = cluster.pods().map((p) => p.key);
  const shape = {
    sources: opts.sources ?? [...pods, ...(cluster.external ? [cluster.external.key] : [])],
    targets: opts.targets ?? pods,
    families: opts.families ?? FAMILIES,
    protos: opts.protos ?? PROTOS,
    ports: opts.ports ?? cluster.ports,
  };
  const lookup = (key: string, role: string): Endpoint | string => cluster.endpoint(key) ?? `unknown ${role} ${key}`;
  const sources = shape.sources.map((k) => lookup(k, 'source'));
  const targets = shape.targets.map((k) => lookup(k, 'target'));
  const unknown = [...sources, ...targets].filter((e): e is string => typeof e === 'string');
  if (unknown.length) throw new ConfigError(unknown);

  const probes: Plan['probes'][number][] = [];
  for (const from of sources as Endpoint[]) {
    for (const to of targets as Endpoint[]) {
      for (const family of shape.families) {
        const ip = ipOf(to, family);
        if (!ip || !ipOf(from, family)) continue;
        for (const proto of shape.protos) {
          for (const port of shape.ports) {
            probes.push({ cell: { source: from.key, target: to.key, family, proto, port }, from, ip });
          }
        }
      }
    }
  }
  return { shape, probes };
}

/** The matrix a test expects: same cells as probeMatrix would cover, verdicts from `allowed`. */
export function expectMatrix(cluster: MatrixCluster, opts: MatrixOptions, allowed: (c: Cell) => boolean): Matrix {
  const { shape, probes } = planMatrix(cluster, opts);
  return { ...shape, cells: new Map(probes.map((p) => [cellKey(p.cell), allowed(p.cell)])) };
}

/** Probes every cell concurrently, so a whole matrix costs about one timeout per wave. */
export async function probeMatrix(cluster: MatrixCluster, opts: MatrixOptions = {}): Promise<Matrix> {
  const { shape, probes } = planMatrix(cluster, opts);
  const timeoutMs = opts.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS;
  const clients = new Map<string, ProbeClient>();
  try {
    for (const p of probes) if (!clients.has(p.from.key)) clients.set(p.from.key, await openProbeClient(p.from));
    const cells = new Map<string, boolean>();
    let todo = probes;
    for (let wave = 0; wave <= (opts.retries ?? DEFAULT_RETRIES) && todo.length > 0; wave++) {
      const oks = await Promise.all(
        todo.map(async ({ cell, ip }) => {
          const res = await clients.get(cell.source)!.probe({ proto: cell.proto, ip, port: cell.port, timeoutMs });
          // A reply from the wrong server means the simulation itself is miswired.
          if (res.ok && res.reply !== cell.target) {
            throw new WeirError('WEIR_COMMAND_FAILED', `${describeCell(cell)} (${ip}) was answered by "${res.reply}"`);
          }
          return res.ok;
        }),
      );
      todo.forEach((p, i) => {
        cells.set(cellKey(p.cell), oks[i]);
      });
      todo = todo.filter((_, i) => !oks[i]);
    }
    // Re-insert in plan order so that iteration order does not depend on the retries.
    return { ...shape, cells: new Map(probes.map((p) => [cellKey(p.cell), cells.get(cellKey(p.cell))!])) };
  } finally {
    for (const c of clients.values()) c.close();
  }
}

export function describeCell(c: Cell): string {
  return `${c.source} -> ${c.target} ${c.proto}/${c.port} v${c.family}`;
}

const verdict = (v: boolean | undefined) => (v === undefined ? 'not probed' : v ? 'ALLOW' : 'DROP');

/** Every cell where the matrices disagree, as `a -> b tcp/81 v6: expected DROP, got ALLOW`. */
export function diffMatrix(expected: Matrix, actual: Matrix): string[] {
  const out: string[] = [];
  const keys = [...expected.cells.keys(), ...[...actual.cells.keys()].filter((k) => !expected.cells.has(k))];
  for (const k of keys) {
    const want = expected.cells.get(k);
    const got = actual.cells.get(k);
    if (want === got) continue;
    const [source, target, family, proto, port] = k.split('|');
    const cell = { source, target, family: Number(family) as Family, proto: proto as ProbeProto, port: Number(port) };
    out.push(`${describeCell(cell)}: expected ${verdict(want)}, got ${verdict(got)}`);
  }
  return out;
}

/** One table per family: rows are sources, columns targets; each cell has one group per port
 *  with a letter per protocol (T = tcp allowed, U = udp allowed, . = blocked, - = not probed). */
export function renderMatrix(m: Matrix): string {
  const letter: Record<ProbeProto, string> = { tcp: 'T', udp: 'U' };
  const blocks: string[] = [];
  for (const family of m.families) {
    const has = (source: string, target: string) => m.protos.some((proto) => m.ports.some((port) => m.cells.has(cellKey({ source, target, family, proto, port }))));
    const rows = m.sources.filter((s) => m.targets.some((t) => has(s, t)));
    const cols = m.targets.filter((t) => m.sources.some((s) => has(s, t)));
    if (rows.length === 0) continue;
    const cellText = (source: string, target: string) =>
      m.ports
        .map((port) =>
          m.protos
            .map((proto) => {
              const v = m.cells.get(cellKey({ source, target, family, proto, port }));
              return v === undefined ? '-' : v ? letter[proto] : '.';
            })
            .join(''),
        )
        .join(' ');
    const rowWidth = Math.max(...rows.map((r) => r.length));
    const colWidth = cols.map((c) => Math.max(c.length, m.ports.length * (m.protos.length + 1) - 1));
    const line = (head: string, cells: string[]) => [head.padEnd(rowWidth), ...cells.map((c, i) => c.padEnd(colWidth[i]))].join('  ').trimEnd();
    const legend = `IPv${family}  ports ${m.ports.join(' ')}, letters ${m.protos.map((p) => `${letter[p]}=${p}`).join(' ')}, .=blocked`;
    blocks.push(
      [
        legend,
        line('', cols),
        ...rows.map((r) =>
          line(
            r,
            cols.map((c) => cellText(r, c)),
          ),
        ),
      ].join('\n'),
    );
  }
  return blocks.join('\n\n');
}

export interface ProbeClient {
  probe(req: Omit<ProbeRequest, 'id'>): Promise<ProbeResult>;
  close(): void;
}

/** One connection to a pod server's control socket; many probes in flight on it. */
export async function openProbeClient(ep: Pick<Endpoint, 'key' | 'socketPath'>): Promise<ProbeClient> {
  const broken = (why: string, cause?: unknown) => new WeirError('WEIR_COMMAND_FAILED', `pod server of ${ep.key} (${ep.socketPath}): ${why}`, { cause });
  const sock = connect(ep.socketPath);
  await new Promise<void>((resolve, reject) => {
    sock.once('connect', resolve);
    sock.once('error', (e) => reject(broken('cannot connect', e)));
  });
  const pending = new Map<number, { resolve: (r: ProbeResult) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  let nextId = 1;
  let closed: Error | undefined;
  const failAll = (err: Error) => {
    closed ??= err;
    for (const p of pending.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    pending.clear();
  };
  onLines(sock, (line) => {
    if (closed) return; // an unreadable answer ended the connection
    let res: ProbeResult;
    try {
      res = JSON.parse(line) as ProbeResult;
    } catch (err) {
      failAll(broken(`unreadable answer: ${line.slice(0, 100)}`, err));
      sock.destroy();
      return;
    }
    const p = pending.get(res.id);
    if (!p) return;
    pending.delete(res.id);
    clearTimeout(p.timer);
    p.resolve(res);
  });
  sock.on('error', (e) => failAll(broken('connection failed', e)));
  sock.on('close', () => failAll(broken('connection closed')));
  return {
    probe(req) {
      return new Promise((resolve, reject) => {
        if (closed) return reject(closed);
        const id = nextId++;
        const timer = setTimeout(() => {
          pending.delete(id);
          reject(broken(`no answer to ${req.proto} ${req.ip}:${req.port}`));
        }, req.timeoutMs + ANSWER_GRACE_MS);
        pending.set(id, { resolve, reject, timer });
        sock.write(JSON.stringify({ ...req, id }) + '\n');
      });
    },
    close() {
      sock.destroy();
    },
  };
}
