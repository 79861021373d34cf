// The manifest source: a directory of YAML/JSON manifests, watched, fed as model events.
// fs.watch gives low latency; a slow poll repairs the events fs.watch can miss. Every pass
// stats all files but reads only those that changed, and emits exactly the diff of the view.

import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { ConfigError, ManifestParseError } from '../../errors.ts';
import type { Logger } from '../../log.ts';
import type { Source, SourceBatch } from '../types.ts';
import { compareStrings } from '../../model/order.ts';
import { diffViews } from '../view.ts';
import type { View } from '../view.ts';
import { manifestRevision, mergeFiles } from './merge.ts';
import type { ManifestItem } from './merge.ts';
import { extractObjects, parseManifest } from './parse.ts';

export interface ManifestSourceOptions {
  readonly dir: string;
  readonly log: Logger;
  /** Quiet time gathering a burst of file events into one pass. */
  readonly debounceMs?: number;
  /** Interval of the fallback rescan for events fs.watch missed. */
  readonly pollMs?: number;
  /** false: poll only, for filesystems where fs.watch reports nothing (some network mounts). */
  readonly watch?: boolean;
}

export const DEFAULT_DEBOUNCE_MS = 20;
export const DEFAULT_POLL_MS = 2000;

/** Manifest files: *.yaml, *.yml, *.json. Dot files are skipped: editors' swap and lock
 *  files and the ..data folders of a mounted ConfigMap live there. */
export function isManifestName(name: string): boolean {
  return !name.startsWith('.') && /\.(ya?ml|json)$/.test(name);
}

interface FileState {
  /** inode, size and mtime: a pass reads the file only when this changes or fs.watch names it. */
  sig: string;
  /** Last text read, parsed or not, so an unchanged broken file is not reported again. */
  seen: string;
  /** Last text that parsed (what the file contributes), null if it never parsed. */
  good: string | null;
  items: readonly ManifestItem[];
}

