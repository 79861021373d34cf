// The one guard for "a plain JSON object", used wherever untyped API or manifest data is read.

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
