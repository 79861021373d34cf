import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isMatchAll, labelKeyProblem, labelValueProblem, matchAllSelector, parseSelector, selectorMatches } from '../../../src/model/selector.ts';
import type { Requirement, Selector } from '../../../src/model/types.ts';

function parseOk(raw: unknown): Selector {
  const r = parseSelector(raw, 'sel');
  if ('errors' in r) assert.fail(`unexpected errors: ${JSON.stringify(r.errors)}`);
  return r.selector;
}

describe('parseSelector canonical form', () => {
  const cases: { name: string; input: unknown; key: string; requirements: Requirement[] }[] = [
    { name: 'empty selector matches all', input: {}, key: '', requirements: [] },
    { name: 'null fields are absent', input: { matchLabels: null, matchExpressions: null }, key: '', requirements: [] },
    { name: 'empty lists are absent', input: { matchLabels: {}, matchExpressions: [] }, key: '', requirements: [] },
    {
      name: 'matchLabels become In requirements sorted by key',
      input: { matchLabels: { tier: 'db', app: 'web' } },
      key: 'app in (web),tier in (db)',
      requirements: [
        { key: 'app', operator: 'In', values: ['web'] },
        { key: 'tier', operator: 'In', values: ['db'] },
      ],
    },
    {
      name: 'values are sorted and de-duplicated',
      input: { matchExpressions: [{ key: 'env', operator: 'NotIn', values: ['prod', 'dev', 'prod'] }] },
      key: 'env notin (dev,prod)',
      requirements: [{ key: 'env', operator: 'NotIn', values: ['dev', 'prod'] }],
    },
    {
      name: 'Exists and DoesNotExist have their own text',
      input: {
        matchExpressions: [
          { key: 'b', operator: 'DoesNotExist' },
          { key: 'a', operator: 'Exists', values: [] },
        ],
      },
      key: 'a,!b',
      requirements: [
        { key: 'a', operator: 'Exists', values: [] },
        { key: 'b', operator: 'DoesNotExist', values: [] },
      ],
    },
    {
      name: 'matchLabels and an identical expression collapse into one requirement',
      input: { matchLabels: { app: 'web' }, matchExpressions: [{ key: 'app', operator: 'In', values: ['web'] }] },
      key: 'app in (web)',
      requirements: [{ key: 'app', operator: 'In', values: ['web'] }],
    },
    {
      name: 'same key with different operators sorts by operator',
      input: {
        matchExpressions: [
          { key: 'a', operator: 'NotIn', values: ['x'] },
          { key: 'a', operator: 'In', values: ['y', 'x'] },
        ],
      },
      key: 'a in (x,y),a notin (x)',
      requirements: [
        { key: 'a', operator: 'In', values: ['x', 'y'] },
        { key: 'a', operator: 'NotIn', values: ['x'] },
      ],
    },
    {
      name: 'prefixed keys and the empty value are valid',
      input: { matchLabels: { 'app.kubernetes.io/name': '' } },
      key: 'app.kubernetes.io/name in ()',
      requirements: [{ key: 'app.kubernetes.io/name', operator: 'In', values: [''] }],
    },
    {
      name: 'undefined label values count as absent',
      input: { matchLabels: { app: undefined } },
      key: '',
      requirements: [],
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const sel = parseOk(c.input);
      assert.equal(sel.key, c.key);
      assert.deepEqual(sel.requirements, c.requirements);
    });
  }
});

