#!/usr/bin/env bash
# A real two-node Kubernetes cluster on this machine, without Docker: the pods are made by a
# real kubelet through containerd and runc, networked by Flannel (VXLAN) and served by
# kube-proxy, so that Weir can be installed by its chart and proven by the upstream e2e suite.
#
#   cluster.sh build     build (cached) every binary and image the cluster needs; prints nothing
#   cluster.sh up        bring the cluster up; the last line printed is an admin kubeconfig's
#                        path, once every node is Ready
#   cluster.sh down      remove every process, network namespace, mount and cgroup up made
#                        (also after a failed up); the daemons' logs stay in $state.logs
#   cluster.sh purge     down, and remove those logs
#   cluster.sh status    say what runs
#   cluster.sh load-image ARCHIVE NAME   import an OCI archive as NAME into every node
#   cluster.sh node-exec NODE CMD...     run CMD inside NODE (its network, mount and PID
#                                        namespaces): what a shell on that node would run
#   cluster.sh e2e-binary                the path of the upstream e2e NetworkPolicy specs' binary
#   cluster.sh npapi-binary              the path of the upstream ClusterNetworkPolicy
#                                        conformance tests' binary (sigs.k8s.io/network-policy-api)
#   cluster.sh restart NODE DAEMON       kill DAEMON (flanneld or kube-proxy) on NODE and
#                                        start it again
#
# Layout (docs/real-cluster.md): the control plane (etcd, kube-apiserver, controller-manager,
# scheduler) lives in the network namespace weirc-cp, on 172.30.0.1 of the bridge weirc-ul;
# node N lives in network, mount and PID namespaces of its own (netns weirc-node-N, address
# 172.30.0.1N) with its containerd, kubelet, flanneld and kube-proxy. Nothing is added to the
# machine's own network namespace but one loopback listener (socat) that forwards the admin
# kubeconfig's 127.0.0.1:PORT to the API server through a UNIX socket. WEIR_CLUSTER_NAME
# (default weirc) names the namespaces, cgroups and state directory, so that clusters of
# other names can run beside it.
set -Eeuo pipefail
# A failing command names itself: up must say why it stopped.
trap 'log "failed (line $LINENO): $BASH_COMMAND"' ERR

