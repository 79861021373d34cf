// Reads an OCI image archive the way a container runtime does, with nothing of the tools that
// wrote it: the archive's index, the manifest and config it points to, every blob checked
// against its digest and size, and the layers unpacked in order into a root filesystem.

import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';

export interface ImageConfig {
  readonly architecture: string;
  readonly os: string;
  readonly config: {
    readonly Entrypoint?: string[];
    readonly Cmd?: string[];
    readonly Env?: string[];
    readonly WorkingDir?: string;
    readonly Labels?: Record<string, string>;
  };
  readonly rootfs: { readonly type: string; readonly diff_ids: string[] };
}

interface Descriptor {
  readonly mediaType: string;
  readonly digest: string;
  readonly size: number;
  readonly annotations?: Record<string, string>;
}

export interface UnpackedImage {
  /** The tag the archive names its image by (org.opencontainers.image.ref.name). */
  readonly refName: string | undefined;
  readonly config: ImageConfig;
  /** Compressed size of each layer, in order. */
  readonly layerSizes: number[];
  readonly rootfs: string;
}

const LAYER_GZIP = 'application/vnd.oci.image.layer.v1.tar+gzip';

/** Unpacks the archive's one image into `${dir}/rootfs` (run as root: owners are kept). */
export async function unpackArchive(archive: string, dir: string): Promise<UnpackedImage> {
  const layout = join(dir, 'layout');
  const rootfs = join(dir, 'rootfs');
  await mkdir(layout, { recursive: true });
  await mkdir(rootfs, { recursive: true });
  await run('tar', ['-xf', archive, '-C', layout]);

  const marker = JSON.parse(await readFile(join(layout, 'oci-layout'), 'utf8')) as { imageLayoutVersion?: string };
  if (marker.imageLayoutVersion !== '1.0.0') throw new Error(`oci-layout says ${JSON.stringify(marker)}, not version 1.0.0`);
  const index = JSON.parse(await readFile(join(layout, 'index.json'), 'utf8')) as { manifests: Descriptor[] };
  if (index.manifests.length !== 1) throw new Error(`index.json lists ${index.manifests.length} manifests, not one`);
  const top = index.manifests[0];
  const manifest = JSON.parse(await readBlob(layout, top)) as { config: Descriptor; layers: Descriptor[] };
  const config = JSON.parse(await readBlob(layout, manifest.config)) as ImageConfig;
  if (config.rootfs.diff_ids.length !== manifest.layers.length) {
    throw new Error(`the config lists ${config.rootfs.diff_ids.length} layer digests, the manifest ${manifest.layers.length} layers`);
  }
  for (const [i, layer] of manifest.layers.entries()) {
    if (layer.mediaType !== LAYER_GZIP) throw new Error(`layer ${i} is ${layer.mediaType}, not ${LAYER_GZIP}`);
    await extractLayer(layout, layer, config.rootfs.diff_ids[i], rootfs);
  }
  // No layer of this image deletes a file of a lower one; a whiteout would mean it tried.
  const whiteouts = await capture('find', [rootfs, '-name', '.wh.*']);
  if (whiteouts.trim() !== '') throw new Error(`whiteout files found, which this reader does not apply:\n${whiteouts}`);
  return { refName: top.annotations?.['org.opencontainers.image.ref.name'], config, layerSizes: manifest.layers.map((l) => l.size), rootfs };
}

function blobPath(layout: string, d: Descriptor): string {
  const m = /^sha256:([0-9a-f]{64})$/.exec(d.digest);
  if (!m) throw new Error(`unsupported digest ${d.digest}`);
  return join(layout, 'blobs', 'sha256', m[1]);
}

async function readBlob(layout: string, d: Descriptor): Promise<string> {
  const bytes = await readFile(blobPath(layout, d));
  const digest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
  if (digest !== d.digest || bytes.length !== d.size) throw new Error(`blob ${d.digest} (${d.size} bytes) holds ${digest} (${bytes.length} bytes)`);
  return bytes.toString('utf8');
}

/** Streams one gzip layer into tar, checking both its digest and its uncompressed diff id. */
async function extractLayer(layout: string, layer: Descriptor, diffId: string, rootfs: string): Promise<void> {
  const path = blobPath(layout, layer);
  const size = (await stat(path)).size;
  if (size !== layer.size) throw new Error(`layer ${layer.digest} is ${size} bytes, the manifest says ${layer.size}`);
  const compressed = createHash('sha256');
  const plain = createHash('sha256');
  const tee = (h: ReturnType<typeof createHash>) =>
    new Transform({
      transform(chunk, _enc, done) {
        h.update(chunk);
        done(null, chunk);
      },
    });
  // --ignore-zeros: tar reads its input to the end. Without it, tar may exit (status 0, nothing
  // on stderr) once it has read the end-of-archive blocks, and the layer's bytes still being
  // written after them fail the pipeline with a premature close: seen in CI rehearsals, with
  // this error naming tar's exit. The diff id digest needs every byte read anyway.
  const tar = spawn('tar', ['-x', '--ignore-zeros', '-f', '-', '-C', rootfs, '--numeric-owner', '--same-owner', '--preserve-permissions'], { stdio: ['pipe', 'ignore', 'pipe'] });
  let stderr = '';
  tar.stderr.on('data', (c: Buffer) => (stderr += c));
  const exited = new Promise<number | null>((resolve) => tar.on('close', resolve));
  // A failed pipeline hides why: tar's exit and stderr go with it.
  await pipeline(createReadStream(path), tee(compressed), createGunzip(), tee(plain), tar.stdin).catch(async (err: unknown) => {
    throw new Error(`unpacking layer ${layer.digest}: ${String(err)}; tar exited ${await exited}: ${stderr}`);
  });
  const code = await exited;
  if (code !== 0) throw new Error(`tar -x of layer ${layer.digest} exited ${code}: ${stderr}`);
  if (`sha256:${compressed.digest('hex')}` !== layer.digest) throw new Error(`layer blob does not match its digest ${layer.digest}`);
  if (`sha256:${plain.digest('hex')}` !== diffId) throw new Error(`layer ${layer.digest} does not unpack to its diff id ${diffId}`);
}

export function capture(cmd: string, args: readonly string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c));
    child.stderr.on('data', (c: Buffer) => (err += c));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${err.trim()}`))));
  });
}

async function run(cmd: string, args: readonly string[]): Promise<void> {
  await capture(cmd, args);
}
