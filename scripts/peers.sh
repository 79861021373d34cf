#!/usr/bin/env bash
# The peer enforcers of the side-by-side benchmark (npm run bench:peers), built from source.
# Not part of the product and not part of CI: only the benchmark uses them.
#
#   peers.sh build     build kube-router once (cached); prints the directory holding it
#   peers.sh path      print the cached binary's path, or fail when it is not built
#
# kube-router v2.11.1 is built from the source tarball in ../shared/peers (the Go module proxy
# serves no version of github.com/cloudnativelabs/kube-router/v2), with that directory's README
# recipe: its pinned pseudo-version of github.com/vishvananda/netlink is not served, so it is
# replaced by v1.3.1; every other dependency comes from the module proxy. About 2 minutes cold.
# The build is reused while the tarball and this recipe are unchanged (a stamp of both).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=v2.11.1
tarball=${WEIR_PEERS_SRC:-$repo/../shared/peers/kube-router-$version.tar.gz}
cache_root=${WEIR_PEERS_CACHE:-${WEIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}/peers}
bin="$cache_root/kube-router-$version/bin"
export PATH="$PATH:/usr/local/go/bin"
# Bumped whenever the build commands below change, so a cached binary of an older recipe is rebuilt.
recipe=1

log() { echo "peers: $*" >&2; }
die() { log "$*"; exit 1; }

# shellcheck source=scripts/lib/build.sh
. "$repo/scripts/lib/build.sh"

# The stamp of the tarball's stamp and the recipe.
stamp() { { stamp_of "$tarball"; echo "recipe $recipe"; } | stamp_of; }

cmd_build() {
  [ -r "$tarball" ] || die "kube-router source not found at $tarball (set WEIR_PEERS_SRC)"
  # Two benchmarks may start at once: one builds, the other waits and reuses it.
  locked_build "$cache_root/kube-router-$version" build_locked
}

build_locked() {
  local want started build_log
  want=$(stamp)
  if [ -x "$bin/kube-router" ] && [ "$(cat "$bin/stamp" 2>/dev/null)" = "$want" ]; then
    echo "$bin"
    return
  fi
  command -v go >/dev/null || die "go not found (expected on PATH or in /usr/local/go/bin)"
  build_log="$cache_root/kube-router-$version/build.log"
  # Global, not local: the EXIT trap runs after this function has returned. The source tree is
  # removed whatever happens; only the binary is kept.
  tmp=$(mktemp -d "$cache_root/kube-router-$version/build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  log "building kube-router $version into $bin (cold: about 2 minutes on 2 cores; log in $build_log)"
  started=$(date +%s)
  if ! (
    tar -xzf "$tarball" -C "$tmp" &&
      cd "$tmp/kube-router-$version" &&
      go mod edit -replace github.com/vishvananda/netlink=github.com/vishvananda/netlink@v1.3.1 &&
      GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$tmp/out/kube-router" ./cmd/kube-router
  ) >"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    die "go build failed after $(($(date +%s) - started))s (full log: $build_log)"
  fi
  echo "$want" >"$tmp/out/stamp"
  rm -rf "$bin"
  mv "$tmp/out" "$bin"
  log "built in $(($(date +%s) - started))s: $(du -h "$bin/kube-router" | cut -f1)"
  echo "$bin"
}

cmd_path() {
  [ -x "$bin/kube-router" ] && [ "$(cat "$bin/stamp" 2>/dev/null)" = "$(stamp)" ] || die "kube-router not built: run $0 build"
  echo "$bin/kube-router"
}

case "${1:-}" in
  build) cmd_build ;;
  path) cmd_path ;;
  *) die "usage: $0 build|path" ;;
esac
