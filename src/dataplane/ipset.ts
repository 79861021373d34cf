// A small typed wrapper around the ipset command: batch restore through stdin, and reading
// sets back (names, or `ipset save` parsed into headers and members).

import { netMember, type SetType } from '../calc/desired.ts';
import { CommandError, RestoreError } from '../errors.ts';
import type { Family } from '../model/types.ts';
import { ipsetPayload, ipsetPieces, type SetLine } from './render.ts';
import type { CommandRunner } from '../exec/runner.ts';

export interface Ipset {
  /** Runs `ipset restore` with the lines on stdin, streamed a piece at a time; throws
   *  RestoreError naming the bad line. */
  restore(lines: readonly SetLine[]): Promise<void>;
  /** `ipset list -name`. */
  listNames(): Promise<string[]>;
  /** `ipset save [name]`: create and add lines. */
  save(name?: string): Promise<string>;
  /** `ipset list -terse`: every set's header and number of entries, without members. */
  listHeaders(): Promise<string>;
}

export function createIpset(runner: CommandRunner): Ipset {
  const read = async (args: string[]) => {
    const r = await runner.run('ipset', args);
    if (r.exitCode !== 0) throw new CommandError('WEIR_KERNEL_READ_FAILED', 'ipset', args, r.exitCode, r.stderr);
    return r.stdout;
  };
  return {
    async restore(lines) {
      if (lines.length === 0) return;
      const r = await runner.run('ipset', ['restore'], { input: { [Symbol.iterator]: () => ipsetPieces(lines) } });
      if (r.exitCode !== 0) throw new RestoreError('ipset restore', undefined, r.stderr, ipsetPayload(lines));
    },
    async listNames() {
      return (await read(['list', '-name'])).split('\n').filter((l) => l !== '');
    },
    save(name) {
      return read(name === undefined ? ['save'] : ['save', name]);
    },
    listHeaders() {
      return read(['list', '-terse']);
    },
  };
}

export interface SavedSet {
  readonly name: string;
  /** As ipset names it; may be a type Weir never creates. */
  readonly type: string;
  readonly family: Family | undefined;
  readonly maxElem: number | undefined;
  /** Created with the comment extension: the mark of a set Weir wrote. */
  readonly commented: boolean;
  readonly members: string[];
}

/** Parses `ipset save` output. Unknown lines are ignored. */
export function parseIpsetSave(text: string): Map<string, SavedSet> {
  const sets = new Map<string, SavedSet>();
  for (const line of text.split('\n')) {
    const w = line.trim().split(/\s+/);
    if (w[0] === 'create' && w.length >= 3) {
      const opt = (k: string) => {
        const i = w.indexOf(k, 3);
        return i > 0 ? w[i + 1] : undefined;
      };
      const fam = opt('family');
      const max = opt('maxelem');
      sets.set(w[1], {
        name: w[1],
        type: w[2],
        family: fam === 'inet' ? 4 : fam === 'inet6' ? 6 : undefined,
        maxElem: max === undefined ? undefined : Number(max),
        commented: w.indexOf('comment', 3) > 0,
        members: [],
      });
    } else if (w[0] === 'add' && w.length >= 3) {
      sets.get(w[1])?.members.push(w[2]);
    }
  }
  return sets;
}

/** Parses `ipset list -terse` output: headers as `ipset save` gives them (members empty),
 *  with each set's number of entries. */
export function parseIpsetTerse(text: string): Map<string, SavedSet & { readonly entries: number }> {
  const sets = new Map<string, SavedSet & { entries: number }>();
  let name: string | undefined;
  let type = '';
  let header: string[] = [];
  for (const line of text.split('\n')) {
    const colon = line.indexOf(':');
    if (colon < 0) continue;
    const key = line.slice(0, colon).trim();
    const value = line.slice(colon + 1).trim();
    if (key === 'Name') {
      name = value;
      type = '';
      header = [];
    } else if (key === 'Type') type = value;
    else if (key === 'Header') header = value.split(/\s+/);
    else if (key === 'Number of entries' && name !== undefined) {
      const opt = (k: string) => {
        const i = header.indexOf(k);
        return i >= 0 ? header[i + 1] : undefined;
      };
      const fam = opt('family');
      const max = opt('maxelem');
      sets.set(name, {
        name,
        type,
        family: fam === 'inet' ? 4 : fam === 'inet6' ? 6 : undefined,
        maxElem: max === undefined ? undefined : Number(max),
        commented: header.includes('comment'),
        members: [],
        entries: Number(value),
      });
    }
  }
  return sets;
}

/**
 * The form the kernel prints a member in, so members calc wrote and members read back compare
 * equal: hash:net prints a full-length prefix as a bare address, and IPv6 in lower case.
 */
export function memberKey(type: SetType | string, member: string): string {
  const m = member.toLowerCase();
  return type === 'hash:net' ? netMember(m) : m;
}
