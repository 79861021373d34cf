// The words scenarios write their expected truth tables in. Every predicate is written by hand
// from docs/semantics (never derived from Weir's code).

import { type Cell, EXTERNAL, nsOf } from './harness.ts';

export type Verdict = (x: Cell) => boolean;

export const self: Verdict = (x) => x.source === x.target;
export const none: Verdict = () => false;
export const tcp =
  (port?: number): Verdict =>
  (x) =>
    x.proto === 'tcp' && (port === undefined || x.port === port);
export const udp =
  (port?: number): Verdict =>
  (x) =>
    x.proto === 'udp' && (port === undefined || x.port === port);
export const from =
  (...sources: string[]): Verdict =>
  (x) =>
    sources.includes(x.source);
export const v =
  (family: 4 | 6): Verdict =>
  (x) =>
    x.family === family;
export const and =
  (...ps: Verdict[]): Verdict =>
  (x) =>
    ps.every((p) => p(x));
export const or =
  (...ps: Verdict[]): Verdict =>
  (x) =>
    ps.some((p) => p(x));
export const not =
  (p: Verdict): Verdict =>
  (x) =>
    !p(x);

/** Pods isolated for ingress, each with what may reach it; every other target accepts all.
 *  A pod always reaches itself. */
export function ingress(rules: Record<string, Verdict>): Verdict {
  return (x) => self(x) || !(x.target in rules) || rules[x.target](x);
}

/** One pod isolated for egress with what it may reach among the pods; others unaffected. */
export function egress(source: string, allow: Verdict): Verdict {
  return (x) => self(x) || x.source !== source || allow(x);
}

export const always: Verdict = () => true;
export const nothing: Verdict = () => false;
export const to =
  (...targets: string[]): Verdict =>
  (x) =>
    targets.includes(x.target);
export const fromNs =
  (...ns: string[]): Verdict =>
  (x) =>
    x.source !== EXTERNAL && ns.includes(nsOf(x.source));
export const toNs =
  (...ns: string[]): Verdict =>
  (x) =>
    x.target !== EXTERNAL && ns.includes(nsOf(x.target));
export const fromAnyPod: Verdict = (x) => x.source !== EXTERNAL;

/** Who each pod accepts from (ingress) or may send to (egress), for the pods isolated that way. */
export interface Isolation {
  readonly ingress?: Readonly<Record<string, Verdict>>;
  readonly egress?: Readonly<Record<string, Verdict>>;
}

/** A connection passes when the source's egress and the target's ingress both allow it (each
 *  only checked when that pod is isolated that way); a pod always reaches itself. */
export function allow(iso: Isolation): Verdict {
  return (x) => x.source === x.target || ((iso.egress?.[x.source] ?? always)(x) && (iso.ingress?.[x.target] ?? always)(x));
}