describe('parseSelector gives equal keys for equal meanings', () => {
  const groups: { name: string; inputs: unknown[] }[] = [
    {
      name: 'order of matchLabels, expressions and values does not matter',
      inputs: [
        {
          matchLabels: { a: '1', b: '2' },
          matchExpressions: [
            { key: 'c', operator: 'In', values: ['x', 'y'] },
            { key: 'd', operator: 'Exists' },
          ],
        },
        {
          matchExpressions: [
            { key: 'd', operator: 'Exists' },
            { key: 'c', operator: 'In', values: ['y', 'x', 'y'] },
          ],
          matchLabels: { b: '2', a: '1' },
        },
        {
          matchExpressions: [
            { key: 'b', operator: 'In', values: ['2'] },
            { key: 'a', operator: 'In', values: ['1'] },
            { key: 'c', operator: 'In', values: ['x', 'y'] },
            { key: 'd', operator: 'Exists', values: null },
          ],
        },
      ],
    },
  ];
  for (const g of groups) {
    it(g.name, () => {
      const keys = g.inputs.map((i) => parseOk(i).key);
      for (const k of keys) assert.equal(k, keys[0]);
      assert.notEqual(keys[0], '');
    });
  }

  it('different meanings give different keys', () => {
    const inputs = [
      {},
      { matchLabels: { a: '1' } },
      { matchExpressions: [{ key: 'a', operator: 'NotIn', values: ['1'] }] },
      { matchExpressions: [{ key: 'a', operator: 'Exists' }] },
      { matchExpressions: [{ key: 'a', operator: 'DoesNotExist' }] },
      { matchExpressions: [{ key: 'a', operator: 'In', values: ['1', '2'] }] },
      { matchLabels: { a: '1', b: '1' } },
    ];
    const keys = new Set(inputs.map((i) => parseOk(i).key));
    assert.equal(keys.size, inputs.length);
  });
});

describe('parseSelector rejects invalid selectors with every error and its path', () => {
  const OPS = 'expected In, NotIn, Exists or DoesNotExist';
  const NAME_RULE = 'must be letters, digits, "-", "_" or ".", starting and ending with a letter or digit';
  const cases: { name: string; input: unknown; errors: { path: string; message: string }[] }[] = [
    { name: 'missing', input: undefined, errors: [{ path: 'sel', message: 'required' }] },
    {
      name: 'not an object',
      input: ['app'],
      errors: [{ path: 'sel', message: 'must be a label selector object (matchLabels and/or matchExpressions), got a list' }],
    },
    {
      name: 'unknown field (a typo would widen the selector)',
      input: { matchlabels: { app: 'web' } },
      errors: [{ path: 'sel.matchlabels', message: 'unknown field; expected matchLabels or matchExpressions' }],
    },
    {
      name: 'matchLabels not an object',
      input: { matchLabels: 'app=web' },
      errors: [{ path: 'sel.matchLabels', message: 'must be an object of label key to value, got "app=web"' }],
    },
    {
      name: 'matchLabels value not a string',
      input: { matchLabels: { port: 80 } },
      errors: [{ path: 'sel.matchLabels["port"]', message: 'label value must be a string, got 80' }],
    },
    {
      name: 'bad key and bad value in matchLabels are both reported',
      input: { matchLabels: { '-app': 'a b' } },
      errors: [
        { path: 'sel.matchLabels["-app"]', message: `invalid label key "-app": name part ${NAME_RULE}` },
        { path: 'sel.matchLabels["-app"]', message: `invalid label value "a b": ${NAME_RULE}` },
      ],
    },
    {
      name: 'operator is case-sensitive',
      input: {
        matchExpressions: [
          { key: 'a', operator: 'Exists' },
          { key: 'b', operator: 'in', values: ['x'] },
        ],
      },
      errors: [{ path: 'sel.matchExpressions[1].operator', message: `unsupported operator "in"; ${OPS}` }],
    },
    {
      name: 'missing key and operator',
      input: { matchExpressions: [{ values: ['x'] }] },
      errors: [
        { path: 'sel.matchExpressions[0].key', message: 'required' },
        { path: 'sel.matchExpressions[0].operator', message: `required; ${OPS}` },
      ],
    },
    {
      name: 'In without values',
      input: {
        matchExpressions: [
          { key: 'a', operator: 'In', values: [] },
          { key: 'b', operator: 'NotIn' },
        ],
      },
      errors: [
        { path: 'sel.matchExpressions[0].values', message: 'must be non-empty when operator is In' },
        { path: 'sel.matchExpressions[1].values', message: 'must be non-empty when operator is NotIn' },
      ],
    },
    {
      name: 'Exists with values',
      input: { matchExpressions: [{ key: 'a', operator: 'Exists', values: ['x'] }] },
      errors: [{ path: 'sel.matchExpressions[0].values', message: 'must be empty when operator is Exists' }],
    },
    {
      name: 'values not a list, value not a string, value invalid',
      input: {
        matchExpressions: [
          { key: 'a', operator: 'In', values: 'x' },
          { key: 'b', operator: 'In', values: ['ok', 7, 'x'.repeat(64)] },
        ],
      },
      errors: [
        { path: 'sel.matchExpressions[0].values', message: 'must be a list of strings, got "x"' },
        { path: 'sel.matchExpressions[1].values[1]', message: 'must be a string, got 7' },
        { path: 'sel.matchExpressions[1].values[2]', message: `invalid label value "${'x'.repeat(64)}": must be at most 63 characters` },
      ],
    },
    {
      name: 'expression not an object',
      input: { matchExpressions: [null] },
      errors: [{ path: 'sel.matchExpressions[0]', message: 'must be an object with key, operator and values, got null' }],
    },
    {
      name: 'errors from matchLabels and matchExpressions together',
      input: { matchLabels: { 'a/b/c': 'x' }, matchExpressions: { key: 'a' } },
      errors: [
        { path: 'sel.matchLabels["a/b/c"]', message: 'invalid label key "a/b/c": must contain at most one "/"' },
        { path: 'sel.matchExpressions', message: 'must be a list of requirements, got an object' },
      ],
    },
    {
      name: 'non-string operator and key',
      input: { matchExpressions: [{ key: 3, operator: true }] },
      errors: [
        { path: 'sel.matchExpressions[0].key', message: 'must be a string, got 3' },
        { path: 'sel.matchExpressions[0].operator', message: `unsupported operator true; ${OPS}` },
      ],
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const r = parseSelector(c.input, 'sel');
      assert.ok('errors' in r, 'expected errors');
      assert.deepEqual(r.errors, c.errors);
    });
  }
});

