import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseDaemonSetRef, UNINSTALL_ANNOTATION, uninstallTokenOf } from '../../../src/lifecycle/daemonset-ref.ts';

describe('the uninstall signal on the agents’ DaemonSet', () => {
  test('--daemonset takes NAMESPACE/NAME and nothing else', () => {
    assert.deepEqual(parseDaemonSetRef('kube-system/weir'), { namespace: 'kube-system', name: 'weir' });
    for (const bad of ['weir', 'kube-system/', '/weir', 'a/b/c', 'Kube/weir', 'kube-system/weir ']) assert.equal(parseDaemonSetRef(bad), null, bad);
  });

  test('the token is the annotation’s value; none, empty or not a string says nothing', () => {
    const ds = (annotations: unknown) => ({ metadata: { name: 'weir', annotations } });
    assert.equal(uninstallTokenOf(ds({ [UNINSTALL_ANNOTATION]: 't-1' })), 't-1');
    assert.equal(uninstallTokenOf(ds({ [UNINSTALL_ANNOTATION]: '' })), null);
    assert.equal(uninstallTokenOf(ds({ other: 'x' })), null);
    assert.equal(uninstallTokenOf(ds(undefined)), null);
    assert.equal(uninstallTokenOf(null), null);
  });
});
