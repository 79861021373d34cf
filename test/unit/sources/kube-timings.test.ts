import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_KUBE_TIMINGS } from '../../../src/sources/kube/index.ts';

test('the default watchdog outlasts the API server bookmark period and the default watch timeouts are randomised', () => {
  assert.ok(DEFAULT_KUBE_TIMINGS.watchdogMs > 60_000, 'bookmarks come about once a minute');
  assert.ok(DEFAULT_KUBE_TIMINGS.watchTimeoutSeconds[0] < DEFAULT_KUBE_TIMINGS.watchTimeoutSeconds[1]);
  assert.ok(DEFAULT_KUBE_TIMINGS.relistMs[0] < DEFAULT_KUBE_TIMINGS.relistMs[1]);
});
