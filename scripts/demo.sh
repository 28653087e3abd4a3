#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts one gradsyncd per node
# on this machine and TRAINERS trainers on each, which sync the ResNet-50
# gradient layout for STEPS steps, each verifying every step against its own
# fp64 reference; then shows `gradsyncctl status` of node 0.
#   scripts/demo.sh [STEPS] [TRAINERS] [NODES]      (defaults 10 2 1)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
trainers=${2:-2}
nodes=${3:-1}
build=${GRADSYNC_BUILD:-build}

./scripts/setup.sh
./scripts/build.sh >/dev/null

dir=$(mktemp -d /tmp/gradsync-demo-XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
daemons=()
cleanup() {
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

for node in $(seq 0 $((nodes - 1))); do
  "$build/daemon/gradsyncd" --socket="$dir/node-$node.sock" --local-size="$trainers" \
    --nodes="$nodes" --node-rank="$node" --coordinator="127.0.0.1:$port" \
    --gloo-host=127.0.0.1 --join-timeout=60 2>"$dir/gradsyncd-$node.log" &
  daemons+=($!)
done
for node in $(seq 0 $((nodes - 1))); do
  for _ in $(seq 600); do
    "$build/client/gradsyncctl/gradsyncctl" --socket "$dir/node-$node.sock" status >/dev/null 2>&1 && break
    sleep 0.1
  done
  sed "s/^/  daemon $node: /" "$dir/gradsyncd-$node.log"
done

echo "== $nodes node(s) x $trainers trainers, ResNet-50 layout (161 tensors, 25.6M elements), $steps steps"
pids=()
names=()
for node in $(seq 0 $((nodes - 1))); do
  for rank in $(seq 0 $((trainers - 1))); do
    "$build/tests/trainer/gradsync-verifying-trainer" --socket "$dir/node-$node.sock" \
      --layout layouts/resnet50.txt --rank "$rank" --steps "$steps" \
      > "$dir/trainer-$node-$rank.log" 2>&1 &
    pids+=($!)
    names+=("$node-$rank")
  done
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || status=1
  sed "s/^/  trainer ${names[$i]}: /" "$dir/trainer-${names[$i]}.log"
done

echo "== gradsyncctl status (node 0)"
"$build/client/gradsyncctl/gradsyncctl" --socket "$dir/node-0.sock" status
exit $status
