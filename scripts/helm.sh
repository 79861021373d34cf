#!/usr/bin/env bash
# Helm, built from the Go module proxy, for the chart in charts/weir and its tests.
#
#   helm.sh build          build helm once per release (cached); prints the binary's path
#   helm.sh sync           copy crds/ into the chart (charts/weir/crds) and render
#                          deploy/rbac.yaml and deploy/admission-policy.yaml from the chart:
#                          one source each (test/integration/helm.test.ts checks they are in step)
#   helm.sh ARGS...        run the cached helm with ARGS (building it first if needed)
#
# The binary is built from the Go module helm.sh/helm/v3 at the release pinned in
# hack/helm/go.mod (hack/helm/gen-gomod.sh writes it), with the version stamps Helm's own
# Makefile sets, so that `helm template` assumes the Kubernetes release of its client-go
# (not v1.20) when no cluster is asked.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
module_dir="$repo/hack/helm"
cache_root=${WEIR_HELM_CACHE:-${WEIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}/helm}
export PATH="$PATH:/usr/local/go/bin"

log() { echo "helm: $*" >&2; }
die() { log "$*"; exit 1; }

helm_version() {
  local v
  v=$(sed -n 's#^[[:space:]]*helm\.sh/helm/v3 \(v3\.[0-9]*\.[0-9]*\).*#\1#p' "$module_dir/go.mod" | head -n1)
  [ -n "$v" ] || die "no helm.sh/helm/v3 requirement in $module_dir/go.mod"
  echo "$v"
}

# shellcheck source=scripts/lib/build.sh
. "$repo/scripts/lib/build.sh"

cmd_build() {
  local version
  version=$(helm_version)
  locked_build "$cache_root/$version" build_locked "$version"
}

build_locked() {
  local version=$1 bin stamp tmp ldflags started client_go major minor
  bin="$cache_root/$version/bin"
  # A build is reused only if it came from the same go.mod and go.sum.
  stamp=$(stamp_of "$module_dir/go.mod" "$module_dir/go.sum")
  if [ -x "$bin/helm" ] && [ "$(cat "$bin/stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$bin/helm"
    return
  fi
  command -v go >/dev/null || die "go not found (expected on PATH or in /usr/local/go/bin)"
  local build_log="$cache_root/$version/build.log"
  log "building helm $version into $bin (cold: a few minutes on 2 cores; log in $build_log)"
  started=$(date +%s)
  # Helm's Makefile: the default Kubernetes version is client-go's v0.X.Y read as v1.X.
  client_go=$(cd "$module_dir" && go list -m -f '{{.Version}}' k8s.io/client-go 2>>"$build_log") ||
    { tail -n 20 "$build_log" >&2; die "cannot resolve k8s.io/client-go in $module_dir (full log: $build_log)"; }
  [[ $client_go =~ ^v0\.([0-9]+)\. ]] || die "unexpected k8s.io/client-go version $client_go"
  major=1
  minor=${BASH_REMATCH[1]}
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.metadata="
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
  done
  tmp=$(mktemp -d "$cache_root/$version/build.XXXXXX")
  chmod 755 "$tmp"
  if ! (cd "$module_dir" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) >>"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    rm -rf "$tmp"
    die "go build failed after $(($(date +%s) - started))s (full log: $build_log)"
  fi
  echo "$stamp" >"$tmp/stamp"
  rm -rf "$bin"
  mv "$tmp" "$bin"
  log "built in $(($(date +%s) - started))s: $(du -h "$bin/helm" | cut -f1) ($("$bin/helm" version --short))"
  echo "$bin/helm"
}

# The chart's RBAC or admission policies as plain manifests for `kubectl apply`: release
# "weir" in kube-system, default values, Helm's "# Source:" lines dropped. The test that keeps
# deploy/ in step renders through this same command (helm.sh render-deploy TEMPLATE).
cmd_render_deploy() {
  local helm template=${1:?usage: helm.sh render-deploy TEMPLATE}
  helm=$(cmd_build)
  echo "# Generated from charts/weir/templates/$template by scripts/helm.sh sync: edit the chart, then run it."
  "$helm" template weir "$repo/charts/weir" --namespace kube-system --show-only "templates/$template" |
    sed -e '1{/^---$/d}' -e '/^# Source: /d'
}

cmd_sync() {
  local out
  rm -f "$repo"/charts/weir/crds/*.yaml
  cp "$repo"/crds/*.yaml "$repo/charts/weir/crds/"
  log "copied crds/ into charts/weir/crds/"
  for template in rbac.yaml admission-policy.yaml; do
    out="$repo/deploy/$template"
    cmd_render_deploy "$template" >"$out.tmp"
    mv "$out.tmp" "$out"
    log "wrote deploy/$template"
  done
}

case "${1:-}" in
  build) cmd_build ;;
  sync) cmd_sync ;;
  render-deploy) cmd_render_deploy "${2:-}" ;;
  "") die "usage: helm.sh build | sync | render-deploy TEMPLATE | ARGS..." ;;
  *)
    helm=$(cmd_build)
    exec "$helm" "$@"
    ;;
esac
