// What scripts/image.sh builds, as it says itself (`image.sh spec`).

import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const SCRIPT = fileURLToPath(new URL('../../scripts/image.sh', import.meta.url));

export interface ImageSpec {
  readonly suite: string;
  readonly packages: string[];
  readonly entrypoint: string[];
  readonly cmd: string[];
  readonly workdir: string;
  readonly env: string[];
  readonly version: string;
}

export function imageSpec(): ImageSpec {
  return JSON.parse(execFileSync('bash', [SCRIPT, 'spec'], { encoding: 'utf8' })) as ImageSpec;
}
