#!/usr/bin/env bash
# A real Kubernetes control plane (etcd + kube-apiserver, no controllers, no nodes) for the
# integration tests, all on 127.0.0.1.
#
#   control-plane.sh build                    build kubectl, kube-apiserver and kube-proxy once
#                                             per release (cached); prints the directory
#                                             holding them
#   control-plane.sh start DIR                start etcd and kube-apiserver with state in DIR;
#                                             writes DIR/kubeconfig, DIR/token, DIR/pids
#                                             ("name pid starttime" lines), DIR/ports.env
#   control-plane.sh restart-apiserver DIR    stop and start kube-apiserver alone (same port)
#   control-plane.sh stop DIR                 kill exactly the processes listed in DIR/pids
#
# Every command is idempotent. The binaries are built from the Go module k8s.io/kubernetes at
# the release pinned in hack/controlplane/go.mod (kube-proxy, for the Services tests, from
# hack/controlplane/kube-proxy.mod: the same release and pins in a module file of its own, so
# its extra dependencies never change the other two builds); etcd is Debian's etcd-server.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
module_dir="$repo/hack/controlplane"
cache_root=${WEIR_CONTROLPLANE_CACHE:-${WEIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}/controlplane}
export PATH="$PATH:/usr/local/go/bin"

# Fixed, not chosen per run: only addresses inside the API objects, never routed anywhere
# (the Services tests' kube-proxy makes them reachable inside simulated nodes). Dual-stack, so
# that a Service may have an IPv6 ClusterIP too.
service_cidr=10.96.0.0/16,fd00:10:96::/112
first_service_ip=10.96.0.1
ready_timeout_s=${WEIR_CONTROLPLANE_READY_TIMEOUT:-180}

log() { echo "control-plane: $*" >&2; }
die() { log "$*"; exit 1; }

k8s_version() {
  local v file=${1:-go.mod}
  v=$(sed -n 's#^[[:space:]]*k8s\.io/kubernetes \(v1\.[0-9]*\.[0-9]*\).*#\1#p' "$module_dir/$file" | head -n1)
  [ -n "$v" ] || die "no k8s.io/kubernetes requirement in $module_dir/$file"
  echo "$v"
}

bin_dir() { echo "$cache_root/$(k8s_version)/bin"; }

# shellcheck source=scripts/lib/build.sh
. "$repo/scripts/lib/build.sh"

# A build is reused only if it came from the same module files: go.mod and go.sum (module_stamp
# go) for kube-apiserver and kubectl, kube-proxy.mod and kube-proxy.sum for kube-proxy.
module_stamp() { stamp_of "$module_dir/$1.mod" "$module_dir/$1.sum"; }

cmd_build() {
  local version
  version=$(k8s_version)
  locked_build "$cache_root/$version" build_locked "$version"
}

# True when BIN holds the binaries named after the stamp file and module stamp given.
current() {
  local bin=$1 stampfile=$2 stamp=$3
  shift 3
  local b
  for b in "$@"; do [ -x "$bin/$b" ] || return 1; done
  [ "$(cat "$bin/$stampfile" 2>/dev/null)" = "$stamp" ]
}

