#!/usr/bin/env bash
# Gradsync between nodes, in one run on the cluster on one machine
# (scripts/netcluster.sh): each part measures gradsync beside its baseline
# placed the same way, and bench/cluster_report.py puts them together.
#   steps     bench/cluster.sh: ResNet-50 and BERT-base, 2 nodes x 1
#             trainer, against Gloo DDP-style fp32 and fp16 buckets, at
#             --rates (default 2gbit,10gbit,25gbit): step ratio and busbw
#             against the shaped rate, and gradsync with its buckets
#             overlapped and not (--overlap-both): what the overlap gains;
#   small     bench/small-buckets.sh: a bucket of 4 elements across 2
#             nodes against one small Gloo all-reduce between them;
#   eight     the test netcluster-eight-nodes: 8 nodes, every element of
#             every step checked, join and step time;
#   scale     bench/scale.sh: 2 to 16 nodes (--nodes), join, step and
#             per-bucket time, the all-reduce alone per algorithm, and
#             bench/model.py's alpha-beta fit drawn to 4,096 nodes.
# Prints the targets table and the model's chart; writes targets.csv,
# targets.txt, steps.svg and README.md to --out (default
# bench/results/cluster-report), each part's own results in a folder
# there. Needs root (namespaces). `bench/run.sh --cluster ...` runs it.
#
#   bench/cluster-report.sh [--rates 2gbit,10gbit,25gbit] [--nodes 2,4,8,16]
#                           [--steps K] [--quick] [--out DIR]
#
# --quick: fewer steps and calls everywhere (a check that it runs, not
# figures).
set -euo pipefail
cd "$(dirname "$0")/.."

rates=2gbit,10gbit,25gbit nodes=2,4,8,16 steps=10 quick=
out=bench/results/cluster-report
while [ $# -gt 0 ]; do
  case $1 in
    --rates) rates=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --quick) quick=1; shift ;;
    --out) out=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,25s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "cluster-report.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $steps -ge 1 ]] || { echo "cluster-report.sh: --steps must be >= 1" >&2; exit 2; }

. bench/prepare.sh
t0=$SECONDS
# Each part runs as a child this script waits for, so that a signal here
# reaches it and it takes its cluster down.
child=
trap '[ -z "$child" ] || kill -TERM "$child" 2>/dev/null; exit 143' TERM INT HUP
part() {
  "$@" &
  child=$!
  wait "$child"
  child=
}
say() { printf '[%4d s] %s\n' $((SECONDS - t0)) "$*"; }
mkdir -p "$out"
small=() scale=()
if [ -n "$quick" ]; then
  steps=3
  small=(--buckets 200 --steps 3 --one-steps 50 --calls 200)
  scale=(--calls 5 --steps 3 --warmup 1)
fi

say "steps: bench/cluster.sh at $rates"
part bench/cluster.sh --rates "$rates" --layouts resnet50,bert-base --steps "$steps" --warmup 2 \
  --overlap-both \
  --out "$out/steps"
say "small buckets: bench/small-buckets.sh"
part bench/small-buckets.sh "${small[@]}" --out "$out/small-buckets"
say "eight nodes: the test netcluster-eight-nodes"
mkdir -p "$out/eight-nodes"
part meson test -C "$build" --no-rebuild --verbose netcluster-eight-nodes \
  >"$out/eight-nodes/test.log" 2>&1 || { tail -50 "$out/eight-nodes/test.log" >&2; exit 1; }
say "scale: bench/scale.sh at $nodes nodes"
mkdir -p "$out/scale"
part bench/scale.sh --nodes "$nodes" "${scale[@]}" --out "$out/scale" >"$out/scale/run.log" 2>&1 ||
  { tail -50 "$out/scale/run.log" >&2; exit 1; }
say "done in $((SECONDS - t0)) s; the table:"
python3 bench/cluster_report.py "$out" \
  "bench/cluster-report.sh --rates $rates --nodes $nodes --steps $steps${quick:+ --quick}" \
  "$((SECONDS - t0))"
