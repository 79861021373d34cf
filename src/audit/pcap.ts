// An incremental parser of tcpdump's pcap stream of an NFLOG group (`tcpdump -i nflog:G -w -`):
// the global header, then records that arrive split anywhere across chunks. Each record is
// one NFLOG message (link type 239): a 4-byte header (family, version, big-endian resource
// id), then TLVs whose 16-bit length and type are in the writer's byte order (the same as the
// pcap header's, which libpcap writes in host order), each length counting its own 4-byte
// header and padded to 4 bytes. Only the prefix, the kernel timestamp and the packet's
// IP and transport headers are read. Pure: no I/O, no clock.

import { AuditStreamError } from '../errors.ts';
import { formatIpv6Groups } from '../model/cidr.ts';

export const LINKTYPE_NFLOG = 239;

/** One packet an NFLOG rule logged. */
export interface NflogEvent {
  /** The kernel's timestamp of the packet (NFULA_TIMESTAMP), or the capture time without one;
   *  milliseconds since the epoch, fraction kept. */
  readonly time: number;
  /** When tcpdump read it (the record header), milliseconds since the epoch. */
  readonly readTime: number;
  /** The rule's --nflog-prefix. */
  readonly prefix: string;
  readonly family: 4 | 6;
  /** TCP, UDP, SCTP, UDPLite, DCCP, ICMP, ICMPv6, ESP, AH, GRE, or the protocol number as text. */
  readonly protocol: string;
  /** Canonical text (IPv6 lower case, RFC 5952 compressed, as the model keeps pod IPs). */
  readonly srcIp: string;
  readonly dstIp: string;
  /** null for a protocol without ports, or a fragment that is not the first. */
  readonly srcPort: number | null;
  readonly dstPort: number | null;
}

export interface PcapParserStats {
  /** Records read. */
  readonly records: number;
  /** Records decoded into events. */
  readonly events: number;
  /** Records skipped: no prefix or payload, not IP, cut too short to hold the addresses. */
  readonly malformed: number;
}

const GLOBAL_HEADER = 24;
const RECORD_HEADER = 16;
/** libpcap's largest snapshot length; no NFLOG message a rule with --nflog-size sends comes near it. */
const MAX_RECORD = 262_144 + 4096;

const NFULA_TIMESTAMP = 3;
const NFULA_PAYLOAD = 9;
const NFULA_PREFIX = 10;
/** Netlink attribute types carry two flag bits (nested, network byte order). */
const NLA_TYPE_MASK = 0x3fff;

const PROTOCOLS: Record<number, string> = { 1: 'ICMP', 6: 'TCP', 17: 'UDP', 33: 'DCCP', 47: 'GRE', 50: 'ESP', 51: 'AH', 58: 'ICMPv6', 132: 'SCTP', 136: 'UDPLite' };
/** Protocols whose header starts with 16-bit source and destination ports. */
const WITH_PORTS = new Set([6, 17, 33, 132, 136]);
/** IPv6 extension headers whose length is (byte 1 + 1) * 8: hop-by-hop, routing,
 *  destination options, mobility, HIP, shim6. */
const IPV6_EXT = new Set([0, 43, 60, 135, 139, 140]);

export class NflogPcapParser {
  #pending: Uint8Array | null = null;
  /** Stream bytes consumed before #pending, for error offsets. */
  #consumed = 0;
  #little = true;
  /** Divides the record header's fraction into milliseconds (1e3 for micro, 1e6 for nano). */
  #fracPerMs = 1000;
  #headerRead = false;
  #records = 0;
  #events = 0;
  #malformed = 0;

