# Sourced by bench/cluster.sh: the CPU loads a node runs beside training.
# start_load KIND starts one process per core, each pinned to its core
# and killed after $LOAD_LIMIT s whatever happens; their pids go to
# load_pids (netbench.sh kills them on every way out). stop_load ends them.
#   none     nothing
#   nice19   a busy loop at nice 19, the lowest priority
#   nice0    a busy loop at nice 0, as much a claim on the core as ours
#   loader   at nice 0, busy 2 ms then asleep 0.5 ms, over and over, as a
#            DataLoader worker decoding batches is
LOAD_LIMIT=${LOAD_LIMIT:-3600}
load_pids=()

load_kinds="none nice19 nice0 loader"

# Each load process bounds itself (a `timeout` in front would be the pid
# killed, and its child would live on).
start_load() {
  local kind=$1 cpu
  for ((cpu = 0; cpu < $(nproc); cpu++)); do
    case $kind in
      none) return 0 ;;
      nice19 | nice0)
        nice -n "${kind#nice}" taskset -c "$cpu" bash -c \
          "end=\$((SECONDS + $LOAD_LIMIT)); while ((SECONDS < end)); do :; done" & ;;
      loader) taskset -c "$cpu" python3 -c "
import time
end = time.monotonic() + $LOAD_LIMIT
while time.monotonic() < end:
    busy = time.perf_counter() + 0.002
    while time.perf_counter() < busy:
        pass
    time.sleep(0.0005)" & ;;
      *) echo "$bench: unknown load '$kind' (one of: $load_kinds)" >&2; return 2 ;;
    esac
    load_pids+=($!)
  done
}

stop_load() {
  local p
  for p in "${load_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  load_pids=()
}
