# Sourced by the scripts that build into ~/.cache/weir (control-plane.sh, helm.sh, cluster.sh,
# image.sh, peers.sh): a build is reused while the stamp of its inputs is the same, and made by
# one process at a time.

# The stamp of the files given, in that order; of stdin when none is given.
stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# locked_build DIR CMD...: CMD with DIR/build.lock held (DIR made first). Test files may start
# in parallel: one builds, the others wait and then reuse it. The lock lives in a subshell so
# that no daemon started later inherits it.
locked_build() {
  local dir=$1
  shift
  mkdir -p "$dir"
  (
    flock 9
    "$@"
  ) 9>"$dir/build.lock"
}
