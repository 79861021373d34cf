// Splits a list response (`{"kind":..., "metadata":{...}, "items":[{...}, ...]}`) into the JSON
// text of each item as the body streams in, so a list of a large cluster's pods (one answer of
// hundreds of megabytes when the API server serves it from its watch cache: docs/performance.md)
// is never held as one string or one parsed tree.
// Only the top-level "items" array is split; everything else is kept and parsed at the end.

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;

export class ListSplitter {
  /** Text not yet consumed: from the start of the item being read, or from the next char. */
  #buf = '';
  /** Where scanning resumes in #buf. */
  #pos = 0;
  #depth = 0;
  #inString = false;
  /** The last string closed at depth 1 (a candidate key), and where the open one began. */
  #lastKey = '';
  #stringStart = -1;
  /** Inside the top-level "items" array; #itemStart is where the current item began (-1: none). */
  #inItems = false;
  #itemStart = -1;
  /** The text outside the items array, and where in #buf its next piece begins. */
  #rest = '';
  #restFrom = 0;

  /** Feeds the next piece of the body; returns the text of every item it completed. */
  push(chunk: string): string[] {
    const items: string[] = [];
    const buf = this.#buf + chunk;
    let i = this.#pos;
    let depth = this.#depth;
    const n = buf.length;
    while (i < n) {
      if (this.#inString) {
        // Jump to the closing quote: one not preceded by an odd number of backslashes.
        let q = buf.indexOf('"', i);
        while (q !== -1) {
          let b = q - 1;
          while (b >= 0 && buf.charCodeAt(b) === BACKSLASH) b--;
          if ((q - 1 - b) % 2 === 0) break;
          q = buf.indexOf('"', q + 1);
        }
        if (q === -1) {
          i = n;
          break;
        }
        this.#inString = false;
        if (depth === 1 && this.#stringStart >= 0) this.#lastKey = buf.slice(this.#stringStart + 1, q);
        i = q + 1;
        continue;
      }
      const c = buf.charCodeAt(i);
      if (c === QUOTE) {
        this.#inString = true;
        this.#stringStart = depth === 1 ? i : -1;
      } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
        depth++;
        if (this.#inItems && depth === 3 && c === OPEN_BRACE) this.#itemStart = i;
        else if (depth === 2 && c === OPEN_BRACKET && this.#lastKey === 'items') {
          this.#inItems = true;
          this.#rest += buf.slice(this.#restFrom, i + 1);
        }
      } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
        depth--;
        if (this.#inItems && depth === 2 && c === CLOSE_BRACE && this.#itemStart >= 0) {
          items.push(buf.slice(this.#itemStart, i + 1));
          this.#itemStart = -1;
        } else if (this.#inItems && depth === 1 && c === CLOSE_BRACKET) {
          this.#inItems = false;
          this.#restFrom = i;
        }
      }
      i++;
    }
    this.#depth = depth;
    // Keep only what a later chunk still needs: the open item, or the open key string.
    if (!this.#inItems) this.#rest += buf.slice(this.#restFrom, n);
    let keepFrom = n;
    if (this.#inItems && this.#itemStart >= 0) keepFrom = this.#itemStart;
    else if (this.#inString && this.#stringStart >= 0) keepFrom = this.#stringStart;
    if (!this.#inItems && keepFrom < n) this.#rest = this.#rest.slice(0, this.#rest.length - (n - keepFrom));
    this.#buf = buf.slice(keepFrom);
    this.#pos = i - keepFrom;
    if (this.#itemStart >= 0) this.#itemStart -= keepFrom;
    if (this.#stringStart >= 0) this.#stringStart -= keepFrom;
    this.#restFrom = 0;
    return items;
  }

  /** The body outside the items array (with `"items":[]`), parsed; throws when the body did not
   *  end as one complete JSON object. */
  finish(): unknown {
    if (this.#depth !== 0 || this.#inString || this.#inItems) throw new SyntaxError('the list response ended in the middle of its JSON');
    const text = this.#rest + this.#buf;
    return JSON.parse(text) as unknown;
  }
}
