// One logger type for the whole agent: pino, JSON lines. Modules take a Logger; only the
// CLI builds the root one, so tests can pass a silent logger.

import { pino } from 'pino';
export type Logger = pino.Logger;

export function createLogger(level: string = 'info'): Logger {
  return pino({ level, base: { app: 'weir' }, timestamp: pino.stdTimeFunctions.isoTime });
}

export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