  get stats(): PcapParserStats {
    return { records: this.#records, events: this.#events, malformed: this.#malformed };
  }

  /** Bytes held back as the start of an incomplete record (or header). */
  get pending(): number {
    return this.#pending?.length ?? 0;
  }

  /** Feeds the next chunk of the stream; returns the events of every record it completed.
   *  Throws AuditStreamError when the stream is not an NFLOG pcap stream. */
  push(chunk: Uint8Array): NflogEvent[] {
    let data: Uint8Array = chunk;
    if (this.#pending !== null) {
      const joined = new Uint8Array(this.#pending.length + chunk.length);
      joined.set(this.#pending, 0);
      joined.set(chunk, this.#pending.length);
      data = joined;
      this.#pending = null;
    }
    const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    const out: NflogEvent[] = [];
    let o = 0;
    if (!this.#headerRead) {
      if (data.length < GLOBAL_HEADER) {
        this.#pending = data.slice();
        return out;
      }
      this.#readGlobalHeader(view);
      o = GLOBAL_HEADER;
    }
    const little = this.#little;
    while (data.length - o >= RECORD_HEADER) {
      const len = view.getUint32(o + 8, little);
      if (len > MAX_RECORD) throw new AuditStreamError(this.#consumed + o, `record of ${len} bytes, longer than any NFLOG message: the stream is corrupt`);
      if (data.length - o - RECORD_HEADER < len) break;
      const readTime = view.getUint32(o, little) * 1000 + view.getUint32(o + 4, little) / this.#fracPerMs;
      this.#records++;
      const e = decodeRecord(data, view, o + RECORD_HEADER, len, little, readTime);
      if (e === null) this.#malformed++;
      else {
        this.#events++;
        out.push(e);
      }
      o += RECORD_HEADER + len;
    }
    if (o < data.length) this.#pending = data.slice(o);
    this.#consumed += o;
    return out;
  }

  #readGlobalHeader(view: DataView): void {
    const magic = view.getUint32(0, true);
    if (magic === 0xa1b2c3d4 || magic === 0xa1b23c4d) this.#little = true;
    else if (magic === 0xd4c3b2a1 || magic === 0x4d3cb2a1) this.#little = false;
    else throw new AuditStreamError(0, `not a pcap stream (magic 0x${magic.toString(16).padStart(8, '0')})`);
    this.#fracPerMs = magic === 0xa1b23c4d || magic === 0x4d3cb2a1 ? 1e6 : 1e3;
    // The upper bits of the link type field carry FCS information; the type is the low 28.
    const linkType = view.getUint32(20, this.#little) & 0x0fffffff;
    if (linkType !== LINKTYPE_NFLOG) throw new AuditStreamError(20, `link type ${linkType}, not NFLOG (${LINKTYPE_NFLOG})`);
    this.#headerRead = true;
  }
}

/** One NFLOG record (from `start`, `len` bytes) to an event, or null when it cannot be read. */
function decodeRecord(data: Uint8Array, view: DataView, start: number, len: number, little: boolean, readTime: number): NflogEvent | null {
  const end = start + len;
  let prefix: string | null = null;
  let time = readTime;
  let payload = -1;
  let payloadEnd = -1;
  for (let o = start + 4; o + 4 <= end; ) {
    const tlvLen = view.getUint16(o, little);
    if (tlvLen < 4 || o + tlvLen > end) return null;
    const type = view.getUint16(o + 2, little) & NLA_TYPE_MASK;
    const v = o + 4;
    const vEnd = o + tlvLen;
    if (type === NFULA_PREFIX) {
      let z = v;
      while (z < vEnd && data[z] !== 0) z++;
      prefix = latin1(data, v, z);
    } else if (type === NFULA_PAYLOAD) {
      payload = v;
      payloadEnd = vEnd;
    } else if (type === NFULA_TIMESTAMP && tlvLen >= 20) {
      // struct nfulnl_msg_packet_timestamp: big-endian 64-bit seconds and microseconds.
      const sec = view.getUint32(v, false) * 2 ** 32 + view.getUint32(v + 4, false);
      const usec = view.getUint32(v + 8, false) * 2 ** 32 + view.getUint32(v + 12, false);
      time = sec * 1000 + usec / 1000;
    }
    o += (tlvLen + 3) & ~3;
  }
  if (prefix === null || payload < 0) return null;
  return decodeIp(data, view, payload, payloadEnd, prefix, time, readTime);
}

function decodeIp(data: Uint8Array, view: DataView, p: number, end: number, prefix: string, time: number, readTime: number): NflogEvent | null {
  if (end - p < 1) return null;
  const version = data[p] >> 4;
  let proto: number;
  let l4: number;
  let srcIp: string;
  let dstIp: string;
  let family: 4 | 6;
  let fragment = false;
  if (version === 4) {
    const ihl = (data[p] & 0x0f) * 4;
    if (ihl < 20 || end - p < 20) return null;
    family = 4;
    proto = data[p + 9];
    fragment = (view.getUint16(p + 6, false) & 0x1fff) !== 0;
    srcIp = formatIpv4(data, p + 12);
    dstIp = formatIpv4(data, p + 16);
    l4 = p + ihl;
  } else if (version === 6) {
    if (end - p < 40) return null;
    family = 6;
    srcIp = formatIpv6(data, p + 8);
    dstIp = formatIpv6(data, p + 24);
    proto = data[p + 6];
    l4 = p + 40;
    // Walk the extension headers as far as the captured bytes go.
    for (;;) {
      if (IPV6_EXT.has(proto)) {
        if (end - l4 < 2) break;
        const next = data[l4];
        l4 += (data[l4 + 1] + 1) * 8;
        proto = next;
      } else if (proto === 44) {
        if (end - l4 < 8) break;
        if ((view.getUint16(l4 + 2, false) & 0xfff8) !== 0) fragment = true;
        proto = data[l4];
        l4 += 8;
      } else if (proto === 51) {
        if (end - l4 < 2) break;
        const next = data[l4];
        l4 += (data[l4 + 1] + 2) * 4;
        proto = next;
      } else break;
    }
  } else return null;
  const hasPorts = WITH_PORTS.has(proto) && !fragment && end - l4 >= 4;
  return {
    time,
    readTime,
    prefix,
    family,
    protocol: PROTOCOLS[proto] ?? String(proto),
    srcIp,
    dstIp,
    srcPort: hasPorts ? view.getUint16(l4, false) : null,
    dstPort: hasPorts ? view.getUint16(l4 + 2, false) : null,
  };
}

function latin1(data: Uint8Array, from: number, to: number): string {
  let s = '';
  for (let i = from; i < to; i++) s += String.fromCharCode(data[i]);
  return s;
}

export function formatIpv4(b: Uint8Array, o: number): string {
  return `${b[o]}.${b[o + 1]}.${b[o + 2]}.${b[o + 3]}`;
}

/** RFC 5952 text of the 16 bytes at `o`, the same as the model's formatIp (without bigints:
 *  this runs for every event). */
export function formatIpv6(b: Uint8Array, o: number): string {
  const g = new Array<number>(8);
  for (let i = 0; i < 8; i++) g[i] = (b[o + 2 * i] << 8) | b[o + 2 * i + 1];
  return formatIpv6Groups(g);
}