repo=$(cd "$(dirname "$0")/.." && pwd)
cache_base=${WEIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}
cache_root=${WEIR_CLUSTER_CACHE:-$cache_base/cluster}
# Several clusters may run side by side, each under its own name (netns, cgroups, state).
cluster=${WEIR_CLUSTER_NAME:-weirc}
[[ $cluster =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "cluster: WEIR_CLUSTER_NAME must be 1-8 lower-case letters and digits" >&2; exit 1; }
state=${WEIR_CLUSTER_DIR:-/var/tmp/weir-cluster-$cluster}
nodes=${WEIR_CLUSTER_NODES:-2}
proxy_mode=${WEIR_CLUSTER_PROXY_MODE:-iptables}
ready_timeout_s=${WEIR_CLUSTER_READY_TIMEOUT:-240}
export PATH="$PATH:/usr/local/go/bin"

cp_ns=$cluster-cp
bridge=$cluster-ul
cp_ip=172.30.0.1
pod_cidr=10.244.0.0/16
service_cidr=10.96.0.0/16
first_service_ip=10.96.0.1
pause_image=registry.k8s.io/pause:3.10.1
agnhost_image=registry.k8s.io/e2e-test-images/agnhost:2.59
# The tag the network-policy-api conformance manifests name: the same image, as every command
# they run (connect, serve-hostname, netexec, porter, pause) is in 2.59 with the same flags.
agnhost_npapi_image=registry.k8s.io/e2e-test-images/agnhost:2.45

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

weir_image() { echo "weir:$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/weir/Chart.yaml")"; }
node_name() { echo "node-$1"; }
node_ns() { echo "$cluster-node-$1"; }
node_ip() { echo "172.30.0.1$1"; }
node_dir() { echo "$state/node-$1"; }

k8s_version() { sed -n 's#^[[:space:]]*\(require \)\{0,1\}k8s\.io/kubernetes \(v1\.[0-9]*\.[0-9]*\).*#\2#p' "$repo/hack/controlplane/cluster.mod" | head -n1; }
bin() { echo "$cache_root/$(k8s_version)/bin"; }
# kube-apiserver, kubectl and kube-proxy come from scripts/control-plane.sh; asked once per run.
cp_bin() {
  [ -n "${cp_bin_dir:-}" ] || cp_bin_dir=$("$repo/scripts/control-plane.sh" build)
  echo "$cp_bin_dir"
}

# --- builds ---------------------------------------------------------------------------------

# shellcheck source=scripts/lib/build.sh
. "$repo/scripts/lib/build.sh"

# go_build WHAT MODULE_DIR MODFILE LOG GO_ARGS...: `go GO_ARGS` in MODULE_DIR with MODFILE, the
# release's version stamps and no cgo unless cgo=1; WHAT names it in the progress lines.
go_build() {
  local what=$1 mod_dir=$2 modfile=$3 build_log=$4 version minor ldflags="-s -w" pkg started
  shift 4
  version=$(k8s_version)
  minor=${version#v1.}
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  started=$SECONDS
  if ! (cd "$mod_dir" && CGO_ENABLED=${cgo:-0} go "$1" -modfile="$modfile" -trimpath -ldflags="$ldflags" "${@:2}") >>"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    die "go $* failed after $((SECONDS - started))s (log: $build_log)"
  fi
  log "built $what in $((SECONDS - started))s"
}

# fresh NAME STAMP FILE...: true when every FILE is built and NAME's stamp equals STAMP.
fresh() {
  local name=$1 stamp=$2 f
  shift 2
  for f in "$@"; do [ -e "$(bin)/$f" ] || return 1; done
  [ "$(cat "$(bin)/$name.stamp" 2>/dev/null)" = "$stamp" ]
}

build_go_tools() {
  local b build_log=$cache_root/build.log stamp
  b=$(bin)
  local cp="$repo/hack/controlplane" e2e="$repo/hack/e2e" fl="$repo/hack/flannel" np="$repo/hack/npapi"
  stamp=$(stamp_of "$cp/cluster.mod" "$cp/cluster.sum")
  if ! fresh cluster "$stamp" kubelet kube-controller-manager kube-scheduler agnhost; then
    log "building kubelet, kube-controller-manager, kube-scheduler and agnhost $(k8s_version) (log $build_log)"
    go_build "kubelet, kube-controller-manager, kube-scheduler and agnhost" "$cp" cluster.mod "$build_log" build -o "$b/" k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/test/images/agnhost
    echo "$stamp" >"$b/cluster.stamp"
  fi
  stamp=$(stamp_of "$e2e/go.mod" "$e2e/go.sum" "$e2e"/*.go)
  if ! fresh e2e "$stamp" e2e-netpol.test; then
    go_build "the upstream e2e NetworkPolicy specs" "$e2e" go.mod "$build_log" test -c -o "$b/e2e-netpol.test" .
    echo "$stamp" >"$b/e2e.stamp"
  fi
  stamp=$(stamp_of "$0" "$np/go.mod" "$np/go.sum" "$np"/*.go "$np"/overlay/*.go)
  if ! fresh npapi "$stamp" npapi-conformance.test; then
    npapi_module "$np" "$b/npapi-module"
    go_build "the upstream ClusterNetworkPolicy conformance tests" "$np" "$b/npapi-module/go.mod" "$build_log" test -c -o "$b/npapi-conformance.test" .
    echo "$stamp" >"$b/npapi.stamp"
  fi
  stamp=$(stamp_of "$fl/go.mod" "$fl/go.sum" "$fl/cni.mod" "$fl/cni.sum")
  if ! fresh flannel "$stamp" flanneld flannel; then
    # flanneld's udp backend is cgo, as in Flannel's own builds.
    cgo=1 go_build flanneld "$fl" go.mod "$build_log" build -o "$b/flanneld" github.com/flannel-io/flannel
    go_build "Flannel's CNI plugin" "$fl" cni.mod "$build_log" build -o "$b/flannel" github.com/containernetworking/plugins/plugins/meta/flannel
    echo "$stamp" >"$b/flannel.stamp"
  fi
}

# npapi_module NPAPI_DIR OUT_DIR: OUT_DIR/go.mod, hack/npapi's go.mod with the suite's module
# replaced by a copy in OUT_DIR (the Go module cache cannot be overlaid) that differs from it in
# one way: hack/npapi/overlay/sctp_probes.go is added to its kubernetes package, and PokeServer
# asks it first whether to leave an SCTP probe out (only under --sctp=false).
npapi_module() {
  local np=$1 out=$2 dir pkg
  dir=$(cd "$np" && go mod download -json sigs.k8s.io/network-policy-api | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -f "$dir/conformance/utils/kubernetes/helper.go" ] || die "no sigs.k8s.io/network-policy-api in $np/go.mod's module cache ($dir)"
  rm -rf "$out"
  mkdir -p "$out"
  cp -r "$dir" "$out/network-policy-api"
  chmod -R u+w "$out/network-policy-api"
  pkg=$out/network-policy-api/conformance/utils/kubernetes
  sed -i '/^func PokeServer(t \*testing.T, .*protocol, targetHost string, targetPort int32, .*shouldConnect bool) {$/a\
\tif sctpProbeLeftOut(t, protocol, targetHost, targetPort, shouldConnect) {\
\t\treturn\
\t}' "$pkg/helper.go"
  [ "$(grep -c sctpProbeLeftOut "$pkg/helper.go")" = 1 ] || die "PokeServer in $dir is not what hack/npapi/overlay expects"
  cp "$np/overlay/sctp_probes.go" "$pkg/"
  cp "$np/go.mod" "$np/go.sum" "$out/"
  echo "replace sigs.k8s.io/network-policy-api => $out/network-policy-api" >>"$out/go.mod"
}

# oci_image ROOTFS_DIR NAME ENTRYPOINT...: a one-layer image as a docker archive named NAME
# (what `ctr images import` reads with its name), in $(bin)/images; its default arguments are
# the words of $cmd, if set.
oci_image() {
  local rootfs=$1 name=$2 work out
  shift 2
  out="$(bin)/images/$(echo "$name" | tr '/:' '__').tar"
  work=$(mktemp -d "$cache_root/image.XXXXXX")
  tar --create --file "$work/layer.tar" --directory "$rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 .
  umoci init --layout "$work/oci" >/dev/null
  umoci new --image "$work/oci:img" >/dev/null
  umoci raw add-layer --image "$work/oci:img" "$work/layer.tar" >/dev/null
  local args=(--image "$work/oci:img" --os linux --architecture "$(dpkg --print-architecture)" --clear config.entrypoint)
  local s
  for s in "$@"; do args+=(--config.entrypoint "$s"); done
  for s in ${cmd:-}; do args+=(--config.cmd "$s"); done
  umoci config "${args[@]}" >/dev/null
  mkdir -p "$(bin)/images"
  rm -f "$out"
  skopeo copy --quiet "oci:$work/oci:img" "docker-archive:$out:$name" >/dev/null
  rm -rf "$work"
}

build_images() {
  local b stamp root
  b=$(bin)
  stamp=$(stamp_of "$0" "$b/agnhost")
  fresh images "$stamp" images && return
  log "building the pause and agnhost images"
  root=$(mktemp -d "$cache_root/rootfs.XXXXXX")
  mkdir -p "$root/pause"
  # The pod sandbox's one process: sleeps until a signal ends it, and reaps nothing (it has
  # no children).
  printf '%s\n' '#include <signal.h>' '#include <unistd.h>' 'static void done(int s) { (void)s; _exit(0); }' \
    'int main(void) { signal(SIGINT, done); signal(SIGTERM, done); for (;;) pause(); }' >"$root/pause.c"
  gcc -static -O2 -o "$root/pause/pause" "$root/pause.c" || die "gcc -static failed (is libc6-dev installed?)"
  oci_image "$root/pause" "$pause_image" /pause
  # As upstream's agnhost image: a shell (the conformance manifests run `/bin/bash -c`), and
  # `pause` when a container gives no command (their client containers).
  mkdir -p "$root/agnhost/tmp" "$root/agnhost/bin"
  cp "$b/agnhost" "$root/agnhost/agnhost"
  cp /bin/bash-static "$root/agnhost/bin/bash"
  ln -s bash "$root/agnhost/bin/sh"
  cmd=pause oci_image "$root/agnhost" "$agnhost_image" /agnhost
  cmd=pause oci_image "$root/agnhost" "$agnhost_npapi_image" /agnhost
  rm -rf "$root"
  echo "$stamp" >"$b/images.stamp"
}

ensure_packages() {
  local missing=() tool
  for tool in containerd runc socat tini gcc umoci skopeo nsenter unshare etcd openssl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  [ -x /bin/bash-static ] || missing+=(bash-static)
  [ "${#missing[@]}" -eq 0 ] && return
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: run as root to install them"
  log "installing Debian packages for ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins socat tini gcc libc6-dev \
    umoci skopeo util-linux etcd-server openssl bash-static >/dev/null
}

cmd_build() {
  ensure_packages
  mkdir -p "$(bin)"
  locked_build "$cache_root" build_all
  cp_bin_dir=$("$repo/scripts/control-plane.sh" build)
}

build_all() {
  "$repo/scripts/control-plane.sh" build >/dev/null
  build_go_tools
  build_images
  "$repo/scripts/helm.sh" build >/dev/null
  "$repo/scripts/image.sh" build >/dev/null
}

# --- processes ----------------------------------------------------------------------------

# Each daemon is recorded as "name pid starttime" in $state/pids.
# shellcheck source=scripts/lib/procs.sh
. "$repo/scripts/lib/procs.sh"
record() { sed -i "/^$1 /d" "$state/pids" 2>/dev/null || true; echo "$1 $2 $(proc_start "$2" || echo gone)" >>"$state/pids"; }
pid_of() { awk -v n="$1" '$1 == n { print $2 }' "$state/pids" 2>/dev/null || true; }
running() {
  local pid start
  read -r pid start < <(awk -v n="$1" '$1 == n { print $2, $3 }' "$state/pids" 2>/dev/null) || return 1
  [ -n "$pid" ] && alive "$pid" "$start"
}

# stop NAME: TERM, then KILL after 10 s, the process recorded as NAME.
stop() {
  local pid start i
  read -r pid start < <(awk -v n="$1" '$1 == n { print $2, $3 }' "$state/pids" 2>/dev/null) || return 0
  alive "$pid" "$start" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do alive "$pid" "$start" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# spawn NAME NETNS CMD...: CMD in the control plane's network namespace, in a session of its own.
spawn_cp() {
  local name=$1
  shift
  setsid ip netns exec "$cp_ns" "$@" </dev/null >>"$state/logs/$name.log" 2>&1 &
  record "$name" $!
}

# The PID (in the machine's PID namespace) of node I's init, which holds its namespaces.
holder() { pid_of "holder-$1"; }

# spawn_node I NAME CMD...: CMD inside node I (network, mount and PID namespaces). nsenter
# forks into the PID namespace; the daemon is its child, recorded as NAME.
spawn_node() {
  local i=$1 name=$2 h n comm child="" log
  shift 2
  h=$(holder "$i")
  log="$state/logs/$name-$(node_name "$i").log"
  setsid nsenter -t "$h" -m -n -p --wd=/ -- "$@" </dev/null >>"$log" 2>&1 &
  n=$!
  # The daemon is nsenter's child. Until the forked shell has exec'd nsenter it may have a
  # short-lived child of its own (a command substitution in this redirection did): recording
  # that one made restart call the daemon "not running", about once in 40 spawns when busy.
  for _ in $(seq 1 500); do
    if read -r comm 2>/dev/null <"/proc/$n/comm" && [ "$comm" = nsenter ]; then
      child=$(awk '{print $1}' "/proc/$n/task/$n/children" 2>/dev/null || true)
      [ -n "$child" ] && break
    fi
    sleep 0.02
  done
  # Recording nsenter instead would leave the daemon running after a stop.
  [ -n "$child" ] || die "$name on $(node_name "$i") did not start (log $log)"
  record "$name-$(node_name "$i")" "$child"
}

in_node() {
  local i=$1
  shift
  nsenter -t "$(holder "$i")" -m -n -p --wd=/ -- "$@"
}

# wait_for WHAT COMMAND...: until COMMAND succeeds, at most ready_timeout_s.
wait_for() {
  local what=$1 deadline=$((SECONDS + ready_timeout_s))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${ready_timeout_s}s waiting for $what"
    sleep 0.5
  done
}

# --- certificates and kubeconfigs ---------------------------------------------------------

pki=""
cert() { # cert NAME SUBJECT [EXT]: a key and a certificate signed by the cluster's CA
  local name=$1 subj=$2 ext=${3:-"extendedKeyUsage=clientAuth"}
  [ -f "$pki/$name.crt" ] && return
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
    -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

make_pki() {
  pki=$state/pki
  mkdir -p "$pki"
  [ -f "$pki/ca.crt" ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=weir-cluster-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,IP:$cp_ip,IP:$first_service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
  cert apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert admin "/O=system:masters/CN=weir-cluster-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kube-proxy "/CN=system:kube-proxy"
  cert flannel "/CN=weir-cluster:flannel"
  local i
  for i in $(seq 1 "$nodes"); do cert "kubelet-$i" "/O=system:nodes/CN=system:node:$(node_name "$i")"; done
  [ -f "$pki/sa.key" ] || { openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null; openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null; }
  chmod 600 "$pki"/*.key
}

# kubeconfig FILE SERVER CERT: a kubeconfig with the client certificate CERT.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: weir-cluster
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: $3
  user:
    client-certificate-data: $(base64 -w0 <"$pki/$3.crt")
    client-key-data: $(base64 -w0 <"$pki/$3.key")
contexts:
- name: weir-cluster
  context:
    cluster: weir-cluster
    user: $3
current-context: weir-cluster
EOF
  chmod 600 "$1"
}

# --- network ------------------------------------------------------------------------------

check_kernel() {
  local probe=weirc-probe-$$
  ip netns add "$probe" || die "cannot create a network namespace (ip netns add): run as root"
  local ok=1
  ip -n "$probe" link add p0 type bridge 2>/dev/null || { log "the kernel cannot make a bridge"; ok=0; }
  ip -n "$probe" link add v0 type vxlan id 1 dstport 8472 nolearning 2>/dev/null || { log "the kernel cannot make a vxlan link (Flannel's backend)"; ok=0; }
  ip netns exec "$probe" sh -c 'test -e /proc/sys/net/bridge/bridge-nf-call-iptables' || { log "br_netfilter is not loaded (modprobe br_netfilter)"; ok=0; }
  ip netns delete "$probe"
  [ "$ok" = 1 ] || die "this kernel lacks what the cluster needs (above)"
  [ -d /sys/fs/cgroup/pids ] && [ -d /sys/fs/cgroup/memory ] && [ -d /sys/fs/cgroup/cpu ] || die "cgroup v1 hierarchies cpu, memory and pids are needed under /sys/fs/cgroup"
}

make_network() {
  ip netns add "$cp_ns"
  ip -n "$cp_ns" link set lo up
  ip -n "$cp_ns" link add "$bridge" type bridge
  ip -n "$cp_ns" addr add "$cp_ip/24" dev "$bridge"
  ip -n "$cp_ns" link set "$bridge" up
  local i ns
  for i in $(seq 1 "$nodes"); do
    ns=$(node_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$cp_ns" link add "vn$i" type veth peer name eth0 netns "$ns"
    ip -n "$cp_ns" link set "vn$i" master "$bridge" up
    ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    # A default route gives the kubelet its InternalIP; nothing is routed past the bridge.
    ip -n "$ns" route add default via "$cp_ip"
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
  done
}

# --- the control plane --------------------------------------------------------------------

start_control_plane() {
  local cpb etcd_bin
  cpb=$(cp_bin)
  etcd_bin=$(command -v etcd)
  spawn_cp etcd "$etcd_bin" --name=weirc --data-dir="$state/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=weirc=http://127.0.0.1:2380 --logger=zap --log-level=warn
  spawn_cp kube-apiserver "$cpb/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$cp_ip" --secure-port=6443 \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --kubelet-client-certificate="$pki/apiserver-kubelet.crt" --kubelet-client-key="$pki/apiserver-kubelet.key" \
    --kubelet-preferred-address-types=InternalIP \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range="$service_cidr" --allow-privileged=true --profiling=false
  local kc=$state/kubeconfigs
  wait_for "kube-apiserver /readyz (log $state.logs/kube-apiserver.log)" apiserver_ready
  spawn_cp kube-controller-manager "$(bin)/kube-controller-manager" --kubeconfig="$kc/controller-manager" \
    --authentication-kubeconfig="$kc/controller-manager" --authorization-kubeconfig="$kc/controller-manager" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --allocate-node-cidrs=true --cluster-cidr="$pod_cidr" --node-cidr-mask-size=24 \
    --service-cluster-ip-range="$service_cidr" --service-account-private-key-file="$pki/sa.key" \
    --root-ca-file="$pki/ca.crt" --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key"
  spawn_cp kube-scheduler "$(bin)/kube-scheduler" --kubeconfig="$kc/scheduler" \
    --authentication-kubeconfig="$kc/scheduler" --authorization-kubeconfig="$kc/scheduler" \
    --bind-address=127.0.0.1 --leader-elect=false
}

apiserver_ready() { [ "$(kubectl get --raw /readyz 2>/dev/null)" = ok ]; }

# kubectl inside the control plane's namespace, where 127.0.0.1:6443 is the API server.
kubectl() { ip netns exec "$cp_ns" "$(cp_bin)/kubectl" --kubeconfig "$state/kubeconfigs/admin" --request-timeout=10s "$@"; }

# The admin kubeconfig names 127.0.0.1:PORT of this machine: a socat listener there hands each
# connection through a UNIX socket (which crosses namespaces) to one in the control plane's.
start_forwarder() {
  local port
  spawn_cp forward-cp socat "UNIX-LISTEN:$state/apiserver.sock,fork,mode=600,unlink-early" "TCP:$cp_ip:6443"
  port=$(free_port)
  setsid socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$state/apiserver.sock" </dev/null >>"$state/logs/forward.log" 2>&1 &
  record forward $!
  kubeconfig "$state/kubeconfig" "https://127.0.0.1:$port" admin
}

free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 10000))
    awk -v p=":$(printf '%04X' "$port")" 'NR > 1 && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6 || { echo "$port"; return; }
  done
  die "no free TCP port on 127.0.0.1"
}

cluster_rbac() {
  kubectl apply -f - >/dev/null <<'EOF'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "weir-cluster:flannel"}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "weir-cluster:flannel"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "weir-cluster:flannel"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "weir-cluster:flannel"}
EOF
}

# --- nodes --------------------------------------------------------------------------------

# The v1 hierarchies as the machine mounts them: "mountpoint options" lines.
cgroup_mounts() { awk '$8 == "cgroup" { n = split($10, o, ","); opts = ""; for (k = 1; k <= n; k++) if (o[k] != "rw") opts = opts (opts ? "," : "") o[k]; print $5, opts }' /proc/self/mountinfo; }

# What node I's init runs (PID 1 of its PID namespace, in a mount namespace of its own):
# cgroup hierarchies mounted again under the fresh /sys that `ip netns exec` gives, a /run of
# its own (containerd's state, pinned pod namespaces, Flannel's subnet.env, the xtables lock),
# its own kubelet, containerd, CNI and log directories, then tini to reap orphans.
node_init_script() {
  local i=$1 d mp opts
  d=$(node_dir "$i")
  echo "set -e"
  echo "mount --make-rprivate /"
  echo "mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup"
  while read -r mp opts; do
    echo "mkdir -p $mp && mount -t cgroup -o $opts cgroup $mp"
  done < <(cgroup_mounts)
  grep -q ' /sys/fs/cgroup/unified ' /proc/self/mountinfo && echo "mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified"
  echo "mount -t tmpfs -o mode=755 run /run && mkdir -p /run/netns /run/lock"
  for mp in /var/lib/kubelet /var/lib/containerd /var/lib/cni /etc/cni/net.d /var/log; do
    echo "mount --bind $d/root$mp $mp"
  done
  echo "mount --make-rshared /"
  echo "exec tini -s -- sleep infinity"
}

# The mount points the nodes bind over must exist on the machine. Those made here are listed
# in a registry that every cluster of this machine shares, and removed by the last cluster to
# go down: removing a directory that another cluster's nodes mount over would unmount it there.
registry=/run/weir-clusters

make_mount_points() {
  local mp
  mkdir -p "$registry"
  touch "$registry/$cluster"
  for mp in /var/lib/kubelet /var/lib/containerd /var/lib/cni /etc/cni/net.d; do
    [ -d "$mp" ] && continue
    mkdir -p "$mp"
    echo "$mp" >>"$registry/made-dirs"
  done
}

remove_mount_points() {
  local mp
  rm -f "$registry/$cluster"
  [ -d "$registry" ] || return 0
  [ -z "$(find "$registry" -mindepth 1 -maxdepth 1 ! -name made-dirs)" ] || return 0
  if [ -f "$registry/made-dirs" ]; then
    while read -r mp; do rmdir "$mp" 2>/dev/null || true; done <"$registry/made-dirs"
  fi
  rm -rf "$registry"
}

cgroup_root() { echo "/$cluster-$(node_name "$1")"; }

make_cgroups() {
  local i=$1 mp opts root
  root=$(cgroup_root "$i")
  while read -r mp opts; do
    mkdir -p "$mp$root"
    if [ -f "$mp/cpuset.cpus" ]; then
      cat "$mp/cpuset.cpus" >"$mp$root/cpuset.cpus"
      cat "$mp/cpuset.mems" >"$mp$root/cpuset.mems"
    fi
  done < <(cgroup_mounts)
}

remove_cgroups() {
  local root mp i
  for i in $(seq 1 "$nodes"); do
    root=$(cgroup_root "$i")
    for mp in $(cgroup_mounts | awk '{print $1}'); do
      [ -d "$mp$root" ] || continue
      find "$mp$root" -depth -type d -exec rmdir {} \; 2>/dev/null || log "could not remove every cgroup under $mp$root"
    done
  done
}

write_node_config() {
  local i=$1 d name ip
  d=$(node_dir "$i")
  name=$(node_name "$i")
  ip=$(node_ip "$i")
  mkdir -p "$d"/root/var/lib/kubelet "$d"/root/var/lib/containerd "$d"/root/var/lib/cni "$d"/root/etc/cni/net.d "$d"/root/var/log
  kubeconfig "$d/kubelet.kubeconfig" "https://$cp_ip:6443" "kubelet-$i"
  kubeconfig "$d/kube-proxy.kubeconfig" "https://$cp_ip:6443" kube-proxy
  kubeconfig "$d/flannel.kubeconfig" "https://$cp_ip:6443" flannel
  cat >"$d/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # runc cannot write a negative oom_score_adj without CAP_SYS_RESOURCE, which root lacks here.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$state/cni-bin"
    conf_dir = "/etc/cni/net.d"
EOF
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $(cgroup_root "$i")
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
resolvConf: $d/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
EOF
  # Pods get a resolv.conf that names no server of the machine's.
  echo "nameserver 10.96.0.10" >"$d/resolv.conf"
  cat >"$d/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $proxy_mode
clusterCIDR: $pod_cidr
hostnameOverride: $name
bindAddress: $ip
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
clientConnection: {kubeconfig: $d/kube-proxy.kubeconfig}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  # Flannel's CNI plugin hands each pod to the bridge plugin (cni0, the bridge Weir polices)
  # with host-local addresses from the node's Flannel subnet.
  cat >"$d/root/etc/cni/net.d/10-flannel.conflist" <<'EOF'
{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

start_node() {
  local i=$1 d name b h
  d=$(node_dir "$i")
  name=$(node_name "$i")
  b=$(bin)
  make_cgroups "$i"
  node_init_script "$i" >"$d/init.sh"
  setsid ip netns exec "$(node_ns "$i")" unshare --mount --pid --fork --mount-proc sh "$d/init.sh" \
    </dev/null >>"$state/logs/init-$name.log" 2>&1 &
  local n=$! child=""
  for _ in $(seq 1 100); do
    # ip netns exec execs unshare, which forks the node's init.
    child=$(awk '{print $1}' "/proc/$n/task/$n/children" 2>/dev/null || true)
    [ -n "$child" ] && grep -q '^tini\|^sleep' "/proc/$child/comm" 2>/dev/null && break
    sleep 0.05
  done
  [ -n "$child" ] || die "node $name's init did not start (log $state.logs/init-$name.log)"
  record "holder-$i" "$child"
  wait_for "node $name's mounts" node_mounted "$i"
  spawn_node "$i" containerd containerd --config "$d/containerd.toml"
  wait_for "containerd on $name (log $state.logs/containerd-$name.log)" in_node "$i" ctr -a /run/containerd/containerd.sock version
  for img in "$b"/images/*.tar "$state/weir-image.tar"; do
    in_node "$i" ctr -a /run/containerd/containerd.sock -n k8s.io images import --no-unpack "$img" >/dev/null ||
      die "importing $img into $name failed"
  done
  spawn_node "$i" kubelet "$b/kubelet" --config="$d/kubelet.yaml" --kubeconfig="$d/kubelet.kubeconfig" \
    --hostname-override="$name" --node-ip="$(node_ip "$i")" --v=1
}

node_mounted() { in_node "$1" test -d /run/netns; }

start_node_network() {
  local i=$1 name
  name=$(node_name "$i")
  wait_for "node $name's podCIDR (kube-controller-manager allocates it)" has_pod_cidr "$name"
  start_node_network_daemon "$i" flanneld
  start_node_network_daemon "$i" kube-proxy
}

has_pod_cidr() { [ -n "$(kubectl get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null)" ]; }

flannel_ready() { in_node "$1" sh -c 'test -s /run/flannel/subnet.env && iptables -S FLANNEL-FWD && iptables -t nat -S FLANNEL-POSTRTG'; }

node_ready() { [ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }

cmd_up() {
  [ "$(id -u)" -eq 0 ] || die "run as root (network, mount and PID namespaces, cgroups)"
  local started=$SECONDS i
  if [ -f "$state/pids" ] && running kube-apiserver; then
    log "already up"
    echo "$state/kubeconfig"
    return
  fi
  cmd_down quiet
  check_kernel
  cmd_build
  trap 'status=$?; if [ "$status" -ne 0 ]; then log "up failed: taking down what it made"; cmd_down quiet; fi' EXIT
  mkdir -p "$state/logs" "$state/kubeconfigs" "$state/cni-bin"
  rm -rf "$state.logs"
  : >"$state/pids"
  make_pki
  kubeconfig "$state/kubeconfigs/admin" "https://127.0.0.1:6443" admin
  kubeconfig "$state/kubeconfigs/controller-manager" "https://127.0.0.1:6443" controller-manager
  kubeconfig "$state/kubeconfigs/scheduler" "https://127.0.0.1:6443" scheduler
  echo "{\"Network\": \"$pod_cidr\", \"Backend\": {\"Type\": \"vxlan\"}}" >"$state/net-conf.json"
  ln -sf /usr/lib/cni/* "$state/cni-bin/"
  ln -sf "$(bin)/flannel" "$state/cni-bin/flannel"
  # Weir's image, under the name the chart gives it.
  skopeo copy --quiet "oci-archive:$("$repo/scripts/image.sh" build)" "docker-archive:$state/weir-image.tar:$(weir_image)" >/dev/null
  make_network
  make_mount_points
  start_control_plane
  cluster_rbac
  for i in $(seq 1 "$nodes"); do
    write_node_config "$i"
    start_node "$i"
  done
  for i in $(seq 1 "$nodes"); do start_node_network "$i"; done
  for i in $(seq 1 "$nodes"); do
    wait_for "node $(node_name "$i") Ready" node_ready "$(node_name "$i")"
    # Until flanneld has written the node's subnet and its rules, a pod's network set-up fails.
    wait_for "flanneld's subnet and rules on $(node_name "$i") (log $state.logs/flanneld-$(node_name "$i").log)" flannel_ready "$i"
  done
  start_forwarder
  trap - EXIT
  log "up in $((SECONDS - started))s: $nodes nodes Ready"
  echo "$state/kubeconfig"
}

cmd_down() {
  local quiet=${1:-} i mp
  [ -d "$state" ] || return 0
  if [ -f "$state/pids" ]; then
    stop forward
    # A node's init is PID 1 of its PID namespace: when it dies the kernel kills every process
    # of that node, containers included.
    for i in $(seq 1 "$nodes"); do
      local h
      h=$(holder "$i")
      if [ -n "$h" ] && running "holder-$i"; then kill -KILL "$h" 2>/dev/null || true; fi
    done
    for name in kube-scheduler kube-controller-manager kube-apiserver forward-cp etcd; do stop "$name"; done
  fi
  # Wait for the nodes' processes to be gone before their cgroups go.
  for _ in $(seq 1 100); do
    local left=0
    for i in $(seq 1 "$nodes"); do running "holder-$i" && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for i in $(seq 1 "$nodes"); do ip netns delete "$(node_ns "$i")" 2>/dev/null || true; done
  ip netns delete "$cp_ns" 2>/dev/null || true
  sleep 0.2
  remove_cgroups
  remove_mount_points
  # containerd's overlay snapshots and kubelet's volumes may still be mounted below the state.
  { grep " $state/" /proc/self/mountinfo || true; } | awk '{print $5}' | sort -r | while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
  # The logs outlive the cluster, for the failure that brought it down.
  if [ -d "$state/logs" ]; then rm -rf "$state.logs"; mv "$state/logs" "$state.logs"; fi
  rm -rf "$state"
  [ -n "$quiet" ] || log "down (its logs are in $state.logs)"
}

cmd_status() {
  [ -f "$state/pids" ] || { echo "down"; return; }
  local name pid start
  while read -r name pid start; do
    if alive "$pid" "$start"; then echo "$name: running (pid $pid)"; else echo "$name: not running"; fi
  done <"$state/pids"
  running kube-apiserver && kubectl get nodes -o wide 2>/dev/null || true
}

node_index() {
  local i
  for i in $(seq 1 "$nodes"); do [ "$(node_name "$i")" = "$1" ] && { echo "$i"; return; }; done
  die "no node named $1 (nodes: $(for i in $(seq 1 "$nodes"); do printf '%s ' "$(node_name "$i")"; done))"
}

cmd_load_image() {
  local archive=$1 name=$2 i tmp
  tmp=$(mktemp "$state/image.XXXXXX.tar")
  skopeo copy --quiet "oci-archive:$archive" "docker-archive:$tmp:$name" >/dev/null
  for i in $(seq 1 "$nodes"); do
    in_node "$i" ctr -a /run/containerd/containerd.sock -n k8s.io images import "$tmp" >/dev/null || die "importing $name into $(node_name "$i") failed"
  done
  rm -f "$tmp"
}

cmd_restart() {
  local i name=$2 d
  i=$(node_index "$1")
  d=$(node_dir "$i")
  running "$name-$1" || die "$name is not running on $1"
  stop "$name-$1"
  case $name in
    flanneld | kube-proxy) start_node_network_daemon "$i" "$name" ;;
    *) die "restart takes flanneld or kube-proxy" ;;
  esac
}

start_node_network_daemon() {
  local i=$1 name=$2 d n
  d=$(node_dir "$i")
  n=$(node_name "$i")
  case $name in
    flanneld) spawn_node "$i" flanneld env NODE_NAME="$n" "$(bin)/flanneld" --kube-subnet-mgr --kubeconfig-file="$d/flannel.kubeconfig" \
      --iface=eth0 --ip-masq --net-config-path="$state/net-conf.json" --subnet-file=/run/flannel/subnet.env ;;
    kube-proxy) spawn_node "$i" kube-proxy "$(cp_bin)/kube-proxy" --config="$d/kube-proxy.yaml" ;;
  esac
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  purge) cmd_down quiet && rm -rf "$state.logs" ;;
  status) cmd_status ;;
  load-image) cmd_load_image "${2:?usage: cluster.sh load-image ARCHIVE NAME}" "${3:?usage: cluster.sh load-image ARCHIVE NAME}" ;;
  node-exec) i=$(node_index "${2:?usage: cluster.sh node-exec NODE CMD...}"); shift 2; in_node "$i" "$@" ;;
  e2e-binary) echo "$(bin)/e2e-netpol.test" ;;
  npapi-binary) echo "$(bin)/npapi-conformance.test" ;;
  restart) cmd_restart "${2:?usage: cluster.sh restart NODE DAEMON}" "${3:?usage: cluster.sh restart NODE DAEMON}" ;;
  *) die "usage: cluster.sh build | up | down | purge | status | load-image ARCHIVE NAME | node-exec NODE CMD... | e2e-binary | npapi-binary | restart NODE DAEMON" ;;
esac
