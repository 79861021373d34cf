import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { deletionFilters, filterText, type JudgedConnection } from '../../../src/agent/cut-filters.ts';

const c = (src: string, dst: string, dport: number, denied: boolean, protocol: 'TCP' | 'UDP' = 'TCP'): JudgedConnection => ({ key: { family: 4, protocol, src, dst, dport }, denied });
const texts = (listing: JudgedConnection[]) => deletionFilters(listing).map(filterText);

describe('the deletions that take the denied connections of a listing', () => {
  test('every connection to a destination denied: one deletion by destination, whatever the sources and ports', () => {
    assert.deepEqual(texts([c('a', 'p', 80, true), c('b', 'p', 81, true), c('c', 'p', 80, true), c('a', 'q', 80, false)]), ['TCP * -> p']);
  });

  test('a destination that keeps one: by source when every connection of that source is denied', () => {
    assert.deepEqual(texts([c('a', 'p', 80, true), c('a', 'q', 80, true), c('b', 'p', 80, false)]), ['TCP a -> *']);
  });

  test('source and destination both keep one: by pair, else by key', () => {
    const listing = [c('a', 'p', 80, true), c('a', 'q', 80, false), c('b', 'p', 80, false)];
    assert.deepEqual(texts(listing), ['TCP a -> p']);
    assert.deepEqual(texts([...listing, c('a', 'p', 81, false)]), ['TCP a -> p:80']);
  });

  test('protocols are apart: a kept UDP connection does not hold back a TCP deletion, and nothing is deleted when nothing is denied', () => {
    assert.deepEqual(texts([c('a', 'p', 53, false, 'UDP'), c('b', 'p', 80, true)]), ['TCP * -> p']);
    assert.deepEqual(texts([c('a', 'p', 80, false)]), []);
  });

  test('one deletion per group, however many connections it holds', () => {
    const many = Array.from({ length: 1_000 }, (_, i) => c(`s${i % 10}`, 'p', 80, true));
    assert.equal(deletionFilters(many).length, 1);
  });
});
