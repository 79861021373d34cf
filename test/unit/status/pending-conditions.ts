// The conditions the status tests' common scene ends in, as the API server stores them: a valid
// policy wanted on node-a and node-b, node-b not yet at its generation, all at T0
// (2025-06-01T12:00:00Z). NetworkPolicyStatus and ClusterNetworkPolicy status carry the same two.

/** Accepted True (Valid), and Enforced False (NodesPending) because node-b lacks `generation`. */
export const pendingOnNodeB = (generation: number) => [
  { type: 'Accepted', status: 'True', observedGeneration: generation, lastTransitionTime: '2025-06-01T12:00:00Z', reason: 'Valid', message: 'the spec is valid and supported' },
  {
    type: 'Enforced',
    status: 'False',
    observedGeneration: generation,
    lastTransitionTime: '2025-06-01T12:00:00Z',
    reason: 'NodesPending',
    message: `1 of 2 nodes have not realized generation ${generation}: node-b`,
  },
];
