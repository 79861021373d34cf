#!/usr/bin/env bash
# The agent's container image, built without Docker (run as root).
#
#   image.sh build   build the image (cached by content hash); prints the path of the OCI image
#                    archive, ~/.cache/weir/image/weir-VERSION.oci.tar
#   image.sh spec    print, as JSON, what the image is made of (Debian packages, entrypoint,
#                    cmd, working directory, environment): the test that keeps the Dockerfile
#                    in step compares it with the Dockerfile, and the smoke test with the image
#   image.sh check-node   fail unless node_modules/node/bin/node is the pinned binary (below);
#                    the build runs it, and so does the Dockerfile's
#
# Three layers: a minimal Debian rootfs made by mmdebstrap (Debian's essential set plus the
# packages in image/packages, no apt, no docs), Node from the npm package 'node' the lockfile
# pins (the official build, the same binary the tests run), and the app in /app (package.json,
# dist/ bundled here by scripts/build.ts with every dependency inside, examples/). umoci,
# from Debian, packs them as an OCI image layout, tarred as an OCI archive that skopeo, ctr
# and podman read. The Debian layer is cached apart, by its package list and options: a
# change to the app rebuilds only the other two. Remove .cache/image/base-* to take in
# Debian's latest updates.
set -euo pipefail
umask 022

repo=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${WEIR_IMAGE_CACHE:-${WEIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}/image}
suite=bookworm
node_bin=$repo/node_modules/node/bin/node

# What a container runtime runs; the Dockerfile says the same (test/image/spec.test.ts).
# The Node flags are src/cli/node-flags.ts's (test/image/spec.test.ts keeps them equal).
entrypoint=(node --max-semi-space-size=2 --expose-gc /app/dist/cli/main.js)
cmd=(agent)
workdir=/app
env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)

log() { echo "image: $*" >&2; }
die() { log "$*"; exit 1; }

# The Node binary the image ships, pinned by content as a base image is pinned by digest. npm
# installs it from the package node-linux-ARCH@VERSION, which the install script of the 'node'
# package names: package-lock.json pins that package's tarball by hash, not the binary's. The
# sums are bin/node of the registry's tarballs, whose npm integrity was checked. A new Node
# needs its sums here; check-node prints the one it found.
node_sha256() {
  case "$1 $2" in
    "v24.21.0 amd64") echo 7fde7b8afa198da66257f42ee2001d874c7355631e6d1579a5fb5ef1f246df4c ;;
    "v24.21.0 arm64") echo 0f8949d1028f6d61506b2d5bc57e7e6fe893d7b1997509b7847294fc9c616584 ;;
  esac
}

cmd_check_node() {
  local version arch want got
  [ -x "$node_bin" ] || die "$node_bin missing: run npm ci (the 'node' dev dependency ships it)"
  version=$("$node_bin" --version)
  arch=$(dpkg --print-architecture)
  got=$(sha256sum "$node_bin" | cut -d' ' -f1)
  want=$(node_sha256 "$version" "$arch")
  [ -n "$want" ] || die "no sha256 pinned for Node $version on $arch in scripts/image.sh (this binary's is $got)"
  [ "$got" = "$want" ] || die "$node_bin (Node $version, $arch) has sha256 $got, not the pinned $want"
}

