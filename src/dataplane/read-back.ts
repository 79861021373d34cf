// Reading Weir's own objects back from the kernel into a record, refusing when objects with its
// names are not its own, and the work such a read makes for the write that follows it.

import { emptyDirty, type DesiredDataplane, type Dirty } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import { PreconditionError } from '../errors.ts';
import type { Family } from '../model/types.ts';
import { parseIpsetTerse } from './ipset.ts';
import { emptyFamilyState, familyStateFromSave, ownSets, setsStateFromSave, type AppliedSet, type AppliedState, type FamilyState } from './state.ts';
import type { Tools } from './tools.ts';

/** How a read takes set members: all of them, or only for sets whose size changed. */
export type MemberRead = 'all' | 'counts';

export interface ReadOptions {
  readonly members?: MemberRead;
  /** The sets recorded before this read: under 'counts', a set whose header and size match
   *  its record keeps the record's members. */
  readonly recorded?: ReadonlyMap<string, AppliedSet>;
}

export interface ReadBack {
  readonly state: AppliedState;
  /** Under 'counts', the sets whose members were read because they differed from the record. */
  readonly reread: ReadonlySet<string>;
}

/**
 * Reads Weir's own objects back; throws a PreconditionError when objects with its names are not
 * its own. With `members` 'counts', set members are read only where a set's header or number of
 * entries differs from the record; elsewhere the size is taken as it is.
 */
export async function readOwn(tools: Tools, names: Names, families: readonly Family[], opts: ReadOptions = {}): Promise<ReadBack> {
  const read: { [F in Family]?: FamilyState } = {};
  const foreign: string[] = [];
  const reread = new Set<string>();
  const saved = await Promise.all(families.map((f) => tools.iptables.save(f)));
  families.forEach((f, i) => {
    read[f] = familyStateFromSave(saved[i], names, foreign);
  });
  let sets: Map<string, AppliedSet>;
  if ((opts.members ?? 'all') === 'all') sets = setsStateFromSave(await tools.ipset.save(), names, foreign);
  else {
    const headers = parseIpsetTerse(await tools.ipset.listHeaders());
    sets = ownSets(headers, names, foreign);
    for (const [name, found] of sets) {
      const had = opts.recorded?.get(name);
      const same = had !== undefined && had.type === found.type && had.family === found.family && had.maxElem === found.maxElem;
      if (same && had.size === found.size) continue;
      const full = setsStateFromSave(await tools.ipset.save(name), names).get(name);
      if (full !== undefined) sets.set(name, full);
      reread.add(name);
    }
  }
  if (foreign.length > 0) {
    throw new PreconditionError(
      `found ${foreign.length} chains or sets named like Weir's (prefix "${names.prefix}") that Weir did not write, such as ${foreign.slice(0, 5).join(', ')}: ` +
        `another program (Calico's Felix?) owns them. Weir never touches them; run it with another --chain-prefix, or remove that program.`,
    );
  }
  return { state: { sets, families: { 4: read[4] ?? emptyFamilyState(), 6: read[6] ?? emptyFamilyState() } }, reread };
}

/** After a read, everything desired or found is work; after a 'counts' read, the sets whose
 *  members were kept from the record are not. */
export function dirtyAfterRead(desired: DesiredDataplane, read: ReadBack, families: readonly Family[], members: MemberRead): Dirty {
  const all = emptyDirty();
  const fresh = read.state;
  const kept = (name: string) => members === 'counts' && !read.reread.has(name) && desired.sets.has(name) && fresh.sets.has(name);
  for (const name of [...desired.sets.keys(), ...fresh.sets.keys()]) if (!kept(name)) all.sets.set(name, 'all');
  for (const f of families) {
    for (const c of [...desired.chains[f].keys(), ...fresh.families[f].chains.keys()]) all.chains[f].add(c);
  }
  return all;
}
