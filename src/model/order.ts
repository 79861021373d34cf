// One string order for everything Weir sorts: code units, independent of locale, so every
// agent and every run orders names alike (deterministic output).

export function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
