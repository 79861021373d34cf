// The one hash names are made of. node:crypto's createHash is pure (same input, same output,
// no state, clock or randomness), so the pure-core rule allows it here and nothing else of
// node:crypto (test/unit/architecture/purity.test.ts).

import { createHash } from 'node:crypto';

/** Unpadded base64url of the SHA-256 of the UTF-8 text (43 characters). */
export function sha256Base64Url(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('base64url');
}
