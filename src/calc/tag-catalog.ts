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
  /** How many owners' lists hold each prefix: one rule's tag may be written for many pods
   *  (a ClusterNetworkPolicy rule in every subject's chain), and stays while any does. */
  readonly #owners = new Map<string, number>();
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
    this.own([prefix], owned);
    return { kind: 'nflog', group: this.#group, prefix, size: AUDIT_COPY_BYTES };
  }

  /** Adds an owner to prefixes already logged (rules built once and reused). */
  own(prefixes: readonly string[], owned: string[]): void {
    for (const prefix of prefixes) {
      this.#owners.set(prefix, (this.#owners.get(prefix) ?? 0) + 1);
      owned.push(prefix);
    }
  }

  /** An owner gives up its list (after logging its new one, so a prefix both hold stays): a
   *  prefix no owner lists any more moves to the bounded retired map. */
  release(owned: readonly string[]): void {
    for (const prefix of owned) {
      const n = (this.#owners.get(prefix) ?? 0) - 1;
      if (n > 0) {
        this.#owners.set(prefix, n);
        continue;
      }
      this.#owners.delete(prefix);
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
