// The agent image, as built without Docker by scripts/image.sh (cached), read back from its
// OCI archive and smoke-tested: its own files run weir's commands and the agent on both
// iptables backends in a network namespace of its own (see smoke.ts). Copies with a program,
// a library or an iptables extension removed must fail the smoke test: it proves something.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { lstat, mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { capture, unpackArchive, type UnpackedImage } from './oci.ts';
import { SmokeFailure, smokeTest } from './smoke.ts';
import { imageSpec, type ImageSpec } from './spec.ts';

const SCRIPT = fileURLToPath(new URL('../../scripts/image.sh', import.meta.url));

/** Runs `image.sh build`, its progress on this process's stderr; resolves with the archive. */
function build(): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', [SCRIPT, 'build'], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(out.trim().split('\n').pop()!) : reject(new Error(`image.sh build exited ${code}`))));
  });
}

/** Mount points under dir, as the host sees them: there must be none before it is removed. */
async function mountsUnder(dir: string): Promise<string[]> {
  const info = await readFile('/proc/self/mountinfo', 'utf8');
  return info
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m === dir || m.startsWith(`${dir}/`));
}

describe('the agent image', () => {
  let dir = '';
  let archive = '';
  let image: UnpackedImage;
  let spec: ImageSpec;
  const copies: string[] = [];

  before(async () => {
    archive = await build();
    spec = imageSpec();
    dir = await mkdtemp(join(tmpdir(), 'weir-image-'));
    image = await unpackArchive(archive, dir);
  });

  after(async () => {
    if (dir === '') return;
    const left = await mountsUnder(dir);
    // Never rm -rf through a bind mount of the host's /dev or /sys.
    assert.deepEqual(left, [], `mounts left under ${dir}; not removing it`);
    await rm(dir, { recursive: true, force: true });
  });

  /** A copy of the unpacked root filesystem (hard links: instant) without `paths`. */
  async function copyWithout(name: string, ...paths: string[]): Promise<string> {
    const copy = join(dir, name);
    await capture('cp', ['-al', image.rootfs, copy]);
    copies.push(copy);
    for (const p of paths) {
      await lstat(join(copy, p)); // the file must exist for its removal to prove anything
      await rm(join(copy, p));
    }
    return copy;
  }

  test('is an OCI archive of weir VERSION whose config runs the agent as the script and the Dockerfile say', async () => {
    assert.equal(image.refName, spec.version);
    assert.match(archive, new RegExp(`/weir-${spec.version.replaceAll('.', '\\.')}\\.oci\\.tar$`));
    const c = image.config;
    assert.equal(c.os, 'linux');
    assert.deepEqual(c.config.Entrypoint, spec.entrypoint);
    assert.deepEqual(c.config.Cmd, spec.cmd);
    assert.equal(c.config.WorkingDir, spec.workdir);
    assert.deepEqual(c.config.Env, spec.env);
    // A second, independent reader (containers/image, as in podman and CRI-O) sees the same.
    const seen = JSON.parse(await capture('skopeo', ['inspect', '--config', `oci-archive:${archive}`])) as typeof c;
    assert.deepEqual(seen.config, c.config);
    assert.deepEqual(seen.rootfs.diff_ids, c.rootfs.diff_ids);
    const size = (await stat(archive)).size;
    const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
    console.log(`image archive ${archive}: ${mb(size)}; compressed layers ${image.layerSizes.map(mb).join(' + ')}`);
  });

  test('holds the Debian packages of image/packages, Node 24 and the app', async () => {
    const status = await readFile(join(image.rootfs, 'var/lib/dpkg/status'), 'utf8');
    const installed = new Set(
      status
        .split('\n\n')
        .filter((s) => /^Status: install ok installed$/m.test(s))
        .map((s) => /^Package: (\S+)$/m.exec(s)?.[1]),
    );
    for (const p of spec.packages) assert.ok(installed.has(p), `${p} is not installed in the image`);
    // Debian's essential set without apt, perl or docs: the image stays small.
    for (const p of ['apt', 'perl', 'usrmerge']) assert.ok(!installed.has(p), `${p} should not be in the image`);
    console.log(`${installed.size} Debian packages; du of the root filesystem: ${(await capture('du', ['-sh', image.rootfs])).split('\t')[0]}`);
    for (const f of ['usr/local/bin/node', 'app/package.json', 'app/dist/cli/main.js', 'app/examples/30-policies.yaml']) {
      await stat(join(image.rootfs, f));
    }
    // The bundle holds every dependency: a node_modules would be dead weight.
    await assert.rejects(stat(join(image.rootfs, 'app/node_modules')), 'the image holds a node_modules');
  });

  test('runs weir --help, weir render and the agent on the nft and the legacy backend, chrooted in a fresh network namespace', async () => {
    const t0 = performance.now();
    const report = await smokeTest(image.rootfs, image.config);
    console.log(`smoke test: ${Math.round(performance.now() - t0)} ms; chains read back after ${JSON.stringify(report.chainsWrittenMs)} ms`);
  });

  test('fails without ipset', async () => {
    const rootfs = await copyWithout('no-ipset', 'usr/sbin/ipset');
    await assert.rejects(smokeTest(rootfs, image.config), (err: unknown) => {
      assert.ok(err instanceof SmokeFailure, String(err));
      console.log(`as it should, the smoke test failed: ${err.message.split('\n').slice(0, 2).join(' | ').slice(0, 400)}`);
      assert.equal(err.step, 'programs');
      assert.match(err.message, /^ {2}ipset \(exit \d+\)/m);
      return true;
    });
  });

  test("fails without Node's C++ runtime library", async () => {
    const libs = (await capture('find', [join(image.rootfs, 'usr/lib'), '-name', 'libstdc++.so.6*'])).trim().split('\n');
    assert.ok(libs.length > 0 && libs[0] !== '', 'libstdc++ not found in the image');
    const rootfs = await copyWithout('no-libstdcxx', ...libs.map((l) => l.slice(image.rootfs.length + 1)));
    await assert.rejects(smokeTest(rootfs, image.config), (err: unknown) => {
      assert.ok(err instanceof SmokeFailure, String(err));
      console.log(`as it should, the smoke test failed: ${err.message.split('\n').slice(0, 2).join(' | ').slice(0, 400)}`);
      assert.equal(err.step, 'weir --help');
      assert.match(err.message, /libstdc\+\+\.so\.6/);
      return true;
    });
  });

  test("fails without iptables' physdev extension, which only the agent's own write loads", async () => {
    const ext = (await capture('find', [join(image.rootfs, 'usr/lib'), '-name', 'libxt_physdev.so'])).trim();
    assert.notEqual(ext, '', 'libxt_physdev.so not found in the image');
    const rootfs = await copyWithout('no-physdev', ext.slice(image.rootfs.length + 1));
    await assert.rejects(smokeTest(rootfs, image.config), (err: unknown) => {
      assert.ok(err instanceof SmokeFailure, String(err));
      console.log(`as it should, the smoke test failed: ${err.message.split('\n').slice(0, 2).join(' | ').slice(0, 400)}`);
      assert.equal(err.step, 'weir agent --backend nft');
      assert.match(err.message, /physdev/);
      return true;
    });
  });
});
