// The error catalog. Every error Weir raises is a WeirError with a stable `code` and
// structured context; docs/errors.md lists the same codes (a test keeps them in step).

export type ErrorCode =
  | 'WEIR_CONFIG_INVALID'
  | 'WEIR_COMMAND_FAILED'
  | 'WEIR_COMMAND_MISSING'
  | 'WEIR_COMMAND_TIMEOUT'
  | 'WEIR_XTABLES_LOCK'
  | 'WEIR_RESTORE_FAILED'
  | 'WEIR_KERNEL_READ_FAILED'
  | 'WEIR_MANIFEST_PARSE'
  | 'WEIR_MANIFEST_OBJECT'
  | 'WEIR_POLICY_INVALID'
  | 'WEIR_PRECONDITION'
  | 'WEIR_KUBE_API'
  | 'WEIR_AUDIT_STREAM'
  | 'WEIR_AUDIT_READER';

/** The last `n` lines of a command's stderr: where its own message usually is. */
const lastLines = (stderr: string, n: number): string => stderr.trim().split('\n').slice(-n).join('\n');

/** `text`, then the last `n` lines of stderr when there are any. */
const withTail = (text: string, stderr: string, n: number): string => {
  const tail = lastLines(stderr, n);
  return tail ? `${text}: ${tail}` : text;
};

export interface WeirErrorOptions {
  readonly cause?: unknown;
}

export class WeirError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: WeirErrorOptions) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.name = new.target.name;
  }
}

/** Bad flags, environment or configuration values; `problems` lists every one found. */
export class ConfigError extends WeirError {
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super('WEIR_CONFIG_INVALID', `invalid configuration:\n  - ${problems.join('\n  - ')}`);
    this.problems = problems;
  }
}

/** A command (iptables, ipset, ...) exited non-zero, could not start, or hung and was killed. */
export class CommandError extends WeirError {
  readonly command: string;
  readonly args: readonly string[];
  readonly exitCode: number | undefined;
  readonly stderr: string;
  constructor(
    code: 'WEIR_COMMAND_FAILED' | 'WEIR_COMMAND_MISSING' | 'WEIR_COMMAND_TIMEOUT' | 'WEIR_KERNEL_READ_FAILED',
    command: string,
    args: readonly string[],
    exitCode: number | undefined,
    stderr: string,
    options?: WeirErrorOptions,
  ) {
    const what = code === 'WEIR_COMMAND_MISSING' ? 'could not be started (is it installed?)' : code === 'WEIR_COMMAND_TIMEOUT' ? 'did not finish in time and was killed' : `exited with ${exitCode}`;
    super(code, withTail(`${command} ${args.join(' ')} ${what}`, stderr, 5), options);
    this.command = command;
    this.args = args;
    this.exitCode = exitCode;
    this.stderr = stderr;
  }
}

/** An iptables or ipset tool failed: messages name it with its family (`iptables-restore
 *  (IPv6)`; ipset has none), and its stderr is kept whole. */
export abstract class ToolError extends WeirError {
  readonly tool: string;
  readonly family: 4 | 6 | undefined;
  readonly stderr: string;
  constructor(code: 'WEIR_RESTORE_FAILED' | 'WEIR_XTABLES_LOCK', tool: string, family: 4 | 6 | undefined, stderr: string, what: string, options?: WeirErrorOptions) {
    super(code, `${tool}${family ? ` (IPv${family})` : ''} ${what}`, options);
    this.tool = tool;
    this.family = family;
    this.stderr = stderr;
  }
}

/** iptables-restore or ipset restore rejected a payload; names the failing line. */
export class RestoreError extends ToolError {
  readonly line: number | undefined;
  readonly lineText: string | undefined;
  constructor(tool: string, family: 4 | 6 | undefined, stderr: string, payload: string, options?: WeirErrorOptions) {
    const m = /line:?\s*(\d+)/i.exec(stderr);
    const line = m ? Number(m[1]) : undefined;
    const lineText = line !== undefined ? payload.split('\n')[line - 1] : undefined;
    const where = line !== undefined ? ` at payload line ${line}${lineText ? ` (${lineText})` : ''}` : '';
    super('WEIR_RESTORE_FAILED', tool, family, stderr, `rejected the payload${where}: ${stderr.trim()}`, options);
    this.line = line;
    this.lineText = lineText;
  }
}

