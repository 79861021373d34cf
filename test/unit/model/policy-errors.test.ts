import assert from 'node:assert/strict';
import { test } from 'node:test';
import { formatPolicyErrors, policyErrorLines } from '../../../src/model/policy-errors.ts';

const errors = [
  { path: 'spec.ingress[0].from[0].ipBlock.cidr', message: 'invalid CIDR "nonsense"' },
  { path: 'spec.ingress[0].ports[0].port', message: 'port 70000 is out of range' },
];

test('policy errors are worded as "<field path>: <message>", one per line or joined by "; "', () => {
  const cases = [
    { name: 'no error', errors: [], lines: [], joined: '' },
    {
      name: 'one error',
      errors: errors.slice(0, 1),
      lines: ['spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "nonsense"'],
      joined: 'spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "nonsense"',
    },
    {
      name: 'two errors, in order',
      errors,
      lines: ['spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "nonsense"', 'spec.ingress[0].ports[0].port: port 70000 is out of range'],
      joined: 'spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "nonsense"; spec.ingress[0].ports[0].port: port 70000 is out of range',
    },
  ];
  for (const c of cases) {
    assert.deepEqual(policyErrorLines(c.errors), c.lines, c.name);
    assert.equal(formatPolicyErrors(c.errors), c.joined, c.name);
  }
});