# One go build of the commands given, into DIR, from the module file given.
go_build() {
  local version=$1 dir=$2 modfile=$3 build_log=$4 started
  shift 4
  local minor=${version#v1.} ldflags="-s -w" pkg modflag=()
  minor=${minor%%.*}
  # The version stamps the release build scripts set; without them /version says v0.0.0-master.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  [ "$modfile" = go.mod ] || modflag=("-modfile=$modfile")
  started=$(date +%s)
  if ! (cd "$module_dir" && CGO_ENABLED=0 go build "${modflag[@]}" -trimpath -ldflags="$ldflags" -o "$dir/" "$@") >>"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    rm -rf "$dir"
    die "go build of $* failed after $(($(date +%s) - started))s (full log: $build_log)"
  fi
  log "built $* in $(($(date +%s) - started))s"
}

build_locked() {
  local version=$1 bin cp_stamp kp_stamp tmp need_cp=1 need_kp=1 b build_log
  bin=$(bin_dir)
  cp_stamp=$(module_stamp go)
  kp_stamp=$(module_stamp kube-proxy)
  [ "$(k8s_version kube-proxy.mod)" = "$version" ] ||
    die "$module_dir/kube-proxy.mod does not pin k8s.io/kubernetes $version like go.mod: run hack/controlplane/gen-gomod.sh $version"
  current "$bin" stamp "$cp_stamp" kube-apiserver kubectl && need_cp=0
  current "$bin" kube-proxy.stamp "$kp_stamp" kube-proxy && need_kp=0
  if [ "$need_cp$need_kp" = 00 ]; then
    echo "$bin"
    return
  fi
  command -v go >/dev/null || die "go not found (expected on PATH or in /usr/local/go/bin)"
  tmp=$(mktemp -d "$cache_root/$version/build.XXXXXX")
  chmod 755 "$tmp"
  # What is still current moves over as hard links: adding kube-proxy to a cache that holds
  # the other two never rebuilds them, and a daemon running an old binary keeps its inode.
  [ "$need_cp" = 1 ] || for b in kube-apiserver kubectl stamp; do ln "$bin/$b" "$tmp/$b"; done
  [ "$need_kp" = 1 ] || for b in kube-proxy kube-proxy.stamp; do ln "$bin/$b" "$tmp/$b"; done
  build_log="$cache_root/$version/build.log"
  : >"$build_log"
  local started=$SECONDS
  if [ "$need_cp" = 1 ]; then
    log "building kube-apiserver and kubectl $version into $bin (cold: about 10 minutes on 2 cores; log in $build_log)"
    go_build "$version" "$tmp" go.mod "$build_log" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
    echo "$cp_stamp" >"$tmp/stamp"
  fi
  if [ "$need_kp" = 1 ]; then
    # After the other two it mostly reuses their compiled packages from Go's build cache.
    log "building kube-proxy $version into $bin (log in $build_log)"
    go_build "$version" "$tmp" kube-proxy.mod "$build_log" k8s.io/kubernetes/cmd/kube-proxy
    echo "$kp_stamp" >"$tmp/kube-proxy.stamp"
  fi
  rm -rf "$bin"
  mv "$tmp" "$bin"
  log "built in $((SECONDS - started))s: $(cd "$bin" && du -h kube-apiserver kubectl kube-proxy | tr '\t\n' '  ')"
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

# Ports are drawn below the kernel's ephemeral range, so that no outgoing connection can take
# one between this check and the daemon's bind; another start may still take it (that start's
# daemon then fails to bind, and the start tries fresh ports).
port_range() {
  local low _
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=0
  if [ "$low" -gt 21000 ]; then echo "20000 $((low - 20000))"; else echo "20000 30000"; fi
}

free_port() {
  local port tries=0 base span
  read -r base span < <(port_range)
  while :; do
    port=$((base + (RANDOM * 32768 + RANDOM) % span))
    port_in_use "$port" || { echo "$port"; return; }
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || die "no free TCP port found"
  done
}

# shellcheck source=scripts/lib/procs.sh
. "$repo/scripts/lib/procs.sh"

pid_of() { awk -v n="$1" '$1 == n { print $2 }' "$2/pids" 2>/dev/null || true; }
start_of() { awk -v n="$1" '$1 == n { print $3 }' "$2/pids" 2>/dev/null || true; }

# True while the daemon NAME recorded in DIR/pids runs.
running() {
  local pid start
  pid=$(pid_of "$1" "$2")
  start=$(start_of "$1" "$2")
  [ -n "$pid" ] && [ -n "$start" ] && alive "$pid" "$start"
}

kill_daemon() {
  local name=$1 dir=$2 pid start i
  pid=$(pid_of "$name" "$dir")
  start=$(start_of "$name" "$dir")
  [ -n "$pid" ] && [ -n "$start" ] && alive "$pid" "$start" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    # A zombie no longer counts as alive; 10 s is plenty for both daemons.
    alive "$pid" "$start" || return 0
    sleep 0.1
  done
  log "$name (pid $pid) did not exit on TERM; killing"
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

# Ports are kept across restarts: etcd remembers its peer URL in its data directory. Before
# etcd has data, DIR/ports.env is only a first choice: a port that turns out taken is replaced.
load_ports() {
  local dir=$1
  if [ -f "$dir/ports.env" ]; then
    # shellcheck disable=SC1091
    . "$dir/ports.env"
    fresh_etcd "$dir" && return 0
    for p in "$etcd_client_port" "$etcd_peer_port" "$apiserver_port"; do
      port_in_use "$p" listen && die "port $p saved in $dir/ports.env is taken; use a fresh DIR"
    done
    return 0
  fi
  new_ports "$dir"
}

fresh_etcd() { [ ! -d "$1/etcd/member" ]; }

new_ports() {
  etcd_client_port=$(free_port)
  etcd_peer_port=$(free_port)
  while [ "$etcd_peer_port" = "$etcd_client_port" ]; do etcd_peer_port=$(free_port); done
  new_apiserver_port "$1"
}

new_apiserver_port() {
  apiserver_port=$(free_port)
  while [ "$apiserver_port" = "$etcd_client_port" ] || [ "$apiserver_port" = "$etcd_peer_port" ]; do apiserver_port=$(free_port); done
  save_ports "$1"
}

save_ports() {
  printf 'etcd_client_port=%s\netcd_peer_port=%s\napiserver_port=%s\n' \
    "$etcd_client_port" "$etcd_peer_port" "$apiserver_port" >"$1/ports.env"
  write_kubeconfig "$1" "https://127.0.0.1:$apiserver_port"
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

# Starts daemon NAME in its own session, so it outlives this script and a test runner's Ctrl-C
# reaches it only through stop, and records it in DIR/pids. The daemon is this script's child,
# so `wait` tells how it exited. Sets spawned_pid, spawned_start, and log_offset (the size of
# its log before this start: what it writes now comes after).
spawn() {
  local name=$1 dir=$2
  shift 2
  log_offset=$(stat -c %s "$dir/$name.log" 2>/dev/null || echo 0)
  setsid "$@" </dev/null >>"$dir/$name.log" 2>&1 &
  spawned_pid=$!
  # The fork is the daemon-to-be: same PID, same start time across its execs. If it has
  # already exited, no start time matches and alive says so.
  spawned_start=$(proc_start "$spawned_pid") || spawned_start=exited
  sed -i "/^$name /d" "$dir/pids"
  echo "$name $spawned_pid $spawned_start" >>"$dir/pids"
}

# What daemon NAME wrote to its log since it was spawned.
new_log() { tail -c "+$((log_offset + 1))" "$2/$1.log" 2>/dev/null || true; }

# The daemon exited before it was ready: says how, with the last lines it logged.
report_exit() {
  local name=$1 dir=$2 pid=$3 lines=$4 status=0 text
  wait "$pid" 2>/dev/null || status=$?
  text=$(new_log "$name" "$dir" | tail -n "$lines")
  if [ -n "$text" ]; then
    log "$name's last log lines ($dir/$name.log):"
    printf '%s\n' "$text" | sed 's/^/  | /' >&2
  else
    log "$name logged nothing ($dir/$name.log is empty)"
  fi
  exit_status=$status
}

# The line where daemon NAME says it could not bind one of its ports, if that is why it exited.
bind_failure() { new_log "$1" "$2" | grep -m1 'bind: address already in use' || true; }

# etcd's /health over bash's /dev/tcp: no curl needed.
etcd_healthy() {
  local reply
  reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "GET /health HTTP/1.0\r\n\r\n" >&3 && cat <&3' _ "$1" 2>/dev/null) || return 1
  [[ $reply == *'"health":"true"'* ]]
}

# Returns 0 once etcd is healthy, 1 if it exited (see report_exit); dies on the timeout.
wait_etcd() {
  local dir=$1 deadline=$((SECONDS + ready_timeout_s))
  until etcd_healthy "$etcd_client_port"; do
    running etcd "$dir" || return 1
    [ "$SECONDS" -lt "$deadline" ] || { new_log etcd "$dir" | tail -n 20 >&2; die "etcd not healthy after ${ready_timeout_s}s"; }
    sleep 0.1
  done
}

# Returns 0 once /readyz is ok, 1 if kube-apiserver exited; dies on the timeout.
wait_ready() {
  local dir=$1 bin out deadline=$((SECONDS + ready_timeout_s))
  bin=$(bin_dir)
  until out=$("$bin/kubectl" --kubeconfig "$dir/kubeconfig" --request-timeout=5s get --raw /readyz 2>/dev/null) && [ "$out" = ok ]; do
    running kube-apiserver "$dir" || return 1
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "$dir/kube-apiserver.log" >&2; die "/readyz not ok after ${ready_timeout_s}s"; }
    sleep 0.2
  done
}

start_etcd() {
  local dir=$1
  spawn etcd "$dir" "$etcd_bin" \
    --name=weir-test \
    --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_client_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_client_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="weir-test=http://127.0.0.1:$etcd_peer_port" \
    --logger=zap
  wait_etcd "$dir"
}

# Starts kube-apiserver; returns 1 if it exited before /readyz was ok.
start_apiserver() {
  local dir=$1 bin
  bin=$(bin_dir)
  # ServiceAccount admission is off: with no controller manager no namespace gets its
  # `default` ServiceAccount, and that admission plugin would reject every pod without one.
  spawn kube-apiserver "$dir" "$bin/kube-apiserver" \
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
    --profiling=false
  wait_ready "$dir"
}

# Tries a fresh start this many times when a port turns out to be taken at bind time.
port_attempts=3

cmd_start() {
  local dir=$1 started=$SECONDS attempt fresh failure
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cmd_build >/dev/null
  if [ -f "$dir/pids" ]; then
    if running etcd "$dir" && running kube-apiserver "$dir"; then
      # shellcheck disable=SC1091
      . "$dir/ports.env"
      wait_ready "$dir" || die "kube-apiserver exited"
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
  fresh=0
  fresh_etcd "$dir" && fresh=1
  load_ports "$dir"
  save_ports "$dir"
  : >"$dir/pids"

  for attempt in $(seq 1 "$port_attempts"); do
    start_etcd "$dir" && break
    report_exit etcd "$dir" "$spawned_pid" 20
    failure=$(bind_failure etcd "$dir")
    if [ "$fresh" = 1 ] && [ -n "$failure" ] && [ "$attempt" -lt "$port_attempts" ]; then
      log "etcd could not bind a port, retrying with fresh ports: $failure"
      rm -rf "$dir/etcd"
      new_ports "$dir"
      continue
    fi
    die "etcd exited with status $exit_status before it was healthy"
  done

  for attempt in $(seq 1 "$port_attempts"); do
    start_apiserver "$dir" && break
    report_exit kube-apiserver "$dir" "$spawned_pid" 30
    failure=$(bind_failure kube-apiserver "$dir")
    if [ "$fresh" = 1 ] && [ -n "$failure" ] && [ "$attempt" -lt "$port_attempts" ]; then
      log "kube-apiserver could not bind its port, retrying with a fresh one: $failure"
      new_apiserver_port "$dir"
      continue
    fi
    die "kube-apiserver exited with status $exit_status before /readyz was ok"
  done
  trap - EXIT
  log "ready in $((SECONDS - started))s: https://127.0.0.1:$apiserver_port (kubeconfig $dir/kubeconfig, pids $(tr '\n' ' ' <"$dir/pids"))"
}

cmd_restart_apiserver() {
  local dir=$1
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/ports.env" ] || die "$dir has no control plane (no ports.env)"
  # shellcheck disable=SC1091
  . "$dir/ports.env"
  kill_daemon kube-apiserver "$dir"
  # The same port: clients of this control plane keep their address.
  if ! start_apiserver "$dir"; then
    report_exit kube-apiserver "$dir" "$spawned_pid" 30
    die "kube-apiserver exited with status $exit_status before /readyz was ok"
  fi
  log "kube-apiserver restarted: pid $(pid_of kube-apiserver "$dir")"
}

cmd_stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/pids" ] || return 0
  # The API server first, so it never sees its etcd vanish.
  kill_daemon kube-apiserver "$dir"
  kill_daemon etcd "$dir"
  rm -f "$dir/pids"
}

case "${1:-}" in
  build) cmd_build ;;
  start) cmd_start "${2:?usage: control-plane.sh start DIR}" ;;
  restart-apiserver) cmd_restart_apiserver "${2:?usage: control-plane.sh restart-apiserver DIR}" ;;
  stop) cmd_stop "${2:?usage: control-plane.sh stop DIR}" ;;
  *) die "usage: control-plane.sh build | start DIR | restart-apiserver DIR | stop DIR" ;;
esac
