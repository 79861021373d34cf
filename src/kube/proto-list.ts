// Splits a protobuf list response into its items' bytes as the body streams in, the counterpart
// of list-splitter.ts for `application/vnd.kubernetes.protobuf`. The body is the magic "k8s\0"
// and a runtime.Unknown {typeMeta 1, raw 2, contentEncoding 3, contentType 4} whose raw bytes
// are the list: {metadata 1 (ListMeta), items 2 (repeated)}. Every item is length-prefixed, so
// an item is complete as soon as its bytes are in, with nothing scanned.

import { LENGTH_DELIMITED, ProtoError, ProtoReader } from './protobuf.ts';

const MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]);
const EMPTY = Buffer.alloc(0);

/** The fields of a list response other than its items. */
export interface ProtoListRest {
  readonly apiVersion: string;
  readonly kind: string;
  readonly metadata: { resourceVersion?: string; continue?: string };
  readonly items: [];
}

/** A varint at buf[pos...], or undefined when the buffer ends inside it. */
function varintAt(buf: Buffer, pos: number): { value: number; next: number } | undefined {
  let value = 0;
  let scale = 1;
  for (let i = pos; i < buf.length && i < pos + 10; i++) {
    const b = buf[i];
    value += (b & 0x7f) * scale;
    if (b < 0x80) return { value, next: i + 1 };
    scale *= 128;
  }
  if (buf.length - pos >= 10) throw new ProtoError('a varint longer than 10 bytes');
  return undefined;
}

export class ProtoListSplitter {
  /** Bytes received but not yet consumed. */
  #buf: Buffer = EMPTY;
  #sawMagic = false;
  /** Bytes of the list (Unknown.raw) not yet consumed; -1 outside it. */
  #listLeft = -1;
  #sawList = false;
  #apiVersion = '';
  #kind = '';
  #metadata: ProtoListRest['metadata'] = {};

  /** Feeds the next piece of the body; returns the bytes of every item it completed. They stay
   *  valid after later pushes (buffers are never written to). */
  push(chunk: Uint8Array): Buffer[] {
    const items: Buffer[] = [];
    const bytes = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const buf = this.#buf.length === 0 ? bytes : Buffer.concat([this.#buf, bytes]);
    let pos = 0;
    if (!this.#sawMagic) {
      if (buf.length < MAGIC.length) {
        this.#buf = buf;
        return items;
      }
      if (!buf.subarray(0, MAGIC.length).equals(MAGIC)) throw new ProtoError('the body does not start with the Kubernetes protobuf magic "k8s\\0"');
      this.#sawMagic = true;
      pos = MAGIC.length;
    }
    for (;;) {
      if (this.#listLeft === 0) this.#listLeft = -1;
      const tag = varintAt(buf, pos);
      if (tag === undefined) break;
      const field = tag.value >>> 3;
      const wire = tag.value & 7;
      if (wire !== LENGTH_DELIMITED) throw new ProtoError(`${this.#listLeft >= 0 ? 'list' : 'envelope'} field ${field} has wire type ${wire}`);
      const len = varintAt(buf, tag.next);
      if (len === undefined) break;
      const start = len.next;
      const header = start - pos;
      if (this.#listLeft < 0 && field === 2) {
        // Unknown.raw: step inside; its items are read one by one.
        if (this.#sawList) throw new ProtoError('the envelope holds two lists');
        this.#sawList = true;
        this.#listLeft = len.value;
        pos = start;
        continue;
      }
      const end = start + len.value;
      if (end > buf.length) break;
      if (this.#listLeft >= 0) {
        if (header + len.value > this.#listLeft) throw new ProtoError(`list field ${field} runs past the end of the list`);
        this.#listLeft -= header + len.value;
        if (field === 2) items.push(buf.subarray(start, end));
        else if (field === 1) this.#readListMeta(new ProtoReader(buf, start, end));
      } else if (field === 1) this.#readTypeMeta(new ProtoReader(buf, start, end));
      pos = end;
    }
    this.#buf = pos === buf.length ? EMPTY : buf.subarray(pos);
    return items;
  }

  /** The list's type and metadata; throws when the body did not end as one complete list. */
  finish(): ProtoListRest {
    if (!this.#sawMagic || !this.#sawList || this.#listLeft > 0 || this.#buf.length > 0) {
      throw new ProtoError('the list response ended in the middle of its protobuf message');
    }
    return { apiVersion: this.#apiVersion, kind: this.#kind, metadata: this.#metadata, items: [] };
  }

  /** runtime.TypeMeta {apiVersion 1, kind 2}. */
  #readTypeMeta(r: ProtoReader): void {
    while (r.next()) {
      if (r.field === 1) this.#apiVersion = r.string();
      else if (r.field === 2) this.#kind = r.string();
      else r.skip();
    }
  }

  /** meta/v1 ListMeta {resourceVersion 2, continue 3}. */
  #readListMeta(r: ProtoReader): void {
    const md: { resourceVersion?: string; continue?: string } = {};
    while (r.next()) {
      if (r.field === 2) md.resourceVersion = r.string();
      else if (r.field === 3) md.continue = r.string();
      else r.skip();
    }
    this.#metadata = md;
  }
}

/** A protobuf error answer (a meta/v1 Status {message 3, reason 4, code 6} in the envelope) in
 *  the JSON shape `statusOf` reads; undefined when the body is not one. */
export function decodeProtoStatus(body: Buffer): Record<string, unknown> | undefined {
  try {
    if (!body.subarray(0, MAGIC.length).equals(MAGIC)) return undefined;
    const envelope = new ProtoReader(body, MAGIC.length);
    while (envelope.next()) {
      if (envelope.field !== 2) {
        envelope.skip();
        continue;
      }
      const r = envelope.message();
      const status: Record<string, unknown> = { kind: 'Status' };
      while (r.next()) {
        if (r.field === 3) status.message = r.string();
        else if (r.field === 4) status.reason = r.string();
        else if (r.field === 6) status.code = r.number();
        else r.skip();
      }
      return status;
    }
  } catch (err) {
    if (!(err instanceof ProtoError)) throw err;
  }
  return undefined;
}
