// A bounded pool of shared instances, one per key: what many model objects repeat (pod labels,
// policies' selectors and rules) is held once. Model objects are never mutated, which is what
// makes sharing them safe. When full the pool starts afresh: values already handed out stay
// valid, they are only no longer shared with later ones, so unique values cannot grow it without end.

export const DEFAULT_POOL_LIMIT = 20_000;

export class Pool<T> {
  readonly #byKey = new Map<string, T>();
  readonly #limit: number;

  constructor(limit = DEFAULT_POOL_LIMIT) {
    this.#limit = limit;
  }

  /** The value held for `key`, or `value`, which is then held for it. */
  get(key: string, value: T): T {
    const held = this.#byKey.get(key);
    if (held !== undefined) return held;
    if (this.#byKey.size >= this.#limit) this.#byKey.clear();
    this.#byKey.set(key, value);
    return value;
  }
}
