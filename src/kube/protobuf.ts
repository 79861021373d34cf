// The protobuf wire format, as far as reading the API server's answers needs it: fields are
// walked by tag, and every field not asked for is skipped by its length without being decoded.
// That skipping is the point: a pod's containers, conditions and managedFields are most of its
// bytes, and Weir needs none of them. Only wire types 0 (varint), 1 (64-bit), 2 (length-
// delimited) and 5 (32-bit) exist in Kubernetes' messages; groups (3, 4) are refused.

export const VARINT = 0;
export const FIXED64 = 1;
export const LENGTH_DELIMITED = 2;
export const FIXED32 = 5;

/** A message that does not follow the wire format (cut short, a bad tag, a length past its end). */
export class ProtoError extends Error {
  override name = 'ProtoError';
}

/** Reads the fields of one message: `buf[pos, end)`. */
export class ProtoReader {
  readonly buf: Buffer;
  pos: number;
  readonly end: number;
  /** The field number and wire type of the field just read by next(). */
  field = 0;
  wire = 0;

  constructor(buf: Buffer, pos = 0, end = buf.length) {
    this.buf = buf;
    this.pos = pos;
    this.end = end;
  }

  /** Reads the next field's tag; false at the end of the message. */
  next(): boolean {
    if (this.pos >= this.end) return false;
    const tag = this.varint();
    this.field = tag >>> 3;
    this.wire = tag & 7;
    if (this.field === 0) throw new ProtoError(`field number 0 at byte ${this.pos}`);
    return true;
  }

  /** A varint up to 2^53 (int32, int64 and bool fields; Kubernetes' are all far smaller). */
  varint(): number {
    let result = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new ProtoError('a varint runs past the end of its message');
      const b = this.buf[this.pos++];
      result += (b & 0x7f) * scale;
      if (b < 0x80) return result;
      scale *= 128;
    }
    throw new ProtoError('a varint longer than 10 bytes');
  }

  /** The extent of a length-delimited field's payload, moving past it. */
  span(): [number, number] {
    if (this.wire !== LENGTH_DELIMITED) throw new ProtoError(`field ${this.field} has wire type ${this.wire}, not length-delimited`);
    const len = this.varint();
    const start = this.pos;
    if (len > this.end - start) throw new ProtoError(`field ${this.field} runs ${len - (this.end - start)} bytes past the end of its message`);
    this.pos = start + len;
    return [start, start + len];
  }

  string(): string {
    const [start, end] = this.span();
    return this.buf.toString('utf8', start, end);
  }

  /** A nested message's reader; this reader moves past it. */
  message(): ProtoReader {
    const [start, end] = this.span();
    return new ProtoReader(this.buf, start, end);
  }

  /** A varint field's value; a bool is `!== 0`. */
  number(): number {
    if (this.wire !== VARINT) throw new ProtoError(`field ${this.field} has wire type ${this.wire}, not varint`);
    return this.varint();
  }

  /** Moves past the field whose tag next() just read. */
  skip(): void {
    switch (this.wire) {
      case VARINT:
        this.varint();
        return;
      case FIXED64:
        this.#advance(8);
        return;
      case LENGTH_DELIMITED:
        this.span();
        return;
      case FIXED32:
        this.#advance(4);
        return;
      default:
        throw new ProtoError(`field ${this.field} has wire type ${this.wire}, which Kubernetes does not use`);
    }
  }

  #advance(n: number): void {
    if (n > this.end - this.pos) throw new ProtoError(`field ${this.field} runs past the end of its message`);
    this.pos += n;
  }
}
