// The audit flags together: a log file or --audit-stdout asks for the audit log, so neither is
// ever ignored in silence (src/cli/flags.ts; the agent logs the notice at start); the rates and
// what the Calculator is told to write from them (agent/config.ts, calcConfig).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { calcConfig } from '../../../src/agent/config.ts';
import { HASHLIMIT_TABLE_LIMIT, auditLimit } from '../../../src/calc/config.ts';
import { parse, toConfig } from '../../../src/cli/flags.ts';
import { ConfigError } from '../../../src/errors.ts';

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

test('--audit-stdout given without --audit turns the audit log on, like a log file, and the agent is told to say why', () => {
  for (const audit of [auditOf(['--audit-stdout']), auditOf([], { WEIR_AUDIT_STDOUT: 'true' })]) {
    assert.equal(audit.enabled, true);
    assert.equal(audit.stdout, true);
    assert.match(audit.notice ?? '', /^audit log on: --audit-stdout \(WEIR_AUDIT_STDOUT\) was given without --audit/);
  }
  assert.match(
    auditOf(['--audit-stdout', '--audit-log-file', '/var/log/x/audit.log']).notice ?? '',
    /^audit log on: --audit-log-file \(WEIR_AUDIT_LOG_FILE\) and --audit-stdout \(WEIR_AUDIT_STDOUT\) were given without --audit/,
  );
  assert.deepEqual([auditOf([], { WEIR_AUDIT_STDOUT: 'false' }).enabled, auditOf([], { WEIR_AUDIT_STDOUT: 'false' }).notice], [false, undefined]);
});

test('--audit off beside --audit-stdout keeps the audit log off, and the agent is told to say nothing will be written', () => {
  for (const audit of [auditOf(['--audit', 'off', '--audit-stdout']), auditOf([], { WEIR_AUDIT: 'off', WEIR_AUDIT_STDOUT: '1' })]) {
    assert.equal(audit.enabled, false);
    assert.match(audit.notice ?? '', /^audit log off \(--audit off\): nothing will be written to standard output \(--audit-stdout\)/);
  }
  assert.match(auditOf(['--audit', 'off', '--audit-stdout', '--audit-log-file', '/var/log/x/audit.log']).notice ?? '', /nothing will be written to --audit-log-file nor to standard output/);
});

test('--audit-rate-per-source is a whole number of events a second from 1 to 100000, like --audit-rate, default 100', () => {
  assert.equal(auditOf([]).ratePerSource, 100);
  assert.equal(auditOf(['--audit-rate-per-source', '25']).ratePerSource, 25);
  assert.equal(auditOf([], { WEIR_AUDIT_RATE_PER_SOURCE: '30' }).ratePerSource, 30);
  for (const bad of ['0', '1.5', '100001']) {
    assert.throws(
      () => auditOf(['--audit-rate-per-source', bad]),
      (e: unknown) => e instanceof ConfigError && new RegExp(`audit rate per source ${bad.replace('.', '\\.')} must be a whole number of events per second from 1 to 100000`).test(e.message),
    );
  }
  assert.throws(() => auditOf(['--audit-rate-per-source', 'many']), /--audit-rate-per-source \(WEIR_AUDIT_RATE_PER_SOURCE\) must be a non-negative number, got "many"/);
});

test("the rules' limit: a bucket per source at --audit-rate-per-source under a kernel ceiling of ten times --audit-rate, bursts of twice each, at most 200000 a second so that the table fits the kernel's", () => {
  const agent = (argv: readonly string[]) => toConfig(parse(['agent', '--node-name', 'n', '--audit', 'on', ...argv], {}).values, { nodeName: true, manifestsDir: false });
  assert.deepEqual(calcConfig(agent([])).audit, { group: 77, defaultLevel: 'off', perSecond: 10_000, burst: 20_000, perSource: { perSecond: 100, burst: 200 } });
  assert.deepEqual(calcConfig(agent(['--audit-rate', '50', '--audit-rate-per-source', '5'])).audit, {
    group: 77,
    defaultLevel: 'off',
    perSecond: 500,
    burst: 1000,
    perSource: { perSecond: 5, burst: 10 },
  });
  const most = calcConfig(agent(['--audit-rate', '100000', '--audit-rate-per-source', '1'])).audit!;
  assert.deepEqual([most.perSecond, most.burst], [200_000, 400_000]);
  // The Calculator accepts it: the table it needs stays within the kernel's.
  const limit = auditLimit('cali', most);
  assert.ok(limit.perSource !== undefined && limit.perSource.tableMax <= HASHLIMIT_TABLE_LIMIT, JSON.stringify(limit));
  assert.equal(calcConfig(agent(['--audit', 'off'])).audit, undefined);
});
