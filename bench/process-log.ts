// What a scale bench keeps of its process's output: the last lines (for an error's context),
// every warning, and, when asked, every line in a file stamped with ms since the spawn.

import { createWriteStream, type WriteStream } from 'node:fs';

export class ProcessLog<R extends { readonly level?: number }> {
  readonly lines: string[] = [];
  /** Lines that are not JSON, and records at warn level or above. */
  readonly warnings: string[] = [];
  readonly #spawnedAt: number;
  readonly #file: WriteStream | undefined;

  constructor(spawnedAt: number, file?: { path: string; append?: boolean }) {
    this.#spawnedAt = spawnedAt;
    this.#file = file === undefined ? undefined : createWriteStream(file.path, { flags: file.append ? 'a' : 'w' });
  }

  /** Takes a line received at `at`: its record, or undefined when it is not JSON. */
  read(line: string, at: number): R | undefined {
    this.#file?.write(`${(at - this.#spawnedAt).toFixed(1)} ${line}\n`);
    this.lines.push(line);
    if (this.lines.length > 200) this.lines.shift();
    let rec: R;
    try {
      rec = JSON.parse(line) as R;
    } catch {
      this.warnings.push(line);
      return undefined;
    }
    if ((rec.level ?? 0) >= 40) this.warnings.push(line);
    return rec;
  }

  /** The last `n` lines, for an error message. */
  last(n: number): string {
    return this.lines.slice(-n).join('\n');
  }

  end(): void {
    this.#file?.end();
  }
}
