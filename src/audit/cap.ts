// The node-wide cap on audit lines, in user space rather than in the kernel, so that what it
// refuses can be counted by namespace (a kernel bucket cannot say whose events it skipped).
// Pure: the caller passes the time.

/** A token bucket: `perSecond` tokens a second, at most `burst` held; full at the start. */
export class TokenBucket {
  readonly #perSecond: number;
  readonly #burst: number;
  #tokens: number;
  #at: number;

  constructor(perSecond: number, burst: number, now: number) {
    if (!(perSecond > 0) || !(burst >= 1)) throw new RangeError(`token bucket needs a rate above 0 and a burst of at least 1, got ${perSecond}/s and ${burst}`);
    this.#perSecond = perSecond;
    this.#burst = burst;
    this.#tokens = burst;
    this.#at = now;
  }

  /** Takes one token at `now`, if there is one. A clock that went back refills nothing, and
   *  refills again from where it is. */
  take(now: number): boolean {
    const elapsed = now - this.#at;
    if (elapsed > 0) this.#tokens = Math.min(this.#burst, this.#tokens + (elapsed * this.#perSecond) / 1000);
    this.#at = now;
    if (this.#tokens < 1) return false;
    this.#tokens -= 1;
    return true;
  }
}
