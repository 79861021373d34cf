import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApplyFailures, MAX_REMEMBERED_FAILURES } from '../../../src/agent/apply-failures.ts';
import { compilePolicy } from '../../../src/model/policy.ts';

const policy = (name: string, generation = 1) => compilePolicy({ namespace: 'shop', name, uid: `u-${name}`, generation, spec: { podSelector: {} } });
const change = (name: string, generation = 1) => ({ key: `shop/${name}`, policy: policy(name, generation) });
const failed = (...policyChanges: { key: string; policy: ReturnType<typeof policy> | null }[]) => ({ ok: false, error: 'iptables-restore: line 4 failed', policyChanges });

describe('the policies a failing apply carried', () => {
  test('names each policy with its generation and the error', () => {
    assert.deepEqual(new ApplyFailures().record(failed(change('web', 3))), [
      { namespace: 'shop', name: 'web', uid: 'u-web', generation: 3, error: 'could not apply generation 3 (will retry): iptables-restore: line 4 failed' },
    ]);
  });

  test('a retry that carries no change keeps naming them; an edit names the new generation; a success forgets them all', () => {
    const f = new ApplyFailures();
    f.record(failed(change('web', 1), change('db', 1)));
    assert.deepEqual(
      f.record(failed()).map((p) => p.name),
      ['web', 'db'],
    );
    assert.deepEqual(
      f.record(failed(change('web', 2))).map((p) => [p.name, p.generation]),
      [
        ['web', 2],
        ['db', 1],
      ],
    );
    assert.deepEqual(f.record({ ok: true, policyChanges: [] }), []);
    assert.deepEqual(f.record(failed()), [], 'nothing carried over a success');
  });

  test('a policy deleted while failing is no longer named', () => {
    const f = new ApplyFailures();
    f.record(failed(change('web'), change('db')));
    assert.deepEqual(
      f.record(failed({ key: 'shop/web', policy: null })).map((p) => p.name),
      ['db'],
    );
  });

  test(`remembers at most ${MAX_REMEMBERED_FAILURES} policies, and still follows the ones it holds`, () => {
    const f = new ApplyFailures();
    const many = Array.from({ length: MAX_REMEMBERED_FAILURES + 5 }, (_, i) => change(`p${i}`));
    assert.equal(f.record(failed(...many)).length, MAX_REMEMBERED_FAILURES);
    const after = f.record(failed(change('p0', 7)));
    assert.equal(after.length, MAX_REMEMBERED_FAILURES);
    assert.equal(after.find((p) => p.name === 'p0')?.generation, 7);
  });
});
