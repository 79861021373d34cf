// The audit tag catalog: every NFLOG rule calc writes gets a short prefix, and the catalog
// keeps what each prefix means so the audit pipeline can read events back.

import type { Action } from './desired.ts';
import type { AuditCatalog, AuditTag } from './audit-tags.ts';
import { sha256Base64Url } from './hash.ts';
import type { AuditRules } from './rules.ts';

/** Bytes of each packet NFLOG copies: the IP and transport headers are all the log needs. */
export const AUDIT_COPY_BYTES = 128;
/** Tags of audit rules that were removed stay readable this long (in tags): an event the
 *  kernel logged just before the rule went may still be on its way. */
const RETIRED_TAGS = 4096;

export class TagCatalog implements AuditCatalog {
  readonly #group: number;
  /** NFLOG prefix -> what its rule means, for the rules desired now, and recently removed. */
  readonly #tags = new Map<string, AuditTag>();
  readonly #retired = new Map<string, AuditTag>();

  /** `group`: the NFLOG group the agent's reader listens on. */
  constructor(group: number) {
    this.#group = group;
  }

  lookup(prefix: string): AuditTag | undefined {
    return this.#tags.get(prefix) ?? this.#retired.get(prefix);
  }

  /** The NFLOG action of an audit rule; its tag is recorded under its prefix, which is
   *  appended to `owned` (what its owner writes now, see retire). */
  log(code: string, identity: string, tag: AuditTag, owned: string[]): Action {
    const prefix = `weir:${code}:${sha256Base64Url(identity).slice(0, 20)}`;
    this.#tags.set(prefix, tag);
    this.#retired.delete(prefix);
    owned.push(prefix);
    return { kind: 'nflog', group: this.#group, prefix, size: AUDIT_COPY_BYTES };
  }

  /** Tags an owner no longer writes move to the bounded retired map. */
  retire(before: readonly string[], after: readonly string[]): void {
    if (before.length === 0) return;
    const keep = new Set(after);
    for (const prefix of before) {
      if (keep.has(prefix)) continue;
      const tag = this.#tags.get(prefix);
      if (!tag) continue;
      this.#tags.delete(prefix);
      this.#retired.set(prefix, tag);
      if (this.#retired.size > RETIRED_TAGS) {
        const oldest = this.#retired.keys().next();
        if (!oldest.done) this.#retired.delete(oldest.value);
      }
    }
  }
}

/** What chain builders need to write audit rules; absent when the audit log is off. */
export interface AuditWriting {
  readonly rules: AuditRules;
  readonly tags: TagCatalog;
}
