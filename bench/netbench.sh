# Sourced by the benchmarks on scripts/netcluster.sh (cluster.sh,
# small-buckets.sh) once they have set $bench (their name for messages),
# $nc (netcluster.sh), $name (their cluster's), $tmp (their logs) and
# pids=(): on every way out the processes in pids (and load_pids, of
# bench/load.sh) are killed and the
# cluster is taken down, and the logs stay when the run failed. Gives say
# (a line stamped with the seconds since), wait_all, and start_daemons and
# stop_daemons for a gradsyncd on each of the two nodes.
cleanup() {
  local rc=$?
  for p in "${pids[@]}" ${load_pids[@]+"${load_pids[@]}"}; do
    kill -KILL "$p" 2>/dev/null || true
  done
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

# A gradsyncd ($1, the binary) on each of nodes 0 and 1, --backend=host,
# its socket $2/nK.sock and its log $2/gradsyncd-K.log, killed after $3 s;
# their pids join pids. Returns once both sockets are there. It runs as
# systemd/gradsyncd.service runs it, SCHED_FIFO at priority 1, unless
# GRADSYNC_BENCH_POLICY=other (an ordinary process).
start_daemons() {
  local daemon=$1 dir=$2 limit=$3 k i policy=(chrt -f 1)
  [ "${GRADSYNC_BENCH_POLICY:-fifo}" = other ] && policy=()
  rm -f "$dir"/n?.sock
  for k in 0 1; do
    timeout -s KILL "$limit" "$nc" exec "$name" "$k" ${policy[@]+"${policy[@]}"} "$daemon" \
      --socket="$dir/n$k.sock" --node-address="$("$nc" addr "$k")" --node-port=29450 \
      --backend=host --join-timeout=60 --config= >"$dir/gradsyncd-$k.log" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do
    for ((i = 0; i < 300; i++)); do [ -S "$dir/n$k.sock" ] && break; sleep 0.1; done
    [ -S "$dir/n$k.sock" ] || { cat "$dir/gradsyncd-$k.log" >&2; return 1; }
  done
}

# Stops what start_daemons started.
stop_daemons() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait_all "${pids[@]}" || true
  pids=()
}
