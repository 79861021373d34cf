// Hand-built desired dataplanes for dataplane tests (unit and kernel).

import type { DesiredDataplane, DesiredSet, Rule, SetType } from '../../../src/calc/desired.ts';
import type { Family } from '../../../src/model/types.ts';

export function set(name: string, family: Family, members: string[], type: SetType = 'hash:net'): DesiredSet {
  return { name, family, type, members: new Set(members) };
}

export function desired(spec: {
  readonly sets?: readonly DesiredSet[];
  readonly chains4?: Readonly<Record<string, readonly Rule[]>>;
  readonly chains6?: Readonly<Record<string, readonly Rule[]>>;
  readonly top?: string;
}): DesiredDataplane {
  return {
    sets: new Map((spec.sets ?? []).map((s) => [s.name, s])),
    chains: { 4: new Map(Object.entries(spec.chains4 ?? {})), 6: new Map(Object.entries(spec.chains6 ?? {})) },
    topChain: spec.top ?? 'cali-FORWARD',
  };
}

export const accept: Rule = { matches: [], action: { kind: 'accept' } };
export const jump = (chain: string, comment?: string): Rule => ({ matches: [], action: { kind: 'jump', chain }, comment });
export const fromSet = (setName: string, comment?: string): Rule => ({
  matches: [{ kind: 'set', set: setName, dir: 'src' }],
  action: { kind: 'accept' },
  comment,
});
