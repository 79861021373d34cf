// Audit lines to a file rotated by size (rotating-file-stream, logrotate style: audit.log,
// audit.log.1 ... audit.log.N, the oldest removed), and optionally to standard output. It never
// throws into the pipeline and never blocks it: a line that cannot be written (the file cannot
// be opened, a write fails, too much is already buffered) is counted as lost, and the file is
// opened again after a pause.

import { mkdir } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { createStream, type RotatingFileStream } from 'rotating-file-stream';
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../status/clock.ts';

export interface WriterOptions {
  /** Absolute path of the current file; rotated files get .1, .2, ... beside it. */
  readonly file: string;
  /** Bytes after which the file is rotated (it ends with the line that crossed it). */
  readonly maxSize: number;
  /** Rotated files kept. */
  readonly maxFiles: number;
  /** Also write every line here (process.stdout in the agent). */
  readonly stdout?: NodeJS.WritableStream;
  /** Lines still waiting to reach the file, in bytes, beyond which new lines are dropped.
   *  Default 4 MiB. */
  readonly maxBufferedBytes?: number;
  /** Pause before opening the file again after an error. Default 5 s. */
  readonly retryMs?: number;
  readonly log: Logger;
  readonly clock?: Clock;
  /** Every error of the file (open, write, rotation). */
  readonly onError?: (err: Error) => void;
  /** Every line that will never reach the file. */
  readonly onLost?: (lines: number) => void;
}

export interface WriterStats {
  /** Lines in the file (acknowledged by the file system). */
  readonly written: number;
  /** Lines that never reached the file. */
  readonly lost: number;
  /** Errors of the file stream. */
  readonly errors: number;
}

export interface AuditWriter {
  /** Creates the directory and opens the file; a failure is counted and retried, not thrown. */
  start(): Promise<void>;
  /** One JSON line, without its newline. */
  write(line: string): void;
  /** Waits for every buffered line, then closes the file. */
  stop(): Promise<void>;
  stats(): WriterStats;
}

export function createAuditWriter(opts: WriterOptions): AuditWriter {
  const clock = opts.clock ?? systemClock;
  const maxBuffered = opts.maxBufferedBytes ?? 4 << 20;
  const retryMs = opts.retryMs ?? 5000;
  const dir = dirname(opts.file);
  const name = basename(opts.file);
  const stats = { written: 0, lost: 0, errors: 0 };
  let stream: RotatingFileStream | undefined;
  let opening: Promise<void> | undefined;
  let retry: unknown;
  let stopped = false;
  const lose = () => {
    stats.lost++;
    opts.onLost?.(1);
  };

  const fail = (err: Error, s: RotatingFileStream | undefined) => {
    stats.errors++;
    opts.onError?.(err);
    opts.log.warn({ err, file: opts.file, retryInMs: retryMs }, 'audit log: cannot write the file; lines are lost until it opens again');
    if (s !== undefined && stream === s) {
      stream = undefined;
      s.destroy();
    }
    if (!stopped && retry === undefined) {
      retry = clock.setTimeout(() => {
        retry = undefined;
        if (!stopped) void open();
      }, retryMs);
    }
  };

  const open = (): Promise<void> => {
    opening ??= (async () => {
      try {
        await mkdir(dir, { recursive: true });
        const s = createStream((index: number | Date) => (typeof index === 'number' && index > 0 ? `${name}.${index}` : name), {
          path: dir,
          size: `${opts.maxSize}B`,
          rotate: opts.maxFiles,
        });
        s.on('error', (err) => fail(err, s));
        // Non-fatal: a rotated file that could not be removed, and the like.
        s.on('warning', (err) => opts.log.warn({ err, file: opts.file }, 'audit log: rotation warning'));
        stream = s;
      } catch (err) {
        fail(err as Error, undefined);
      } finally {
        opening = undefined;
      }
    })();
    return opening;
  };

  return {
    start: () => {
      stopped = false;
      return open();
    },
    write(line: string) {
      const text = `${line}\n`;
      if (opts.stdout !== undefined) opts.stdout.write(text);
      const s = stream;
      if (s === undefined || s.destroyed || s.writableLength > maxBuffered) {
        lose();
        return;
      }
      s.write(text, (err) => {
        if (err) lose();
        else stats.written++;
      });
    },
    async stop() {
      stopped = true;
      if (retry !== undefined) {
        clock.clearTimeout(retry);
        retry = undefined;
      }
      await opening;
      const s = stream;
      stream = undefined;
      if (s === undefined || s.destroyed) return;
      await new Promise<void>((resolve) => {
        s.once('finish', resolve);
        s.once('close', resolve);
        s.once('error', () => resolve());
        s.end();
      });
    },
    stats: () => ({ ...stats }),
  };
}
