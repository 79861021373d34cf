// Encodes protobuf messages field by field, so tests can build what the API server would send
// (and what it would not: unknown fields of every wire type, bodies cut short).

export type Field = Buffer;

function varint(n: number): Buffer {
  const out: number[] = [];
  let v = n;
  while (v >= 0x80) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
  return Buffer.from(out);
}

const tag = (field: number, wire: number): Buffer => varint(field * 8 + wire);

export const str = (field: number, s: string): Field => bytes(field, Buffer.from(s, 'utf8'));
export const num = (field: number, n: number): Field => Buffer.concat([tag(field, 0), varint(n)]);
export const bytes = (field: number, b: Buffer): Field => Buffer.concat([tag(field, 2), varint(b.length), b]);
export const msg = (field: number, ...parts: Field[]): Field => bytes(field, Buffer.concat(parts));
export const fixed32 = (field: number): Field => Buffer.concat([tag(field, 5), Buffer.alloc(4, 7)]);
export const fixed64 = (field: number): Field => Buffer.concat([tag(field, 1), Buffer.alloc(8, 9)]);
/** A map<string, string> entry. */
export const entry = (field: number, key: string, value: string): Field => msg(field, str(1, key), str(2, value));

/** A list response body as the API server frames it: "k8s\0" + runtime.Unknown {typeMeta 1,
 *  raw 2 (the list: metadata 1, items 2), contentEncoding 3, contentType 4}. */
export function protoList(kind: string, listMeta: Field[], items: Buffer[]): Buffer {
  const list = Buffer.concat([msg(1, ...listMeta), ...items.map((i) => bytes(2, i))]);
  return Buffer.concat([Buffer.from('k8s\0', 'latin1'), msg(1, str(1, 'v1'), str(2, kind)), bytes(2, list), str(3, ''), str(4, '')]);
}
