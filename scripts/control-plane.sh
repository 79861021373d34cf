#!/usr/bin/env bash
# A real Kubernetes control plane (etcd + kube-apiserver, no controllers, no nodes) for the
# integration tests, all on 127.0.0.1.
#
#   control-plane.sh build                    build kubectl and kube-apiserver once per release
#                                             (cached); prints the directory holding them
#   control-plane.sh start DIR                start etcd and kube-apiserver with state in DIR;
#                                             writes DIR/kubeconfig, DIR/token, DIR/pids
#   control-plane.sh restart-apiserver DIR    stop and start kube-apiserver alone (same port)
#   control-plane.sh stop DIR                 kill exactly the processes listed in DIR/pids
#
# Every command is idempotent. The binaries are built from the Go module k8s.io/kubernetes at
# the release pinned in hack/controlplane/go.mod; etcd is Debian's etcd-server package.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
module_dir="$repo/hack/controlplane"
cache_root=${WEIR_CONTROLPLANE_CACHE:-$repo/.cache/controlplane}
export PATH="$PATH:/usr/local/go/bin"

# Fixed, not chosen per run: only addresses inside the API objects, never routed anywhere.
service_cidr=10.96.0.0/16
first_service_ip=10.96.0.1
ready_timeout_s=${WEIR_CONTROLPLANE_READY_TIMEOUT:-180}

log() { echo "control-plane: $*" >&2; }
die() { log "$*"; exit 1; }

k8s_version() {
  local v
  v=$(sed -n 's#^[[:space:]]*k8s\.io/kubernetes \(v1\.[0-9]*\.[0-9]*\).*#\1#p' "$module_dir/go.mod" | head -n1)
  [ -n "$v" ] || die "no k8s.io/kubernetes requirement in $module_dir/go.mod"
  echo "$v"
}

bin_dir() { echo "$cache_root/$(k8s_version)/bin"; }

# A build is reused only if it came from the same go.mod and go.sum.
module_stamp() { cat "$module_dir/go.mod" "$module_dir/go.sum" | sha256sum | cut -d' ' -f1; }

cmd_build() {
  local version
  version=$(k8s_version)
  mkdir -p "$cache_root/$version"
  # Test files may start in parallel: one builds, the others wait and then reuse it. The lock
  # lives in a subshell so that no daemon started later inherits it.
  (
    flock 9
    build_locked "$version"
  ) 9>"$cache_root/$version/build.lock"
}

