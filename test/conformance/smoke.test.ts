import { after, before, describe, test } from 'node:test';
import { A1, Conformance, np, type Cell } from './harness.ts';

describe('conformance smoke', () => {
  let c: Conformance;
  before(async () => {
    c = await Conformance.start();
  });
  after(async () => {
    await c?.stop();
  });

  test('with no policy every pod and the external host reach every pod', async () => {
    await c.reset();
    await c.expect(() => true);
  });

  test('a default-deny ingress policy isolates only the pods of its namespace it selects', async () => {
    await c.reset();
    await c.setPolicies(np('alpha', 'deny', { podSelector: { matchLabels: { app: 'web' } } }));
    await c.expect((x: Cell) => x.target !== A1 || x.source === A1);
  });
});
