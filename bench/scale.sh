#!/usr/bin/env bash
# gradsync at 2, 4, 8 and 16 nodes on a cluster on one machine
# (scripts/netcluster.sh; the nodes share this machine's cores, which the
# output says): per node count the all-reduce between nodes alone per
# algorithm and size (the points bench/model.py fits), then real
# gradsyncd per node: join time, step time on a small layout, and the
# per-bucket latency of tiny and medium buckets, on daemons that pick the
# algorithm by the model and on all-ring ones (ratio printed). Every node
# runs under SCHED_FIFO 1 unless --no-rt. See bench/scale.py.
#
#   bench/scale.sh [--nodes 2,4,8,16] [--rate 10gbit] [--calls K] [--steps K]
#                  [--warmup W] [--bytes B1,B2,...] [--out DIR] [--no-rt]
#
# Writes gloo.csv, daemon.csv and summary.csv to --out (default
# bench/results/scale), then fits and draws the model there
# (bench/model.py: model.txt, model.svg). Needs root (namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in -h | --help) sed -n '2,16s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
out=bench/results/scale
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[i]}" = --out ] && out=${args[i + 1]:?}
done
. bench/prepare.sh
# scale.py as a child waited for, so that a signal here reaches it and it
# takes its clusters down.
python3 bench/scale.py --build "$build" "$@" &
runs=$!
trap 'kill -TERM "$runs" 2>/dev/null; wait "$runs"; exit 143' TERM INT HUP
wait "$runs"
trap - TERM INT HUP
python3 bench/model.py "$out"