/** Another program kept the xtables lock (legacy backend) through every bounded wait and
 *  retry; nothing was written. */
export class XtablesLockError extends ToolError {
  /** Tries made, the first included. */
  readonly attempts: number;
  constructor(tool: string, family: 4 | 6 | undefined, attempts: number, stderr: string, options?: WeirErrorOptions) {
    super('WEIR_XTABLES_LOCK', tool, family, stderr, `could not take the xtables lock in ${attempts} tries: ${lastLines(stderr, 1)}`, options);
    this.attempts = attempts;
  }
}

/** A manifest file that does not parse; the file keeps its last good content. */
export class ManifestParseError extends WeirError {
  readonly file: string;
  readonly line: number | undefined;
  constructor(file: string, line: number | undefined, detail: string, options?: WeirErrorOptions) {
    super('WEIR_MANIFEST_PARSE', `${file}${line !== undefined ? `:${line}` : ''}: ${detail}`, options);
    this.file = file;
    this.line = line;
  }
}

/** A manifest object Weir cannot use (missing name, wrong kind shape, ...). */
export class ManifestObjectError extends WeirError {
  readonly file: string;
  readonly objectRef: string;
  constructor(file: string, objectRef: string, detail: string) {
    super('WEIR_MANIFEST_OBJECT', `${file}: ${objectRef}: ${detail}`);
    this.file = file;
    this.objectRef = objectRef;
  }
}

/** The host lacks something Weir needs (a binary, a module, a sysctl, privileges). */
export class PreconditionError extends WeirError {
  constructor(message: string, options?: WeirErrorOptions) {
    super('WEIR_PRECONDITION', message, options);
  }
}

/** A request to the Kubernetes API failed: an HTTP status (with the metav1.Status reason)
 *  or, with status 0, a failure below HTTP (connection, TLS, timeout). */
export class KubeApiError extends WeirError {
  readonly method: string;
  readonly path: string;
  readonly status: number;
  /** metav1.Status reason (Forbidden, NotFound, Conflict, Expired, ...), '' when there is none. */
  readonly reason: string;
  constructor(method: string, path: string, status: number, reason: string, message: string, options?: WeirErrorOptions) {
    super('WEIR_KUBE_API', `${method} ${path}: ${status === 0 ? '' : `${status}${reason ? ` ${reason}` : ''}: `}${message}`, options);
    this.method = method;
    this.path = path;
    this.status = status;
    this.reason = reason;
  }
}

/** The audit reader's input is not the pcap stream of an NFLOG group (bad magic, another link
 *  type, a record longer than any NFLOG message): the reader restarts tcpdump. */
export class AuditStreamError extends WeirError {
  /** Byte offset in the stream where the problem was found. */
  readonly offset: number;
  constructor(offset: number, detail: string) {
    super('WEIR_AUDIT_STREAM', `audit reader: at byte ${offset} of the tcpdump stream: ${detail}`);
    this.offset = offset;
  }
}

/** The audit reader's tcpdump could not start or exited; restarted with backoff. */
export class AuditReaderError extends WeirError {
  readonly command: readonly string[];
  readonly exitCode: number | undefined;
  readonly signal: string | undefined;
  readonly stderr: string;
  constructor(command: readonly string[], exitCode: number | undefined, signal: string | undefined, stderr: string, options?: WeirErrorOptions) {
    const how = exitCode !== undefined ? `exited with ${exitCode}` : signal !== undefined ? `was killed by ${signal}` : 'could not be started';
    super('WEIR_AUDIT_READER', withTail(`audit reader: ${command.join(' ')} ${how}`, stderr, 3), options);
    this.command = command;
    this.exitCode = exitCode;
    this.signal = signal;
    this.stderr = stderr;
  }
}
