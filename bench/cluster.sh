#!/usr/bin/env bash
# gradsync against Gloo on a cluster on one machine (scripts/netcluster.sh):
# 2 nodes x 1 trainer, each node a network namespace on its own CPU, its
# link shaped to each rate in turn. Per rate and layout, in one run:
#   gradsync   one gradsyncd per node in its namespace (--backend=host,
#              default settings: fp16 wire, average) and one
#              gradsync-bench-trainer per node beside it;
#   overlap-on, overlap-off   with --overlap-both: gradsync again, its
#              daemons under GRADSYNCD_BUCKET_OVERLAP=1, then =0: buckets
#              overlapped (the next packed while one is exchanged) or not,
#              whatever the CPUs (by default they are where a daemon has
#              two or more; here each has one);
#   gloo-fp32, gloo-fp16   gradsync-bench's Gloo baseline (DDP-style
#              buckets), one gradsync-bench-gloo-rank per node in the same
#              namespaces on the same CPUs, meeting through a file store.
# --gradsyncd NAME=PATH,... runs each of several gradsyncd builds in turn
# (as gradsync-NAME; say, main's against a branch's), beside the same
# baselines; ratios are to the first.
# --sched (needs perf: apt-get install linux-perf) records the scheduler
# (perf sched record, every CPU) while
# gradsync's trainers step and writes, per gradsync run, what perf sched
# latency says of gradsyncd's threads (how long each waited to run once
# woken) to sched/SYSTEM-LAYOUT-RATE-LOAD.txt under --out, and behind whom
# they waited (bench/sched_waits.py: other processes, kernel threads,
# gradsyncd's own) to sched/SYSTEM-LAYOUT-RATE-LOAD-waits.txt.
# Each under every load of --load in turn (bench/load.sh: none, nice19,
# nice0, loader; a process per core, started before the systems run and
# stopped after), every system under the same load.
# Per step the slower node's time; the median of K steps after W of warm-up;
# under a load, each system's median over its own with no load.
# Prints a table and writes cluster.csv (every step of every rank),
# summary.csv, summary.txt and a README.md with the table to --out
# (default bench/results/cluster). Needs root (namespaces).
#
#   bench/cluster.sh [--rates 10gbit,25gbit] [--layouts resnet50,bert-base]
#                    [--load none,nice19,nice0,loader] [--steps K]
#                    [--warmup W] [--overlap-both] [--out DIR]
#                    [--gradsyncd NAME=PATH,...] [--sched]
#
# Everything is bounded (each process by `timeout`), and the cluster is
# taken down on every way out.
set -euo pipefail
cd "$(dirname "$0")/.."

rates=10gbit,25gbit layouts=resnet50,bert-base steps=10 warmup=2
out=bench/results/cluster overlap_both=0 loads=none sched=0
while [ $# -gt 0 ]; do
  case $1 in
    --rates) rates=${2:?}; shift 2 ;;
    --layouts) layouts=${2:?}; shift 2 ;;
    --load) loads=${2:?}; shift 2 ;;
    --gradsyncd) daemons=${2:?}; shift 2 ;;
    --sched) sched=1; shift ;;
    --steps) steps=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --overlap-both) overlap_both=1; shift ;;
    -h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "cluster.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $steps -ge 1 && $warmup =~ ^[0-9]+$ ]] || {
  echo "cluster.sh: --steps must be >= 1, --warmup >= 0" >&2
  exit 2
}

. bench/prepare.sh
. bench/load.sh
read_daemon_list "${daemons:-}"
nc=scripts/netcluster.sh
bin=$build/bench
name=nb$$
tmp=$(mktemp -d /tmp/gradsync-cluster-XXXXXX)
pids=()
STEP_TIMEOUT=300 # seconds for one system on one layout at one rate

bench=cluster.sh
. bench/netbench.sh

