// Policies the random walks of calculator.test.ts and selection.test.ts both start from.

import type { RawClusterNetworkPolicy, RawNetworkPolicy } from '../../../src/model/types.ts';
import { clusterPolicy, policy } from './fixtures.ts';

/** db's pods labelled app=db take the web pods of team-a namespaces, on the named port sql. */
export const DB_FROM_WEB: RawNetworkPolicy = policy('db', 'from-web', {
  podSelector: { matchLabels: { app: 'db' } },
  ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } }, podSelector: { matchLabels: { app: 'web' } } }], ports: [{ port: 'sql' }] }],
});

/** Baseline over every namespace: ingress from team-a namespaces accepted, from any other denied; `more` adds to its spec. */
export function baselineTeamA(name: string, more: Record<string, unknown> = {}): RawClusterNetworkPolicy {
  return clusterPolicy(name, {
    tier: 'Baseline',
    priority: 1,
    subject: { namespaces: {} },
    ingress: [
      { action: 'Accept', from: [{ namespaces: { matchLabels: { team: 'a' } } }] },
      { action: 'Deny', from: [{ namespaces: {} }] },
    ],
    ...more,
  });
}