describe('label key and value syntax', () => {
  const keys: { input: string; expected: string | null }[] = [
    { input: 'app', expected: null },
    { input: 'a', expected: null },
    { input: 'A_b.c-D9', expected: null },
    { input: 'example.com/app', expected: null },
    { input: 'k8s.io/x', expected: null },
    { input: 'constructor', expected: null },
    { input: 'x'.repeat(63), expected: null },
    { input: `${'a'.repeat(253)}/x`, expected: null },
    { input: '', expected: 'must not be empty' },
    { input: 'x'.repeat(64), expected: 'name part must be at most 63 characters' },
    { input: '/app', expected: 'prefix before "/" must not be empty' },
    { input: 'example.com/', expected: 'name after "/" must not be empty' },
    { input: `${'a'.repeat(254)}/x`, expected: 'prefix must be at most 253 characters' },
    { input: 'Example.com/app', expected: 'prefix must be a DNS subdomain: lower-case letters, digits, "-" and ".", each dot-separated part starting and ending with a letter or digit' },
    { input: 'example..com/app', expected: 'prefix must be a DNS subdomain: lower-case letters, digits, "-" and ".", each dot-separated part starting and ending with a letter or digit' },
    { input: '-example.com/app', expected: 'prefix must be a DNS subdomain: lower-case letters, digits, "-" and ".", each dot-separated part starting and ending with a letter or digit' },
    { input: 'app_', expected: 'name part must be letters, digits, "-", "_" or ".", starting and ending with a letter or digit' },
    { input: '__proto__', expected: 'name part must be letters, digits, "-", "_" or ".", starting and ending with a letter or digit' },
    { input: 'a b', expected: 'name part must be letters, digits, "-", "_" or ".", starting and ending with a letter or digit' },
  ];
  for (const c of keys) {
    it(`key ${JSON.stringify(c.input.length > 20 ? `${c.input.slice(0, 20)}...` : c.input)}`, () => {
      assert.equal(labelKeyProblem(c.input), c.expected);
    });
  }
  const values: { input: string; valid: boolean }[] = [
    { input: '', valid: true },
    { input: 'web', valid: true },
    { input: 'v1.2_3-x', valid: true },
    { input: 'x'.repeat(63), valid: true },
    { input: 'x'.repeat(64), valid: false },
    { input: '-web', valid: false },
    { input: 'web.', valid: false },
    { input: 'a/b', valid: false },
    { input: 'é', valid: false },
  ];
  for (const c of values) {
    it(`value ${JSON.stringify(c.input.slice(0, 20))} is ${c.valid ? 'valid' : 'invalid'}`, () => {
      assert.equal(labelValueProblem(c.input) === null, c.valid);
    });
  }
});

