#!/bin/sh
# chroot-run.sh ROOTFS WORKDIR COMMAND [ARG...]: runs COMMAND in the unpacked image as a
# container runtime would run the chart's pod: the node's /proc, /sys, /dev, /run/netns (where
# pod network namespaces are pinned) and /run/xtables.lock (shared with kube-proxy and Flannel)
# bind-mounted into it, a fresh /tmp (the chart's emptyDir), and the image's own files read-only. Started as
#   ip netns exec NS unshare --mount --propagation private chroot-run.sh ...
# so the mounts live in a mount namespace of this process alone: the kernel removes them when
# it exits, however it exits, and the host never sees them (a later rm -rf of ROOTFS cannot
# reach the host's /sys or /dev through them). Every step execs, so the caller's PID is the
# command's, and signals sent to it reach the command.
set -eu
root=$1
wd=$2
shift 2
# The root a runtime gives a container is a mount point; `ip -n NS` (source binding) remounts /
# as a slave and fails on a plain directory.
mount --bind "$root" "$root"
for d in proc sys dev run/netns; do
  mkdir -p "$root/$d"
  mount --rbind "/$d" "$root/$d"
done
[ -e /run/xtables.lock ] || : >/run/xtables.lock
[ -e "$root/run/xtables.lock" ] || : >"$root/run/xtables.lock"
mount --bind /run/xtables.lock "$root/run/xtables.lock"
# The chart's emptyDir at /tmp, where the fork server keeps each command's input and output.
mkdir -p "$root/tmp"
mount -t tmpfs -o mode=1777,size=64m weir-container-tmp "$root/tmp"
mount -o remount,bind,ro "$root"
exec unshare --root="$root" --wd="$wd" -- "$@"