export function createManifestSource(opts: ManifestSourceOptions): Source {
  const { dir, log } = opts;
  const debounceMs = opts.debounceMs ?? DEFAULT_DEBOUNCE_MS;
  const pollMs = opts.pollMs ?? DEFAULT_POLL_MS;
  const useWatch = opts.watch ?? true;

  const files = new Map<string, FileState>();
  let view: View = new Map();
  let revision = manifestRevision([]);
  let reportedDuplicates = new Set<string>();
  /** Why the directory could not be listed last time ('' once it could), said once per cause. */
  let dirError = '';
  /** Names not read yet at the first pass, said once per set. */
  let unreadAtStart = '';
  let watchError = '';
  const readErrors = new Map<string, string>();
  const emptyOnce = new Set<string>();
  let emitted = false;
  let onBatch: ((batch: SourceBatch) => void) | null = null;

  let watcher: FSWatcher | null = null;
  let debounce: NodeJS.Timeout | null = null;
  let poll: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;
  let again = false;
  let stopped = false;
  /** Names fs.watch reported since the last pass: re-read even if their stat looks the same. */
  let named = new Set<string>();

  function openWatcher(): void {
    try {
      watcher = watch(dir, (_event, filename) => {
        if (filename !== null && isManifestName(filename)) named.add(filename);
        trigger();
      });
      watchError = '';
      watcher.on('error', (err) => {
        log.warn({ err, dir }, `watching ${dir} failed; polling every ${pollMs} ms until it works again`);
        watcher?.close();
        watcher = null;
      });
    } catch (err) {
      // Retried on every poll; said once per distinct cause, unless the directory itself cannot
      // be read, which the next pass reports.
      const text = err instanceof Error ? err.message : String(err);
      const code = (err as NodeJS.ErrnoException).code ?? '';
      if (text !== watchError && !['ENOENT', 'ENOTDIR', 'EACCES'].includes(code)) log.warn({ err, dir }, `cannot watch ${dir}; polling every ${pollMs} ms`);
      watchError = text;
      watcher = null;
    }
  }

  function trigger(): void {
    if (stopped || debounce !== null) return;
    // A fixed window from the first event, not reset by later ones, bounds the delay.
    debounce = setTimeout(() => {
      debounce = null;
      void run();
    }, debounceMs);
  }

  /** Runs passes one at a time; an event during a pass asks for one more. */
  function run(): Promise<void> {
    if (running !== null) {
      again = true;
      return running;
    }
    running = (async () => {
      do {
        again = false;
        try {
          await pass();
        } catch (err) {
          log.error({ err, dir }, `reading manifests from ${dir} failed`);
        }
      } while (again && !stopped);
    })().finally(() => {
      running = null;
    });
    return running;
  }

  async function pass(): Promise<void> {
    const explicit = named;
    named = new Set();
    let names: string[];
    try {
      names = (await readdir(dir)).filter(isManifestName).sort(compareStrings);
      if (dirError !== '') log.info({ dir }, `${dir} can be listed again`);
      dirError = '';
    } catch (err) {
      const text = err instanceof Error ? err.message : String(err);
      if (text !== dirError) {
        // Before the first full read there is nothing to enforce: an empty state would open
        // traffic (and the first write would remove what an earlier run left in force).
        // After it, a vanished directory is more likely a remount than an intent to delete
        // every policy, so the last state stays.
        if (!emitted) log.error({ err, dir }, `cannot list ${dir}: ${text}; enforcing nothing until it can be read (retrying every ${pollMs} ms)`);
        else log.warn({ err, dir }, `cannot list ${dir}: ${text}; keeping the last manifests read`);
      }
      dirError = text;
      return;
    }

    let changed = false;
    let unstable = false;
    /** Files with no content yet that could not be read in this pass. */
    const unread: string[] = [];
    const present = new Set(names);
    for (const name of [...files.keys()]) {
      if (!present.has(name)) {
        files.delete(name);
        changed = true;
      }
    }
    for (const name of names) {
      const r = await readIfChanged(name, explicit.has(name));
      if (r === 'gone') {
        changed = files.delete(name) || changed;
      } else if (r === 'unstable' || r === 'failed') {
        if (r === 'unstable') unstable = true;
        if (!files.has(name)) unread.push(name);
      } else if (r !== 'same') {
        changed = apply(name, r.sig, r.text) || changed;
      }
    }
    // A file changed while we read it: leave it as it was and look again once the writer
    // is done, rather than apply half a file.
    if (unstable) trigger();
    // The first batch is the full state: every listed file read (parsed or not).
    if (!emitted && unread.length > 0) {
      const text = unread.join(', ');
      if (text !== unreadAtStart) log.warn({ dir, files: unread }, `not every manifest in ${dir} could be read yet (${text}); enforcing nothing until they can`);
      unreadAtStart = text;
      return;
    }
    if (!changed && emitted) return;

    const sorted = [...files.entries()].sort((a, b) => compareStrings(a[0], b[0]));
    const merged = mergeFiles(sorted.map(([name, f]) => ({ name, items: f.items })));
    reportDuplicates(merged.duplicates);
    const events = diffViews(view, merged.view);
    view = merged.view;
    const before = revision;
    revision = manifestRevision(sorted.filter(([, f]) => f.good !== null).map(([name, f]) => ({ name, content: f.good as string })));
    if (!emitted || events.length > 0 || revision !== before) emit(events);
  }

  async function readIfChanged(name: string, force: boolean): Promise<'same' | 'gone' | 'unstable' | 'failed' | { sig: string; text: string }> {
    const path = join(dir, name);
    try {
      const sig = await signature(path);
      if (sig === null) return 'gone';
      if (!force && files.get(name)?.sig === sig) return 'same';
      const text = await readFile(path, 'utf8');
      if ((await signature(path)) !== sig) return 'unstable';
      // A writer that truncates and then writes shows an empty file for a moment; emptying a
      // file deletes its policies (opens traffic), so an empty read must hold for two passes.
      if (text === '' && (files.get(name)?.seen ?? '') !== '' && !emptyOnce.has(name)) {
        emptyOnce.add(name);
        return 'unstable';
      }
      emptyOnce.delete(name);
      readErrors.delete(name);
      return { sig, text };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'gone';
      const message = err instanceof Error ? err.message : String(err);
      const keep = files.has(name) ? 'keeping its last content' : 'it adds nothing until it can be read';
      if (readErrors.get(name) !== message) log.warn({ err, file: path }, `cannot read ${path}: ${message}; ${keep}`);
      readErrors.set(name, message);
      return 'failed';
    }
  }

  /** Parses a file's new text; returns whether the file's contribution changed. */
  function apply(name: string, sig: string, text: string): boolean {
    const path = join(dir, name);
    const prev = files.get(name);
    if (prev !== undefined && prev.seen === text) {
      prev.sig = sig;
      return false;
    }
    let docs: unknown[];
    try {
      docs = parseManifest(path, text);
    } catch (err) {
      if (!(err instanceof ManifestParseError)) throw err;
      const keep = prev?.good != null ? 'keeping its last good content' : 'ignoring it until it parses';
      log.warn({ err, file: path, line: err.line }, `${err.message} (${keep})`);
      files.set(name, { sig, seen: text, good: prev?.good ?? null, items: prev?.items ?? [] });
      return false;
    }
    const { items, problems } = extractObjects(path, docs);
    for (const p of problems) {
      if (p.level === 'warn') log.warn({ err: p.error, file: path }, p.message);
      else log.debug({ file: path }, p.message);
    }
    files.set(name, { sig, seen: text, good: text, items });
    return true;
  }

  function reportDuplicates(duplicates: readonly { key: string; ref: string; loser: string; winner: string }[]): void {
    const now = new Set<string>();
    for (const d of duplicates) {
      const id = `${d.key}\n${d.loser}\n${d.winner}`;
      now.add(id);
      if (reportedDuplicates.has(id)) continue;
      const where = d.loser === d.winner ? `twice in ${join(dir, d.winner)}` : `in both ${join(dir, d.loser)} and ${join(dir, d.winner)}`;
      log.warn({ object: d.key, files: [d.loser, d.winner] }, `${d.ref} is defined ${where}; the definition in ${d.winner} wins`);
    }
    reportedDuplicates = now;
  }

  function emit(events: SourceBatch['events']): void {
    if (stopped || onBatch === null) return;
    emitted = true;
    log.debug({ dir, events: events.length, revision }, `manifests: ${events.length} change(s)`);
    try {
      onBatch({ events, synced: true, revision });
    } catch (err) {
      log.error({ err }, 'the manifest batch handler failed');
    }
  }

  return {
    /** Resolves after the first attempt to read the directory. If it fails (missing, not
     *  readable), nothing is delivered: the poll retries until a full read succeeds. */
    async start(cb: (batch: SourceBatch) => void): Promise<void> {
      // A path that exists but is no directory is a wrong flag; one that cannot be read may be
      // a volume not mounted yet, so it is retried (and reported by the first pass).
      const isDir = await stat(dir).then(
        (s) => s.isDirectory(),
        () => true,
      );
      if (!isDir) throw new ConfigError([`manifest directory ${dir} is not a directory`]);
      onBatch = cb;
      // Watch before the first read so no change falls between the two.
      if (useWatch) openWatcher();
      await run();
      poll = setInterval(() => {
        if (useWatch && watcher === null) openWatcher();
        trigger();
      }, pollMs);
    },

    async stop(): Promise<void> {
      stopped = true;
      if (debounce !== null) clearTimeout(debounce);
      if (poll !== null) clearInterval(poll);
      debounce = null;
      poll = null;
      watcher?.close();
      watcher = null;
      await running;
    },
  };
}

/** inode, size and mtime in ns; null when the path is not a regular file (or is gone). */
async function signature(path: string): Promise<string | null> {
  try {
    const s = await stat(path, { bigint: true });
    return s.isFile() ? `${s.ino}:${s.size}:${s.mtimeNs}` : null;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}