describe('selectorMatches', () => {
  const cases: { name: string; selector: unknown; labels: Record<string, string>; expected: boolean }[] = [
    { name: 'empty selector matches no labels', selector: {}, labels: {}, expected: true },
    { name: 'empty selector matches any labels', selector: {}, labels: { a: '1' }, expected: true },
    { name: 'matchLabels equal', selector: { matchLabels: { app: 'web' } }, labels: { app: 'web', x: 'y' }, expected: true },
    { name: 'matchLabels other value', selector: { matchLabels: { app: 'web' } }, labels: { app: 'db' }, expected: false },
    { name: 'matchLabels absent', selector: { matchLabels: { app: 'web' } }, labels: {}, expected: false },
    { name: 'all requirements must hold (AND)', selector: { matchLabels: { app: 'web', tier: 'fe' } }, labels: { app: 'web' }, expected: false },
    { name: 'In one of several', selector: { matchExpressions: [{ key: 'e', operator: 'In', values: ['a', 'b'] }] }, labels: { e: 'b' }, expected: true },
    { name: 'NotIn holds when absent', selector: { matchExpressions: [{ key: 'e', operator: 'NotIn', values: ['a'] }] }, labels: {}, expected: true },
    { name: 'NotIn fails on listed value', selector: { matchExpressions: [{ key: 'e', operator: 'NotIn', values: ['a'] }] }, labels: { e: 'a' }, expected: false },
    { name: 'NotIn holds on other value', selector: { matchExpressions: [{ key: 'e', operator: 'NotIn', values: ['a'] }] }, labels: { e: 'b' }, expected: true },
    { name: 'Exists with empty value', selector: { matchExpressions: [{ key: 'e', operator: 'Exists' }] }, labels: { e: '' }, expected: true },
    { name: 'Exists when absent', selector: { matchExpressions: [{ key: 'e', operator: 'Exists' }] }, labels: {}, expected: false },
    { name: 'DoesNotExist when absent', selector: { matchExpressions: [{ key: 'e', operator: 'DoesNotExist' }] }, labels: {}, expected: true },
    { name: 'DoesNotExist when present', selector: { matchExpressions: [{ key: 'e', operator: 'DoesNotExist' }] }, labels: { e: 'x' }, expected: false },
    { name: 'In with the empty value', selector: { matchLabels: { e: '' } }, labels: { e: '' }, expected: true },
    { name: 'In with the empty value needs the label', selector: { matchLabels: { e: '' } }, labels: {}, expected: false },
    {
      name: 'prototype names are not labels',
      selector: {
        matchExpressions: [
          { key: 'constructor', operator: 'DoesNotExist' },
          { key: 'toString', operator: 'NotIn', values: ['x'] },
        ],
      },
      labels: {},
      expected: true,
    },
    { name: 'Exists on a prototype name when absent', selector: { matchExpressions: [{ key: 'constructor', operator: 'Exists' }] }, labels: {}, expected: false },
  ];
  for (const c of cases) {
    it(c.name, () => {
      assert.equal(selectorMatches(parseOk(c.selector), c.labels), c.expected);
    });
  }
});

describe('matchAllSelector', () => {
  it('is the parsed empty selector and matches everything', () => {
    const all = matchAllSelector();
    assert.deepEqual(all, parseOk({}));
    assert.equal(isMatchAll(all), true);
    assert.equal(selectorMatches(all, { any: 'thing' }), true);
  });
  it('a selector with requirements is not match-all', () => {
    assert.equal(isMatchAll(parseOk({ matchExpressions: [{ key: 'a', operator: 'DoesNotExist' }] })), false);
  });
});
