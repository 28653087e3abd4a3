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

# The job, as its trainers carry it (libgradsync reads it from their
# environment): TRAINERS trainers on each of NODES nodes, node 0's daemon
# at 127.0.0.1. job_env NODE sets job=(NAME=value ...) for node NODE's.
job_env() {
  job=(GRADSYNC_LOCAL_SIZE="$trainers" GRADSYNC_NODES="$nodes" GRADSYNC_NODE_RANK="$1"
       GRADSYNC_COORDINATOR=127.0.0.1)
}

# Where the other daemons reach node NODE's: its own loopback address, the
# same port on every node. The daemons take no job: the trainers give it.
node_flags() {
  flags=(--node-address="127.0.0.$(($1 + 1))" --node-port="$port")
}

for node in $(seq 0 $((nodes - 1))); do
  node_flags "$node"
  "$build/daemon/gradsyncd" --socket="$dir/node-$node.sock" "${flags[@]}" \
    --join-timeout=60 2>"$dir/gradsyncd-$node.log" &
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
  job_env "$node"
  for rank in $(seq 0 $((trainers - 1))); do
    env "${job[@]}" "$build/tests/trainer/gradsync-verifying-trainer" --socket "$dir/node-$node.sock" \
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
