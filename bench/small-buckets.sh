#!/usr/bin/env bash
# Small buckets at network latency (issue 16): what one bucket of a few
# elements costs through gradsyncd across two nodes, against one small
# Gloo all-reduce of the same elements between the same two nodes, in one
# run. The nodes are scripts/netcluster.sh's network namespaces, each on
# its own CPU; everything of node K (daemon, trainer, Gloo rank) runs on
# node K's CPU.
#   gloo-fp32, gloo-fp16  gradsync-bench-gloo-rank --small E in each
#              namespace: C all-reduces of E elements, each timed; run
#              before and after gradsync, so that both passes bracket it;
#   gloo-fp32-batch, gloo-fp16-batch  the same under SCHED_BATCH, as
#              gradsyncd's worker ran until issue 25 (bench/small_gloo.c);
#   gradsync   one gradsyncd per node (--backend=host) and one
#              gradsync-bench-trainer per node, threshold 0, so that each
#              tensor is a bucket of its own:
#     many     a layout of B tensors of E elements: per-bucket cost =
#              step time / B (the slower node's step, median over steps);
#     one      a layout of one tensor of E elements: one bucket's latency
#              (the slower node's step, median over steps).
# --gradsyncd NAME=PATH,... runs each of several gradsyncd builds in turn
# (as gradsync-NAME; say, main's against a branch's), all between the two
# Gloo passes. Prints a table with the ratios to the Gloo baseline of
# gradsync's wire dtype (--wire, default fp16, gradsync's default) and
# writes small-buckets.csv (every call and step), summary.csv and README.md
# to --out (default bench/results/small-buckets). Needs root (namespaces).
#
#   bench/small-buckets.sh [--rate 10gbit] [--elements E] [--buckets B]
#                          [--steps K] [--one-steps K1] [--calls C]
#                          [--wire fp16|fp32] [--gradsyncd NAME=PATH,...]
#                          [--out DIR]
#
# Everything is bounded (each process by `timeout`), and the cluster is
# taken down on every way out.
set -euo pipefail
cd "$(dirname "$0")/.."

rate=10gbit elements=4 buckets=1000 steps=10 one_steps=500 calls=2000 wire=fp16 daemons=
out=bench/results/small-buckets
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=${2:?}; shift 2 ;;
    --elements) elements=${2:?}; shift 2 ;;
    --buckets) buckets=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --one-steps) one_steps=${2:?}; shift 2 ;;
    --calls) calls=${2:?}; shift 2 ;;
    --wire) wire=${2:?}; shift 2 ;;
    --gradsyncd) daemons=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,32s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "small-buckets.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
for v in elements buckets steps one_steps calls; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 && ${!v} -le 100000 ]] || {
    echo "small-buckets.sh: --${v/_/-} must be 1 to 100000" >&2
    exit 2
  }
done
[[ $wire == fp16 || $wire == fp32 ]] || { echo "small-buckets.sh: --wire is fp16 or fp32" >&2; exit 2; }

. bench/prepare.sh
read_daemon_list "${daemons:-}"
nc=scripts/netcluster.sh
bin=$build/bench
name=lsb$$
tmp=$(mktemp -d /tmp/gradsync-small-buckets-XXXXXX)
pids=()
TIMEOUT=600 # seconds for any one part

bench=small-buckets.sh
. bench/netbench.sh

# The layouts: B tensors of E elements, and one.
layout() {
  local n=$1 f=$2 i
  {
    echo "# small-buckets: $n tensors of $elements elements"
    for ((i = 0; i < n; i++)); do echo "t$i $elements $elements"; done
  } >"$f"
}
layout "$buckets" "$tmp/many.txt"
layout 1 "$tmp/one.txt"

