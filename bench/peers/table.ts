// The one table the bench prints: a row per figure, a column per enforcer (p50 / p99 where the
// figure is a distribution), and the ratio kube-router / Weir, with which of the two wins.

import { percentile } from '../stats.ts';
import type { EnforcerName } from './enforcers.ts';

export interface Value {
  readonly p50: number;
  readonly p99?: number;
  /** Shown instead of numbers (fault outcomes), or after them. */
  readonly text?: string;
  readonly n?: number;
}

export interface Row {
  readonly section: string;
  readonly figure: string;
  readonly unit: string;
  /** Which way is better: times and memory are lower, rates higher, outcome rows have none. */
  readonly better?: 'lower' | 'higher';
  readonly values: Partial<Record<EnforcerName, Value>>;
  readonly note?: string;
  /** Counts: any difference decides (no 5% tie band). */
  readonly exact?: boolean;
}

export const dist = (xs: readonly number[]): Value => ({ p50: percentile(xs, 50), p99: percentile(xs, 99), n: xs.length });

function num(x: number): string {
  if (!Number.isFinite(x)) return '-';
  if (Number.isInteger(x)) return x.toLocaleString('en-US');
  const a = Math.abs(x);
  if (a >= 10_000) return Math.round(x).toLocaleString('en-US');
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

function cell(v: Value | undefined): string {
  if (!v) return '';
  const nums = Number.isNaN(v.p50) ? '' : v.p99 === undefined ? num(v.p50) : `${num(v.p50)} / ${num(v.p99)}`;
  return [nums, v.text ?? ''].filter(Boolean).join(' ');
}

function ratio(a: number | undefined, b: number | undefined): string {
  if (a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0) return '';
  return `${(a / b).toFixed(2)}×`;
}

/** Who wins on p50 (and p99 when both have one): "Weir", "kube-router", "tie" (within 5%). */
export function winner(r: Row): string {
  const k = r.values['kube-router'];
  const w = r.values.weir;
  if (!r.better || !k || !w || Number.isNaN(k.p50) || Number.isNaN(w.p50)) return '';
  const pick = (a: number, b: number) => {
    if (Math.abs(a - b) <= (r.exact ? 0 : 0.05) * Math.max(Math.abs(a), Math.abs(b))) return 'tie';
    return (r.better === 'lower' ? a < b : a > b) ? 'kube-router' : 'Weir';
  };
  const p50 = pick(k.p50, w.p50);
  if (k.p99 === undefined || w.p99 === undefined) return p50;
  const p99 = pick(k.p99, w.p99);
  return p50 === p99 ? p50 : `${p50} (p50), ${p99} (p99)`;
}

export function ratios(r: Row): string {
  const k = r.values['kube-router'];
  const w = r.values.weir;
  if (!k || !w || Number.isNaN(k.p50)) return '';
  const p50 = ratio(k.p50, w.p50);
  return k.p99 === undefined || w.p99 === undefined ? p50 : `${p50} / ${ratio(k.p99, w.p99)}`;
}

export function renderTable(rows: readonly Row[]): string {
  const head = ['section', 'figure', 'unit', 'no enforcer', 'kube-router', 'Weir', 'kube-router/Weir', 'Weir/none (p50)', 'better'];
  const body = rows.map((r) => [
    r.section,
    r.figure,
    r.unit,
    cell(r.values.none),
    cell(r.values['kube-router']),
    cell(r.values.weir),
    ratios(r),
    r.values.none && r.values.weir && !Number.isNaN(r.values.none.p50) ? ratio(r.values.weir.p50, r.values.none.p50) : '',
    winner(r),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i].length)));
  const line = (cells: string[]) => `| ${cells.map((c, i) => c.padEnd(widths[i])).join(' | ')} |`;
  return [line(head), line(widths.map((w) => '-'.repeat(w))), ...body.map(line)].join('\n');
}
