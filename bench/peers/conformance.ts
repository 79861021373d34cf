// Section 5: Weir's own conformance scenarios (test/conformance/*.test.ts, their predicates
// written from the semantics docs) run against each enforcer through a real API server: each
// file runs in a process of its own with conformance-hooks.ts, which swaps its harness for the
// API-backed one (conformance-harness.ts). Counted per enforcer: scenarios passed, scenarios
// that cannot run through an API server, and every disagreement with the cells that differ.
// Weir runs the same way, as the control: a scenario Weir fails here is the harness's fault or
// a kube-mode bug, not kube-router's.

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Ctx } from './context.ts';
import type { EnforcerName } from './enforcers.ts';
import { registerExitCleanup } from '../../src/sim/cleanup.ts';
import { cacheDir, REPO_DIR } from './env.ts';
import type { Value } from './table.ts';

/** The scenario files that can run through an API server. Left out: manifest-faults (files
 *  the API server never accepts), boot-and-drift and allow-action (Weir's own restarts, drift
 *  and flags), audit (Weir's audit log), large-ipblock (1 MB policies: add it with
 *  --conformance=large-ipblock.test.ts). */
export const DEFAULT_FILES = ['smoke.test.ts', 'isolation-peers.test.ts', 'ports-blocks-faults.test.ts', 'node-traffic.test.ts', 'fail-closed.test.ts'];

interface TestResult {
  readonly name: string;
  readonly ok: boolean;
  readonly suite?: boolean;
  readonly message?: string;
}

interface Mismatch {
  readonly enforcer: string;
  readonly test: string;
  readonly what: string;
  readonly cells: string[];
}

function runFile(ctx: Ctx, enforcer: EnforcerName, file: string, dir: string): Promise<TestResult[]> {
  const report = join(dir, `${enforcer}-${file}.jsonl`);
  const weirDist = ctx.flags.weirDist ?? cacheDir('weir-dist');
  const args = [
    '--import',
    join(REPO_DIR, 'bench/peers/conformance-hooks.ts'),
    `--test-reporter=${join(REPO_DIR, 'bench/peers/conformance-reporter.ts')}`,
    `--test-reporter-destination=${report}`,
    join(REPO_DIR, 'test/conformance', file),
  ];
  const env = { ...process.env, WEIR_PEERS_ENFORCER: enforcer, WEIR_PEERS_WEIR_DIST: weirDist, WEIR_PEERS_CONFORMANCE_OUT: join(dir, 'mismatches.jsonl') };
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'ignore', 'pipe'], cwd: REPO_DIR });
    // If the bench is stopped, the scenario process is too: its own handlers then remove its
    // cluster and control plane.
    const unregister = registerExitCleanup(() => child.kill('SIGTERM'));
    child.on('exit', unregister);
    let err = '';
    child.stderr.on('data', (c) => (err = (err + c).slice(-20_000)));
    child.on('error', reject);
    child.on('close', () => {
      let text = '';
      try {
        text = readFileSync(report, 'utf8');
      } catch {
        return reject(new Error(`${file} against ${enforcer} wrote no report:\n${err.slice(-3000)}`));
      }
      const all = text
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as TestResult);
      // A test cancelled because its suite's hook failed carries that hook's error.
      const suites = all.filter((r) => r.suite && !r.ok);
      resolve(
        all
          .filter((r) => !r.suite)
          .map((r) => {
            if (r.ok || !r.message?.includes('was cancelled')) return r;
            const parent = suites.filter((s) => r.name.startsWith(`${s.name} > `)).sort((a, b) => b.name.length - a.name.length)[0];
            return parent ? { ...r, message: `${parent.message} (in a hook of its suite)` } : r;
          }),
      );
    });
  });
}

const NOT_APPLICABLE = 'not applicable through an API server';

export async function benchConformance(ctx: Ctx): Promise<void> {
  const files = ctx.flags.conformanceFiles.length ? ctx.flags.conformanceFiles : DEFAULT_FILES;
  const dir = mkdtempSync(join(tmpdir(), 'weir-peers-conformance-'));
  try {
    const passed: Partial<Record<EnforcerName, Value>> = {};
    const results = new Map<EnforcerName, Map<string, TestResult>>();
    for (const spec of ctx.enforcers(false)) {
      const byName = new Map<string, TestResult>();
      for (const file of files) {
        const t0 = performance.now();
        const res = await runFile(ctx, spec.name, file, dir);
        for (const r of res) byName.set(`${file}: ${r.name}`, r);
        const ok = res.filter((r) => r.ok).length;
        ctx.log(`  ${spec.name}, ${file}: ${ok}/${res.length} passed (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
      }
      results.set(spec.name, byName);
      const all = [...byName.values()];
      const na = all.filter((r) => !r.ok && r.message?.includes(NOT_APPLICABLE)).length;
      const ok = all.filter((r) => r.ok).length;
      passed[spec.name] = { p50: ok, text: `of ${all.length - na} that run through an API server (${na} more cannot: manifest files, Weir's own rules)` };
    }
    let mismatches: Mismatch[] = [];
    try {
      mismatches = readFileSync(join(dir, 'mismatches.jsonl'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Mismatch);
    } catch {
      // No mismatch at all.
    }
    ctx.add({ section: '5 conformance', figure: `scenarios passed (${files.join(', ')})`, unit: 'tests', better: 'higher', exact: true, values: passed });
    for (const [enforcer, byName] of results) {
      const failed = [...byName].filter(([, r]) => !r.ok && !r.message?.includes(NOT_APPLICABLE));
      const na = [...byName].filter(([, r]) => !r.ok && r.message?.includes(NOT_APPLICABLE));
      ctx.log(`\n  ${enforcer}: ${failed.length} scenarios disagree with the expected truth tables${failed.length ? ':' : ''}`);
      for (const [name, r] of failed) {
        const testName = name.slice(name.indexOf(': ') + 2);
        const cells = mismatches.filter((m) => m.enforcer === enforcer && m.test === testName);
        ctx.log(`  - ${name}`);
        if (cells.length === 0) ctx.log(`      ${(r.message ?? '').split('\n').slice(0, 6).join('\n      ')}`);
        for (const m of cells) ctx.log(`      ${m.what || 'expect'}: ${m.cells.length} cells differ:\n        ${m.cells.join('\n        ')}`);
      }
      if (na.length) ctx.log(`  ${enforcer}: cannot run through an API server: ${na.map(([n]) => n).join('; ')}`);
      ctx.notes.push(`conformance, ${enforcer}: ${failed.length} disagreeing scenarios: ${failed.map(([n]) => n).join('; ') || 'none'}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