packages() { sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$repo/image/packages"; }

version() { sed -n 's/^  "version": "\([^"]*\)",$/\1/p' "$repo/package.json" | head -n1; }

json_list() {
  local first=1 s
  printf '['
  for s in "$@"; do
    [ "$first" = 1 ] || printf ', '
    first=0
    printf '"%s"' "$s"
  done
  printf ']'
}

cmd_spec() {
  local pkgs
  mapfile -t pkgs < <(packages)
  printf '{"suite": "%s", "packages": %s, "entrypoint": %s, "cmd": %s, "workdir": "%s", "env": %s, "version": "%s"}\n' \
    "$suite" "$(json_list "${pkgs[@]}")" "$(json_list "${entrypoint[@]}")" "$(json_list "${cmd[@]}")" "$workdir" "$(json_list "${env[@]}")" "$(version)"
}

# The mmdebstrap arguments, less the output file: they name the Debian layer's cache entry.
base_args() {
  local pkgs
  pkgs=$(packages | paste -sd, -)
  printf '%s\n' \
    --variant=essential \
    "--include=$pkgs" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "--architectures=$(dpkg --print-architecture)" \
    "$suite"
}

# The merged-usr hook sets up /bin -> usr/bin the way debootstrap does, without the usrmerge
# package (which would pull in perl, 46 MB). No mirror is named: mmdebstrap then uses Debian's
# main mirror with the suite's updates and security sources.
build_base() {
  local out=$1 args tmp started
  mapfile -t args < <(base_args)
  tmp="${out%.tar}.tmp.tar"
  rm -f "$tmp"
  log "Debian layer: mmdebstrap $suite, essential + $(packages | paste -sd' ' -)"
  started=$(date +%s)
  if ! mmdebstrap --quiet "${args[@]}" "$tmp" >"$cache_root/base.log" 2>&1; then
    tail -n 40 "$cache_root/base.log" >&2
    rm -f "$tmp"
    die "mmdebstrap failed after $(($(date +%s) - started))s (log: $cache_root/base.log)"
  fi
  mv "$tmp" "$out"
  log "Debian layer built in $(($(date +%s) - started))s: $(du -h "$out" | cut -f1)"
}

# Every file that goes into the node and app layers, and how they are made.
app_stamp() {
  (
    cd "$repo"
    sha256sum scripts/image.sh scripts/build.ts package.json package-lock.json "$node_bin"
    find src examples image -type f -print0 | sort -z | xargs -0 sha256sum
  ) | sha256sum | cut -d' ' -f1
}

# A layer tar with fixed owners, order and times, so the same files make the same layer.
layer_tar() {
  local dir=$1 out=$2
  shift 2
  tar --create --file "$out" --directory "$dir" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime=@"${SOURCE_DATE_EPOCH:-0}" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}

build_app() {
  local work=$1 app=$1/app/app
  mkdir -p "$app" "$1/node/usr/local/bin"
  cp "$node_bin" "$1/node/usr/local/bin/node"
  chmod 755 "$1/node/usr/local/bin/node"
  log "app layer: scripts/build.ts (one bundle, no node_modules)"
  # The build runs on the project's Node 24, as npm scripts do.
  "$node_bin" "$repo/scripts/build.ts" "$app/dist" || die "scripts/build.ts failed"
  # package.json makes dist/ an ES module and names the version.
  cp "$repo/package.json" "$app/"
  cp -r "$repo/examples" "$app/examples"
  chmod -R u=rwX,go=rX "$app"
}

cmd_build() {
  # Sourced here, not at the top: the Dockerfile copies this script alone to run check-node.
  # shellcheck source=scripts/lib/build.sh
  . "$repo/scripts/lib/build.sh"
  locked_build "$cache_root" build_locked
}

build_locked() {
  local v base_key base stamp archive image node_version started
  [ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap installs packages into a chroot)"
  for tool in mmdebstrap umoci tar; do
    command -v "$tool" >/dev/null || die "$tool not found: scripts/setup.sh installs it"
  done
  [ -x "$node_bin" ] || die "$node_bin missing: run npm ci (the 'node' dev dependency ships it)"
  node_version=$("$node_bin" --version)
  [[ $node_version == v24.* ]] || die "$node_bin is Node $node_version, not 24"
  cmd_check_node
  v=$(version)
  [ -n "$v" ] || die "no version in package.json"
  archive=$cache_root/weir-$v.oci.tar

  base_key=$(base_args | sha256sum | cut -c1-16)
  base=$cache_root/base-$base_key.tar
  stamp="$base_key $(app_stamp)"
  if [ -f "$archive" ] && [ "$(cat "$archive.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$archive"
    return
  fi
  started=$(date +%s)
  [ -f "$base" ] || build_base "$base"

  # Global, not local: the EXIT trap runs after this function has returned.
  work=$(mktemp -d "$cache_root/work.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  build_app "$work"
  layer_tar "$work/node" "$work/node.tar" usr/local/bin/node
  layer_tar "$work/app" "$work/app.tar" app

  log "packing with umoci"
  image="$work/oci:$v"
  umoci init --layout "$work/oci"
  umoci new --image "$image"
  umoci raw add-layer --image "$image" --history.created_by "mmdebstrap $suite: essential + $(packages | paste -sd' ' -)" "$base"
  umoci raw add-layer --image "$image" --history.created_by "node $node_version (npm package node)" "$work/node.tar"
  umoci raw add-layer --image "$image" --history.created_by "weir $v: package.json, dist (one bundle), examples" "$work/app.tar"
  local config_args=(--image "$image" --os linux --architecture "$(dpkg --print-architecture)" --config.workingdir "$workdir" --clear config.entrypoint --clear config.cmd)
  local s
  for s in "${entrypoint[@]}"; do config_args+=(--config.entrypoint "$s"); done
  for s in "${cmd[@]}"; do config_args+=(--config.cmd "$s"); done
  for s in "${env[@]}"; do config_args+=(--config.env "$s"); done
  umoci config "${config_args[@]}" \
    --config.label "org.opencontainers.image.title=weir" \
    --config.label "org.opencontainers.image.version=$v" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0" \
    --history.created_by "entrypoint ${entrypoint[*]}, cmd ${cmd[*]}"
  # Every umoci step writes a new manifest and config; keep only the final image's blobs.
  umoci gc --layout "$work/oci"
  chmod -R a+rX "$work/oci"
  layer_tar "$work/oci" "$archive.tmp" oci-layout index.json blobs
  mv "$archive.tmp" "$archive"
  echo "$stamp" >"$archive.stamp"
  log "built $archive in $(($(date +%s) - started))s: $(du -h "$archive" | cut -f1) (layers unpacked: Debian $(du -h "$base" | cut -f1), node $(du -h "$work/node.tar" | cut -f1), app $(du -h "$work/app.tar" | cut -f1))"
  echo "$archive"
}

case ${1:-} in
  build) cmd_build ;;
  spec) cmd_spec ;;
  check-node) cmd_check_node ;;
  *) die "usage: $0 build|spec|check-node" ;;
esac
