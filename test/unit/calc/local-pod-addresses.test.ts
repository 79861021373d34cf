// Calculator.localPodAddresses: the addresses of the pods this node polices, which the flow
// judge treats as local (their chains are consulted), and no other pod's.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { diff, EMPTY, newCalc, pod, world } from './fixtures.ts';

test('localPodAddresses holds both families of every pod this node polices, and no other pod', () => {
  const calc = newCalc();
  const pods = [
    pod('web', 'dual', { ip4: 1 }),
    pod('web', 'v4-only', { ip4: 2, ip6: false }),
    pod('web', 'remote', { ip4: 3, nodeName: 'node-b' }),
    pod('web', 'host', { ip4: 4, hostNetwork: true }),
    pod('web', 'done', { ip4: 5, phase: 'Succeeded' }),
  ];
  const w = world(pods, [{ name: 'web', labels: {} }], []);
  calc.applyEvents(diff(EMPTY, w));
  assert.deepEqual(calc.localPodAddresses().sort(), ['10.244.1.1', '10.244.1.2', 'fd00::1']);
  calc.applyEvents([{ kind: 'Pod', op: 'delete', uid: 'web/dual' }]);
  assert.deepEqual(calc.localPodAddresses(), ['10.244.1.2']);
});
