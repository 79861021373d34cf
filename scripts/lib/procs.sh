# Sourced by scripts/control-plane.sh and scripts/cluster.sh: the processes they start are
# known by PID and start time.

# A process is its PID and its start time (field 22 of /proc/PID/stat, clock ticks since
# boot): a reused PID has another start time. Not the command line: that is the starting
# script's own until the forked child execs, and reads empty for milliseconds while a binary
# that is not in the page cache is being exec'd (a fresh machine's first start took that for
# etcd's exit). Prints the start time of a live PID; fails for a zombie or no process.
proc_start() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  rest=${stat##*) }
  # shellcheck disable=SC2086
  set -- $rest
  case $1 in Z | X | x) return 1 ;; esac
  echo "${20}"
}

# True while the process recorded as PID with start time START still runs.
alive() {
  local now
  now=$(proc_start "$1") && [ "$now" = "$2" ]
}
