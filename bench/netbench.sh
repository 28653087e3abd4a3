# Sourced by the benchmarks on scripts/netcluster.sh (cluster.sh,
# small-buckets.sh) once they have set $bench (their name for messages),
# $nc (netcluster.sh), $name (their cluster's), $tmp (their logs) and
# pids=(): on every way out the processes in pids are killed and the
# cluster is taken down, and the logs stay when the run failed. Gives say
# (a line stamped with the seconds since) and wait_all.
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  "$nc" down "$name" >/dev/null 2>&1 || true
  if [ "$rc" -ne 0 ]; then
    echo "$bench: failed (status $rc); logs in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

t0=$SECONDS
say() { printf '[%4d s] %s\n' $((SECONDS - t0)) "$*"; }

# Waits for every pid in $@; fails when any fails.
wait_all() {
  local p rc=0
  for p in "$@"; do wait "$p" || rc=$?; done
  return "$rc"
}