# gradsync on layout $1 at rate $2: two daemons (binary $4), then a trainer
# per node; as system $3 (gradsync, or overlap-on or -off with
# GRADSYNCD_BUCKET_OVERLAP set).
run_gradsync() {
  local layout=$1 rate=$2 system=$3 daemon=$4 dir=$tmp/$3-$1-$2-$load k t=()
  mkdir -p "$dir"
  start_daemons "$daemon" "$dir" $((STEP_TIMEOUT + 30))
  local perf=
  if [ "$sched" = 1 ]; then
    timeout -s INT "$STEP_TIMEOUT" perf sched record -a -o "$dir/perf.data" >/dev/null 2>&1 &
    perf=$!
  fi
  for k in 0 1; do
    GRADSYNC_NODES=2 GRADSYNC_NODE_RANK=$k GRADSYNC_COORDINATOR=10.77.0.1 GRADSYNC_LOCAL_SIZE=1 \
      GRADSYNC_JOB_ID="$layout-$rate" timeout -s KILL "$STEP_TIMEOUT" \
      "$nc" exec "$name" "$k" "$bin/gradsync-bench-trainer" --socket "$dir/n$k.sock" \
      --layout "layouts/$layout.txt" --steps "$steps" --warmup "$warmup" \
      --csv "$dir/trainer-$k.csv" >"$dir/trainer-$k.log" 2>&1 &
    t+=($!)
  done
  if ! wait_all "${t[@]}"; then
    cat "$dir"/*.log >&2
    return 1
  fi
  if [ -n "$perf" ]; then
    kill -INT "$perf" 2>/dev/null || true
    wait "$perf" || true
    mkdir -p "$out/sched"
    # Per thread (-p); gradsyncd's are gradsyncd (the loop), gs-worker
    # (and Gloo's, which it starts), gs-comm, gs-pack-N, gs-park.
    perf sched latency -p -i "$dir/perf.data" 2>/dev/null |
      grep -E '^ *(Task|gradsyncd|gs-)' >"$out/sched/$system-$layout-$rate-$load.txt" || true
    # Behind whom each wake-up waited (bench/sched_waits.py).
    perf sched timehist -i "$dir/perf.data" 2>/dev/null | python3 bench/sched_waits.py \
      >"$out/sched/$system-$layout-$rate-$load-waits.txt" || true
    say "$system $layout $rate $load: $(head -1 "$out/sched/$system-$layout-$rate-$load-waits.txt")"
    rm -f "$dir/perf.data"
  fi
  stop_daemons
  for k in 0 1; do
    sed "s/^/$layout,$rate,$system,/; s/\$/,$load/" "$dir/trainer-$k.csv" |
      cut -d, -f1-6,8,9 >>"$tmp/steps.csv"
  done
}

# The Gloo baseline on layout $1 at rate $2: a rank per node.
run_gloo() {
  local layout=$1 rate=$2 dir=$tmp/gloo-$1-$2-$load k t=()
  mkdir -p "$dir/store"
  for k in 0 1; do
    timeout -s KILL "$STEP_TIMEOUT" "$nc" exec "$name" "$k" "$bin/gradsync-bench-gloo-rank" \
      --rank "$k" --size 2 --store "$dir/store" --address "$("$nc" addr "$k")" \
      --layout "layouts/$layout.txt" --steps "$steps" --warmup "$warmup" \
      --csv "$dir/rank-$k.csv" >"$dir/rank-$k.log" 2>&1 &
    t+=($!)
  done
  if ! wait_all "${t[@]}"; then
    cat "$dir"/*.log >&2
    return 1
  fi
  for k in 0 1; do
    # system,rank,step,ms -> layout,rate,system,rank,step,ms,bytes (filled in later),load
    sed "s/^/$layout,$rate,/; s/\$/,0,$load/" "$dir/rank-$k.csv" >>"$tmp/steps.csv"
  done
}

echo "layout,rate,system,rank,step,ms,wire_bytes,load" >"$tmp/steps.csv"
say "cluster.sh: 2 nodes x 1 trainer, rates $rates, layouts $layouts, loads $loads, $steps steps after $warmup"
say "note: this 2-core machine carries at most ~9.5 Gbit/s between namespaces unshaped:"
say "      at rates above that the CPUs bind, not the shaping"
IFS=, read -ra rate_list <<<"$rates"
IFS=, read -ra layout_list <<<"$layouts"
IFS=, read -ra load_list <<<"$loads"
for load in "${load_list[@]}"; do
  [[ " $load_kinds " == *" $load "* ]] || {
    echo "cluster.sh: unknown load '$load' (one of: $load_kinds)" >&2
    exit 2
  }
done
for layout in "${layout_list[@]}"; do
  [ -f "layouts/$layout.txt" ] || { echo "cluster.sh: no layouts/$layout.txt" >&2; exit 2; }
done
for rate in "${rate_list[@]}"; do
  "$nc" up "$name" 2 --rate "$rate" 2>&1 | sed 's/^/  /'
  for layout in "${layout_list[@]}"; do
    for load in "${load_list[@]}"; do
      start_load "$load"
      for d in "${daemon_list[@]}"; do
        system=$(daemon_system "$d")
        say "$layout at $rate, load $load: $system"
        run_gradsync "$layout" "$rate" "$system" "${d#*=}"
      done
      if [ "$overlap_both" = 1 ]; then
        say "$layout at $rate, load $load: gradsync, buckets overlapped, then not"
        GRADSYNCD_BUCKET_OVERLAP=1 run_gradsync "$layout" "$rate" overlap-on "${daemon_list[0]#*=}"
        GRADSYNCD_BUCKET_OVERLAP=0 run_gradsync "$layout" "$rate" overlap-off "${daemon_list[0]#*=}"
      fi
      say "$layout at $rate, load $load: Gloo fp32 then fp16 buckets"
      run_gloo "$layout" "$rate"
      stop_load
    done
  done
  "$nc" down "$name"
done

mkdir -p "$out"
cp "$tmp/steps.csv" "$out/cluster.csv"
say "done; the table:"
python3 bench/cluster_table.py "$out/cluster.csv" "$out/summary.csv" \
  "bench/cluster.sh --rates $rates --layouts $layouts --load $loads --steps $steps --warmup $warmup$([ "$overlap_both" = 1 ] && echo ' --overlap-both')$([ "$sched" = 1 ] && echo ' --sched')${daemons:+ --gradsyncd $daemons}" \
  | tee "$out/summary.txt"
{
  echo "# gradsync against Gloo on a cluster on one machine"
  echo
  echo "Written by \`bench/cluster.sh\` (\`$(date -u '+%Y-%m-%d %H:%M UTC')\`, $(nproc) cores,"
  echo "$(uname -sr), load $(cut -d' ' -f1-3 /proc/loadavg) at the end, $((SECONDS - t0)) s in all):"
  echo "\`cluster.csv\` holds every step of every rank, \`summary.csv\` the table."
  echo
  echo '```'
  cat "$out/summary.txt"
  echo '```'
} >"$out/README.md"
say "results in $out/{README.md,cluster.csv,summary.csv,summary.txt}"
