// What the audit tests share: model pods and their events (the address book reads only Pod
// events), NFLOG events, a reader the test drives, and the lines of an audit file.

import { readFile } from 'node:fs/promises';
import type { AuditLine } from '../../../src/audit/index.ts';
import type { NflogEvent } from '../../../src/audit/pcap.ts';
import type { AuditReader, ReaderHandlers, ReaderState } from '../../../src/audit/reader.ts';
import type { ModelEvent, Pod } from '../../../src/model/types.ts';

export const pod = (namespace: string, name: string, ips: string[], extra: Partial<Pod> = {}): Pod => ({
  uid: `${namespace}/${name}`,
  namespace,
  name,
  labels: {},
  nodeName: 'node-a',
  hostNetwork: false,
  phase: 'Running',
  terminating: false,
  ips,
  ports: [],
  ...extra,
});
export const up = (p: Pod): ModelEvent => ({ kind: 'Pod', op: 'upsert', object: p });
export const del = (p: Pod): ModelEvent => ({ kind: 'Pod', op: 'delete', uid: p.uid });

/** A TCP connection 10.244.1.2:40001 -> 10.244.2.3:8080 logged under weir:AI:allow. */
export const nflogEvent = (over: Partial<NflogEvent> = {}): NflogEvent => ({
  time: Date.UTC(2026, 10, 24, 6, 44, 19, 890),
  readTime: Date.UTC(2026, 10, 24, 6, 44, 19, 891),
  prefix: 'weir:AI:allow',
  family: 4,
  protocol: 'TCP',
  srcIp: '10.244.1.2',
  srcPort: 40001,
  dstIp: '10.244.2.3',
  dstPort: 8080,
  ...over,
});

/** A reader the test drives: it hands events and states to the pipeline's handlers. */
export function testReader() {
  let handlers: ReaderHandlers | undefined;
  let state: ReaderState = 'stopped';
  const reader = (h: ReaderHandlers): AuditReader => {
    handlers = h;
    return {
      start: () => {
        state = 'running';
        h.state?.('starting');
        h.state?.('running');
      },
      stop: async () => {
        state = 'stopped';
        h.state?.('stopped');
      },
      get state() {
        return state;
      },
      pid: undefined,
      stats: () => ({ restarts: 0, queueDrops: 0, events: 0, malformed: 0 }),
    };
  };
  return { reader, emit: (batch: NflogEvent[]) => handlers!.events(batch), handlers: () => handlers! };
}

/** The lines of an audit file, parsed; none while it does not exist. */
export const readLines = async (file: string): Promise<AuditLine[]> =>
  (await readFile(file, 'utf8').catch(() => ''))
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as AuditLine);
