#!/usr/bin/env bash
# The state broadcast (gs_state_broadcast) against torch.distributed's
# Gloo broadcast of the same tensors, ResNet-50's and BERT-base's
# parameters, in the same run (bench/state_broadcast.py): builds, makes
# the Python environment, starts its own gradsyncd.
#   bench/state-broadcast.sh [--procs N] [--repeat R]
# Between nodes: 2 nodes x 1 trainer on the namespace cluster
# (scripts/netcluster.sh, root), each node's link shaped to RATE; per
# layout one gradsyncd per node and a trainer beside it, then a
# torch.distributed rank per node on the same CPUs; each broadcasts the
# whole state from global rank 0. Prints time, the fraction of the link's
# rate (state bytes / time / rate) and torch's time over gradsync's.
#   bench/state-broadcast.sh --cluster [--rate 10gbit] [--repeat R]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/prepare.sh
./scripts/python-env.sh
venv=${GRADSYNC_VENV:-.venv}
export GRADSYNC_LIBRARY=$PWD/$build/client/libgradsync.so.0
export PYTHONPATH=$PWD/python
if [ "${1:-}" != --cluster ]; then
  exec "$venv/bin/python" bench/state_broadcast.py --daemon "$build/daemon/gradsyncd" \
    --layout layouts/resnet50.txt --layout layouts/bert-base.txt "$@"
fi
shift
rate=10gbit repeat=5
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    *) echo "state-broadcast.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
nc=scripts/netcluster.sh
name=sb$$
tmp=$(mktemp -d /tmp/gradsync-state-XXXXXX)
pids=()
LIMIT=300 # seconds for one system on one layout
bench=state-broadcast.sh
. bench/netbench.sh
py=$PWD/$venv/bin/python

# One system ($1) on layout $2: a rank per node, each writing $tmp/$1-$2-K.json.
run_ranks() {
  local system=$1 layout=$2 k t=() extra
  for k in 0 1; do
    if [ "$system" = gradsync ]; then
      extra=(--socket "$tmp/n$k.sock")
    else
      extra=(--init "$tmp/torch-init-$layout")
    fi
    GRADSYNC_NODES=2 GRADSYNC_NODE_RANK=$k GRADSYNC_COORDINATOR=$("$nc" addr 0) \
      GRADSYNC_LOCAL_SIZE=1 GRADSYNC_JOB_ID="state-$layout" GLOO_SOCKET_IFNAME=eth0 \
      timeout -s KILL "$LIMIT" "$nc" exec "$name" "$k" "$py" bench/state_broadcast.py rank \
      "$system" "$k" --world 2 --layout "layouts/$layout.txt" --repeat "$repeat" \
      "${extra[@]}" --out "$tmp/$system-$layout-$k.json" >"$tmp/$system-$layout-$k.log" 2>&1 &
    t+=($!)
  done
  wait_all "${t[@]}" || { cat "$tmp"/*.log >&2; return 1; }
}

say "state-broadcast.sh --cluster: 2 nodes x 1 trainer at $rate, $repeat repeats after 1"
"$nc" up "$name" 2 --rate "$rate" 2>&1 | sed 's/^/  /'
for layout in resnet50 bert-base; do
  say "$layout: gradsync"
  start_daemons "$build/daemon/gradsyncd" "$tmp" $((LIMIT + 30))
  run_ranks gradsync "$layout"
  stop_daemons
  say "$layout: torch.distributed.broadcast (Gloo)"
  run_ranks torch "$layout"
done
"$nc" down "$name"
"$py" - "$tmp" "$rate" <<'PY'
import json, statistics, sys
tmp, rate = sys.argv[1], sys.argv[2]
bits = float(rate.rstrip("gbit")) * 1e9 if rate.endswith("gbit") else float(rate.rstrip("mbit")) * 1e6
print(f"{'layout':<10} {'MB':>6} {'gradsync s':>10} {'of link':>7} {'torch s':>8} {'of link':>7} "
      f"{'torch/gradsync':>14}")
for layout in ("resnet50", "bert-base"):
    row = {}
    for system in ("gradsync", "torch"):
        r = [json.load(open(f"{tmp}/{system}-{layout}-{k}.json")) for k in (0, 1)]
        per = [max(a, b) for a, b in zip(r[0]["times"], r[1]["times"])]
        row[system] = (statistics.median(per), r[0]["bytes"])
    (g, n), (t, _) = row["gradsync"], row["torch"]
    print(f"{layout:<10} {n / 1e6:6.1f} {g:10.4f} {n * 8 / g / bits:7.2f} {t:8.4f} "
          f"{n * 8 / t / bits:7.2f} {t / g:14.2f}")
PY