build_locked() {
  local version=$1 bin stamp tmp ldflags started
  bin=$(bin_dir)
  stamp=$(module_stamp)
  if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kubectl" ] && [ "$(cat "$bin/stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$bin"
    return
  fi
  command -v go >/dev/null || die "go not found (expected on PATH or in /usr/local/go/bin)"
  tmp=$(mktemp -d "$cache_root/$version/build.XXXXXX")
  chmod 755 "$tmp"
  # The version stamps the release build scripts set; without them /version says v0.0.0-master.
  local minor=${version#v1.}
  minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  local build_log="$cache_root/$version/build.log"
  log "building kube-apiserver and kubectl $version into $bin (cold: about 10 minutes on 2 cores; log in $build_log)"
  started=$(date +%s)
  if ! (cd "$module_dir" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl) >"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    rm -rf "$tmp"
    die "go build failed after $(($(date +%s) - started))s (full log: $build_log)"
  fi
  echo "$stamp" >"$tmp/stamp"
  rm -rf "$bin"
  mv "$tmp" "$bin"
  log "built in $(($(date +%s) - started))s: $(cd "$bin" && du -h kube-apiserver kubectl | tr '\t\n' '  ')"
  echo "$bin"
}

ensure_etcd() {
  if [ -n "${WEIR_ETCD:-}" ]; then echo "$WEIR_ETCD"; return; fi
  if ! command -v etcd >/dev/null; then
    [ "$(id -u)" -eq 0 ] || die "etcd missing; run as root to install Debian's etcd-server"
    log "installing Debian's etcd-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null 2>&1 || {
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
    }
  fi
  command -v etcd
}

ensure_openssl() {
  command -v openssl >/dev/null && return
  [ "$(id -u)" -eq 0 ] || die "openssl missing; run as root to install it"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
}

# True if some socket uses local TCP port $1 (read from /proc: no ss or netstat needed); with
# "listen", only a listening socket counts (the daemons bind over TIME_WAIT leftovers).
port_in_use() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" -v listen_only="${2:-}" '
    NR > 1 && substr($2, length($2) - 4) == p && (listen_only == "" || $4 == "0A") { found = 1 }
    END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

free_port() {
  local port tries=0
  while :; do
    port=$((20000 + RANDOM % 30000))
    port_in_use "$port" || { echo "$port"; return; }
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || die "no free TCP port found"
  done
}

# Processes of this control plane are told apart from a reused PID by their command line,
# which always names DIR.
owned_pid() {
  local pid=$1 dir=$2
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/"
}

pid_of() { awk -v n="$1" '$1 == n { print $2 }' "$2/pids" 2>/dev/null || true; }

kill_owned() {
  local pid=$1 dir=$2 i
  owned_pid "$pid" "$dir" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    owned_pid "$pid" "$dir" || return 0
    # A zombie has an empty cmdline and so no longer counts as owned; 10 s is plenty for both.
    sleep 0.1
  done
  log "pid $pid did not exit on TERM; killing"
  kill -KILL "$pid" 2>/dev/null || true
}

make_pki() {
  local pki=$1/pki
  [ -f "$pki/apiserver.crt" ] && [ -f "$pki/sa.key" ] && return
  ensure_openssl
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=weir-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:%s,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' \
    "$first_service_ip" >"$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
  chmod 600 "$pki"/*.key
}

make_token() {
  local dir=$1
  [ -s "$dir/token" ] && [ -s "$dir/tokens.csv" ] && return
  ensure_openssl
  openssl rand -hex 32 >"$dir/token"
  chmod 600 "$dir/token"
  # token,user,uid,"groups": system:masters is bound to cluster-admin by the default RBAC roles.
  printf '%s,weir-admin,weir-admin,"system:masters"\n' "$(cat "$dir/token")" >"$dir/tokens.csv"
}

# Ports are kept across restarts: etcd remembers its peer URL in its data directory.
load_ports() {
  local dir=$1
  if [ -f "$dir/ports.env" ]; then
    # shellcheck disable=SC1091
    . "$dir/ports.env"
    for p in "$etcd_client_port" "$etcd_peer_port" "$apiserver_port"; do
      port_in_use "$p" listen && die "port $p saved in $dir/ports.env is taken; use a fresh DIR"
    done
    return 0
  fi
  etcd_client_port=$(free_port)
  etcd_peer_port=$(free_port)
  apiserver_port=$(free_port)
  while [ "$etcd_peer_port" = "$etcd_client_port" ]; do etcd_peer_port=$(free_port); done
  while [ "$apiserver_port" = "$etcd_client_port" ] || [ "$apiserver_port" = "$etcd_peer_port" ]; do apiserver_port=$(free_port); done
  printf 'etcd_client_port=%s\netcd_peer_port=%s\napiserver_port=%s\n' \
    "$etcd_client_port" "$etcd_peer_port" "$apiserver_port" >"$dir/ports.env"
}

write_kubeconfig() {
  local dir=$1 server=$2
  cat >"$dir/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: weir-test
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$dir/pki/ca.crt")
users:
- name: weir-admin
  user:
    token: $(cat "$dir/token")
contexts:
- name: weir-test
  context:
    cluster: weir-test
    user: weir-admin
current-context: weir-test
EOF
  chmod 600 "$dir/kubeconfig.tmp"
  mv "$dir/kubeconfig.tmp" "$dir/kubeconfig"
}

# Starts a daemon in its own session, so it outlives this script and a test runner's Ctrl-C
# reaches it only through stop.
spawn() {
  local logfile=$1
  shift
  setsid "$@" </dev/null >>"$logfile" 2>&1 &
  echo $!
}

# etcd's /health over bash's /dev/tcp: no curl needed.
etcd_healthy() {
  local reply
  reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "GET /health HTTP/1.0\r\n\r\n" >&3 && cat <&3' _ "$1" 2>/dev/null) || return 1
  [[ $reply == *'"health":"true"'* ]]
}

wait_etcd() {
  local dir=$1 pid=$2 deadline=$((SECONDS + ready_timeout_s))
  until etcd_healthy "$etcd_client_port"; do
    owned_pid "$pid" "$dir" || { tail -n 20 "$dir/etcd.log" >&2; die "etcd exited before it was healthy"; }
    [ "$SECONDS" -lt "$deadline" ] || die "etcd not healthy after ${ready_timeout_s}s"
    sleep 0.1
  done
}

wait_ready() {
  local dir=$1 pid=$2 bin out deadline=$((SECONDS + ready_timeout_s))
  bin=$(bin_dir)
  until out=$("$bin/kubectl" --kubeconfig "$dir/kubeconfig" --request-timeout=5s get --raw /readyz 2>/dev/null) && [ "$out" = ok ]; do
    owned_pid "$pid" "$dir" || { tail -n 30 "$dir/kube-apiserver.log" >&2; die "kube-apiserver exited before /readyz was ok"; }
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "$dir/kube-apiserver.log" >&2; die "/readyz not ok after ${ready_timeout_s}s"; }
    sleep 0.2
  done
}

start_apiserver() {
  local dir=$1 bin pid
  bin=$(bin_dir)
  # ServiceAccount admission is off: with no controller manager no namespace gets its
  # `default` ServiceAccount, and that admission plugin would reject every pod without one.
  pid=$(spawn "$dir/kube-apiserver.log" "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_client_port" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="$apiserver_port" \
    --cert-dir="$dir/pki" \
    --tls-cert-file="$dir/pki/apiserver.crt" \
    --tls-private-key-file="$dir/pki/apiserver.key" \
    --client-ca-file="$dir/pki/ca.crt" \
    --token-auth-file="$dir/tokens.csv" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer="https://127.0.0.1:$apiserver_port" \
    --service-account-key-file="$dir/pki/sa.pub" \
    --service-account-signing-key-file="$dir/pki/sa.key" \
    --service-cluster-ip-range="$service_cidr" \
    --disable-admission-plugins=ServiceAccount \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --profiling=false)
  sed -i '/^kube-apiserver /d' "$dir/pids"
  echo "kube-apiserver $pid" >>"$dir/pids"
  wait_ready "$dir" "$pid"
}

cmd_start() {
  local dir=$1 started=$SECONDS etcd_bin pid all_up=1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cmd_build >/dev/null
  if [ -f "$dir/pids" ]; then
    for name in etcd kube-apiserver; do
      pid=$(pid_of "$name" "$dir")
      [ -n "$pid" ] && owned_pid "$pid" "$dir" || all_up=0
    done
    if [ "$all_up" = 1 ]; then
      # shellcheck disable=SC1091
      . "$dir/ports.env"
      wait_ready "$dir" "$(pid_of kube-apiserver "$dir")"
      log "already running: https://127.0.0.1:$apiserver_port"
      return
    fi
    cmd_stop "$dir"
  fi
  etcd_bin=$(ensure_etcd)
  # A start that fails half-way leaves nothing running.
  trap 'status=$?; [ "$status" -eq 0 ] || cmd_stop "'"$dir"'"' EXIT
  make_pki "$dir"
  make_token "$dir"
  load_ports "$dir"
  write_kubeconfig "$dir" "https://127.0.0.1:$apiserver_port"
  : >"$dir/pids"

  pid=$(spawn "$dir/etcd.log" "$etcd_bin" \
    --name=weir-test \
    --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_client_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_client_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="weir-test=http://127.0.0.1:$etcd_peer_port" \
    --logger=zap)
  echo "etcd $pid" >>"$dir/pids"
  wait_etcd "$dir" "$pid"

  start_apiserver "$dir"
  trap - EXIT
  log "ready in $((SECONDS - started))s: https://127.0.0.1:$apiserver_port (kubeconfig $dir/kubeconfig, pids $(tr '\n' ' ' <"$dir/pids"))"
}

cmd_restart_apiserver() {
  local dir=$1 pid
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/ports.env" ] || die "$dir has no control plane (no ports.env)"
  # shellcheck disable=SC1091
  . "$dir/ports.env"
  pid=$(pid_of kube-apiserver "$dir")
  [ -n "$pid" ] && kill_owned "$pid" "$dir"
  start_apiserver "$dir"
  log "kube-apiserver restarted: pid $(pid_of kube-apiserver "$dir")"
}

cmd_stop() {
  local dir=$1 pid
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/pids" ] || return 0
  # The API server first, so it never sees its etcd vanish.
  for name in kube-apiserver etcd; do
    pid=$(pid_of "$name" "$dir")
    [ -n "$pid" ] && kill_owned "$pid" "$dir"
  done
  rm -f "$dir/pids"
}

case "${1:-}" in
  build) cmd_build ;;
  start) cmd_start "${2:?usage: control-plane.sh start DIR}" ;;
  restart-apiserver) cmd_restart_apiserver "${2:?usage: control-plane.sh restart-apiserver DIR}" ;;
  stop) cmd_stop "${2:?usage: control-plane.sh stop DIR}" ;;
  *) die "usage: control-plane.sh build | start DIR | restart-apiserver DIR | stop DIR" ;;
esac
