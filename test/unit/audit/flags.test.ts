// The audit flags together: a log file asks for the audit log, so it is never ignored in silence
// (src/cli/flags.ts; the agent logs the notice at start).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parse, toConfig } from '../../../src/cli/flags.ts';

const auditOf = (argv: readonly string[], env: Record<string, string> = {}) => toConfig(parse(['agent', '--node-name', 'n', ...argv], env).values, { nodeName: true, manifestsDir: false }).audit;

test('a log file given without --audit turns the audit log on, and the agent is told to say why', () => {
  for (const audit of [auditOf(['--audit-log-file', '/var/log/x/audit.log']), auditOf([], { WEIR_AUDIT_LOG_FILE: '/var/log/x/audit.log' })]) {
    assert.equal(audit.enabled, true);
    assert.equal(audit.file, '/var/log/x/audit.log');
    assert.match(audit.notice ?? '', /^audit log on: --audit-log-file \(WEIR_AUDIT_LOG_FILE\) was given without --audit/);
  }
});

test('--audit off beside a log file keeps the audit log off, and the agent is told to say the file stays empty', () => {
  for (const audit of [auditOf(['--audit', 'off', '--audit-log-file', '/var/log/x/audit.log']), auditOf([], { WEIR_AUDIT: 'off', WEIR_AUDIT_LOG_FILE: '/var/log/x/audit.log' })]) {
    assert.equal(audit.enabled, false);
    assert.match(audit.notice ?? '', /^audit log off \(--audit off\): nothing will be written to --audit-log-file/);
  }
});

test('without a log file, or with --audit on, --audit alone decides and nothing more is said', () => {
  assert.deepEqual([auditOf([]).enabled, auditOf([]).notice], [false, undefined]);
  assert.deepEqual([auditOf(['--audit', 'on']).enabled, auditOf(['--audit', 'on']).notice], [true, undefined]);
  const both = auditOf(['--audit', 'on', '--audit-log-file', '/var/log/x/audit.log']);
  assert.deepEqual([both.enabled, both.notice], [true, undefined]);
});

test('a log file that turns the audit log on is checked like one given with --audit on', () => {
  assert.throws(() => auditOf(['--audit-log-file', 'relative.log']), /audit log file "relative.log" must be an absolute path/);
  assert.throws(() => auditOf(['--audit', 'maybe', '--audit-log-file', '/var/log/x/audit.log']), /--audit \(WEIR_AUDIT\) must be on or off, got "maybe"/);
});
