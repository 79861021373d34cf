// Audit lines to a file rotated by size (rotating-file-stream, logrotate style: audit.log,
// audit.log.1 ... audit.log.N, the oldest removed), and optionally to standard output. It never
// throws into the pipeline and never blocks it: a line that cannot be written (the file cannot
// be opened, a write fails, too much is already buffered) is counted as lost, and the file is
// opened again after a pause. Lines written in one turn of the event loop go out as a few
// chunks, not one write each: the stream writes every chunk with its own system call, which
// could not keep up with a burst (docs/design/audit.md).

import { mkdir } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { createStream, type RotatingFileStream } from 'rotating-file-stream';
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../clock.ts';

export interface WriterOptions {
  /** Absolute path of the current file; rotated files get .1, .2, ... beside it. */
  readonly file: string;
  /** Bytes after which the file is rotated. It ends with the chunk that crossed it: at most
   *  one line, or maxSize / 16 (64 KiB at most), more. */
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
  const lose = (n: number) => {
    stats.lost += n;
    opts.onLost?.(n);
  };
  /** Lines of this turn of the event loop, not yet handed to the stream. */
  let pending: string[] = [];
  let pendingBytes = 0;
  let flushScheduled = false;
  const chunkBytes = Math.max(256, Math.min(64 << 10, Math.floor(opts.maxSize / 16)));

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

  /** Hands the pending lines to the stream (and stdout) in chunks of at most chunkBytes. */
  function flush(): void {
    flushScheduled = false;
    const lines = pending;
    pending = [];
    pendingBytes = 0;
    let chunk = '';
    let count = 0;
    const send = () => {
      if (count === 0) return;
      const text = chunk;
      const n = count;
      chunk = '';
      count = 0;
      if (opts.stdout !== undefined) opts.stdout.write(text);
      const s = stream;
      if (s === undefined || s.destroyed) {
        lose(n);
        return;
      }
      s.write(text, (err) => {
        if (err) lose(n);
        else stats.written += n;
      });
    };
    for (const line of lines) {
      if (count > 0 && chunk.length + line.length + 1 > chunkBytes) send();
      chunk += `${line}\n`;
      count++;
    }
    send();
  }

  return {
    start: () => {
      stopped = false;
      return open();
    },
    write(line: string) {
      const s = stream;
      if (s === undefined || s.destroyed || s.writableLength + pendingBytes > maxBuffered) {
        if (opts.stdout !== undefined) opts.stdout.write(`${line}\n`);
        lose(1);
        return;
      }
      pending.push(line);
      pendingBytes += line.length + 1;
      if (!flushScheduled) {
        flushScheduled = true;
        setImmediate(flush);
      }
    },
    async stop() {
      stopped = true;
      flush();
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
