// The text form of an explanation: how a rule's audit rate limit is told.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Match } from '../../../src/calc/desired.ts';
import type { Explanation } from '../../../src/explain/explain.ts';
import { formatExplanation } from '../../../src/explain/format.ts';

/** An explanation whose deciding rule is an audit rule with this limit. */
function withLimit(limit: Match): Explanation {
  const rule = { matches: [limit], action: { kind: 'nflog', group: 77, prefix: 'weir:DI:x', size: 128 } } as const;
  return {
    source: { given: 'a/p', kind: 'pod', pod: 'a/p', node: 'node-a', ips: ['10.0.0.1'] },
    destination: { given: 'a/q', kind: 'pod', pod: 'a/q', node: 'node-a', ips: ['10.0.0.2'] },
    protocol: 'TCP',
    port: 80,
    families: [
      {
        family: 4,
        src: '10.0.0.1',
        dst: '10.0.0.2',
        verdict: 'allowed',
        directions: [
          {
            direction: 'ingress',
            node: 'node-a',
            pod: 'a/q',
            verdict: 'allowed',
            reason: 'other',
            rule: { chain: 'cali-tw-q', position: 3, rule, lookups: [], merged: false },
            path: [],
            logged: [],
            reached: true,
          },
        ],
      },
    ],
  };
}

test("an audit rule's limit is told as the node's ceiling and, when set, each source address's bucket", () => {
  const node = { kind: 'limit', name: 'cali-an', perSecond: 10000, burst: 20000 } as const;
  assert.match(formatExplanation(withLimit(node)), /at most 10000\/s for the node, then log as/);
  const perSource = { ...node, perSource: { name: 'cali-as', perSecond: 100, burst: 200, tableMax: 50000, expireMs: 2000 } };
  assert.match(formatExplanation(withLimit(perSource)), /at most 10000\/s for the node and 100\/s per source address, then log as/);
});
