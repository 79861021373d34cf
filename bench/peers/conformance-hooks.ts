// Loaded with `node --import` in front of a test/conformance/*.test.ts file: the test file's
// import of ./harness.ts resolves to conformance-harness.ts, which runs the same scenarios
// through a real API server against the enforcer of the bench's choice. Nothing else changes:
// the scenarios, their predicates and their assertions are the test file's own.

import { registerHooks } from 'node:module';

const HARNESS = new URL('../../test/conformance/harness.ts', import.meta.url).href;
const API_HARNESS = new URL('./conformance-harness.ts', import.meta.url).href;
const SCENARIOS = new URL('../../test/conformance/', import.meta.url).href;

registerHooks({
  resolve(specifier, context, nextResolve) {
    const resolved = nextResolve(specifier, context);
    const fromScenario = context.parentURL?.startsWith(SCENARIOS) === true && context.parentURL.endsWith('.test.ts');
    return fromScenario && resolved.url === HARNESS ? { ...resolved, url: API_HARNESS, shortCircuit: true } : resolved;
  },
});