# The Gloo baseline, pass $1: a rank per node; $2 --sched-batch or nothing.
run_gloo() {
  local pass=$1 batch=${2:-} dir=$tmp/gloo-$1${2:-} k t=()
  mkdir -p "$dir/store"
  for k in 0 1; do
    timeout -s KILL "$TIMEOUT" "$nc" exec "$name" "$k" "$bin/gradsync-bench-gloo-rank" \
      --rank "$k" --size 2 --store "$dir/store" --address "$("$nc" addr "$k")" \
      --small "$elements" --steps "$calls" --warmup 100 $batch \
      --csv "$dir/rank-$k.csv" >"$dir/rank-$k.log" 2>&1 &
    t+=($!)
  done
  if ! wait_all "${t[@]}"; then
    cat "$dir"/*.log >&2
    return 1
  fi
  for k in 0 1; do
    # system,rank,call,us -> system,layout,pass,rank,iteration,us
    sed "s/^\([^,]*\),/\1,small,$pass,/" "$dir/rank-$k.csv" >>"$tmp/all.csv"
  done
}

# gradsync: a trainer per node (the daemons started) on layout $1 for $2
# steps, as system $3.
run_gradsync() {
  local layout=$1 nsteps=$2 system=$3 dir=$tmp/$3-$1 k t=()
  mkdir -p "$dir"
  for k in 0 1; do
    GRADSYNC_NODES=2 GRADSYNC_NODE_RANK=$k GRADSYNC_COORDINATOR=10.77.0.1 GRADSYNC_LOCAL_SIZE=1 \
      GRADSYNC_JOB_ID="small-$layout" GRADSYNC_THRESHOLD=0 GRADSYNC_WIRE=$wire \
      timeout -s KILL "$TIMEOUT" "$nc" exec "$name" "$k" "$bin/gradsync-bench-trainer" \
      --socket "$tmp/n$k.sock" --layout "$tmp/$layout.txt" --steps "$nsteps" --warmup 2 \
      --csv "$dir/trainer-$k.csv" >"$dir/trainer-$k.log" 2>&1 &
    t+=($!)
  done
  if ! wait_all "${t[@]}"; then
    cat "$dir"/*.log "$tmp"/gradsyncd-*.log >&2
    return 1
  fi
  for k in 0 1; do
    # rank,step,ms,daemon_ms,wire_bytes -> system,layout,pass,rank,iteration,us
    awk -F, -v s="$system" -v l="$layout" \
      '{ printf "%s,%s,1,%s,%s,%.3f\n", s, l, $1, $2, $3 * 1000 }' \
      "$dir/trainer-$k.csv" >>"$tmp/all.csv"
  done
}

echo "system,layout,pass,rank,iteration,us" >"$tmp/all.csv"
say "small-buckets.sh: 2 nodes x 1 trainer at $rate, buckets of $elements elements ($wire wire)"
say "  gradsync: $buckets buckets x $steps steps, 1 bucket x $one_steps steps; Gloo: $calls calls a pass"
"$nc" up "$name" 2 --rate "$rate" 2>&1 | sed 's/^/  /'
say "Gloo, first pass (plain, then SCHED_BATCH)"
run_gloo 1
run_gloo 1 --sched-batch
for d in "${daemon_list[@]}"; do
  system=$(daemon_system "$d")
  say "$system: $buckets buckets a step"
  start_daemons "${d#*=}" "$tmp" $((3 * TIMEOUT))
  run_gradsync many "$steps" "$system"
  say "$system: one bucket a step"
  run_gradsync one "$one_steps" "$system"
  stop_daemons
  grep -h 'buckets (threshold' "$tmp"/gradsyncd-0.log | sed 's/^/  node 0: /' || true
done
say "Gloo, second pass (plain, then SCHED_BATCH)"
run_gloo 2
run_gloo 2 --sched-batch
"$nc" down "$name"

mkdir -p "$out"
cp "$tmp/all.csv" "$out/small-buckets.csv"
say "done; the table:"
python3 bench/small_buckets_table.py "$out/small-buckets.csv" "$out/summary.csv" "$buckets" \
  "$wire" | tee "$out/summary.txt"
{
  echo "# Small buckets across two nodes against one small Gloo all-reduce"
  echo
  echo "Written by \`bench/small-buckets.sh --rate $rate --elements $elements --buckets $buckets"
  echo "--steps $steps --one-steps $one_steps --calls $calls --wire $wire${daemons:+ --gradsyncd $daemons}\`"
  echo "($(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -sr), load"
  echo "$(cut -d' ' -f1-3 /proc/loadavg) at the end, $((SECONDS - t0)) s in all):"
  echo "\`small-buckets.csv\` holds every call and step of every rank, \`summary.csv\` the table."
  echo
  echo '```'
  cat "$out/summary.txt"
  echo '```'
} >"$out/README.md"
say "results in $out/{README.md,small-buckets.csv,summary.csv,summary.txt}"
