// How the agent learns it must stop.

/**
 * Resolves on the first SIGINT or SIGTERM. The listeners stay registered on purpose: while a
 * command runs, execa's child cleanup (signal-exit) listens too, and it re-raises a signal that
 * no other listener holds anymore, so with once() the agent died of its own SIGTERM, without
 * stopping, whenever iptables or ip happened to be running as the signal arrived.
 */
export function waitForSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    process.on('SIGINT', () => resolve('SIGINT'));
    process.on('SIGTERM', () => resolve('SIGTERM'));
  });
}
