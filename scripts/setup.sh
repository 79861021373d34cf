#!/usr/bin/env bash
# Installs what Weir's demo and tests need on a fresh Debian machine (run as root):
# iptables (nft and legacy), ipset, conntrack and iproute2 from Debian, etcd and openssl for
# the integration tier's real control plane (kube-apiserver itself is built from the Go module
# proxy by scripts/control-plane.sh, cached), tcpdump (the audit log's NFLOG reader), nftables (kube-proxy's nftables
# mode in the Services tests), mmdebstrap, umoci and skopeo for the agent image
# (scripts/image.sh builds it without Docker; skopeo reads it back), then the npm dependencies,
# which include Node 24 itself (the 'node' dev dependency).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in iptables iptables-legacy ipset conntrack ip tcpdump nft etcd openssl flock mmdebstrap umoci skopeo; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then echo "setup: ${missing[*]} missing; run as root to install them" >&2; exit 1; fi
  echo "setup: installing Debian packages for ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends iptables ipset conntrack iproute2 tcpdump nftables etcd-server openssl util-linux mmdebstrap umoci skopeo >/dev/null
fi
if [ ! -x node_modules/.bin/node ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
