// What a reflector (./reflector.ts) is told about a collection: where it lives, and how its raw
// objects read (a codec, plus the lenient identity of objects that do not decode). Pure.

import { isRecord } from '../records.ts';

/** Where a collection lives; `kind` names it in logs and watch events. */
export interface Collection<K extends string = string> {
  readonly kind: K;
  /** Collection path (across all namespaces for a namespaced kind). */
  readonly path: string;
  readonly fieldSelector?: string;
  /** Decodes one item of a protobuf list into the JSON shape the codec reads; given, lists ask
   *  for protobuf (watches stay JSON: their events are few and small). */
  readonly protobuf?: (item: Buffer) => unknown;
  /** The API server may not serve it (a CRD not installed): a list answered 404 then counts as
   *  an empty list, said once in the log, and is tried again at each periodic relist. */
  readonly optional?: boolean;
}

/** Identity read leniently from a raw object, for deletes and for messages about objects that
 *  do not decode. */
export interface RawRef {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  /** namespace/name (or name): at most one object holds a name at a time, whatever its uid. */
  readonly key: string;
}

export interface Decoded<T> {
  /** The cache key (may differ from the name, e.g. a pod's uid). */
  readonly key: string;
  /** Same form as RawRef.key. */
  readonly name: string;
  readonly value: T;
  /** What is held in place of `value` until the next version, when less is needed to compare
   *  that with it (Codec.same). Default: the value. */
  readonly held?: T;
  /** Problems the conversion survived, logged when the value is stored. */
  readonly warnings: readonly string[];
}

export interface Codec<T> {
  /** Throws a WeirError when the object cannot be used: it is logged once and treated as absent. */
  decode(raw: unknown): Decoded<T>;
  /** Whether what is held (Decoded.held, else value) and what a new version would hold are
   *  the same: then there is no change worth reporting. */
  same(a: T, b: T): boolean;
  ref(raw: unknown): RawRef;
  /** The key of a held value (Decoded.key), when it may differ from its name. Default: the name. */
  keyOf?(held: T): string;
  /** Whether a DELETED event for `ref` removes `held`, stored under the same name. Default: yes.
   *  (A late delete of an older pod must not remove the new pod of the same name.) */
  deletes?(held: T, ref: RawRef): boolean;
}

/** metadata.resourceVersion of a raw object, '' if absent. */
export function resourceVersionOf(raw: unknown): string {
  const md = isRecord(raw) && isRecord(raw.metadata) ? raw.metadata : {};
  return typeof md.resourceVersion === 'string' ? md.resourceVersion : '';
}

/** Identity of a raw object; a namespaced object without a namespace is in "default", as the
 *  API server would put it. */
export function rawRefOf(raw: unknown, namespaced: boolean): RawRef {
  const md = isRecord(raw) && isRecord(raw.metadata) ? raw.metadata : {};
  const text = (v: unknown) => (typeof v === 'string' ? v : '');
  const name = text(md.name);
  const namespace = namespaced ? text(md.namespace) || 'default' : '';
  return { namespace, name, uid: text(md.uid), key: namespaced ? `${namespace}/${name}` : name };
}
