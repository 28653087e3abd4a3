#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts gradsyncd and two
# trainers that sync the ResNet-50 gradient layout for a number of steps,
# each verifying every step against its own fp64 reference, then shows
# `gradsyncctl status`.
#   scripts/demo.sh [STEPS] [TRAINERS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
trainers=${2:-2}
build=${GRADSYNC_BUILD:-build}

./scripts/setup.sh
./scripts/build.sh >/dev/null

dir=$(mktemp -d /tmp/gradsync-demo-XXXXXX)
socket=$dir/gradsyncd.sock
"$build/daemon/gradsyncd" --socket="$socket" --local-size="$trainers" 2>"$dir/gradsyncd.log" &
daemon=$!
cleanup() {
  kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
  "$build/client/gradsyncctl" --socket "$socket" status >/dev/null 2>&1 && break
  sleep 0.1
done
sed 's/^/  daemon: /' "$dir/gradsyncd.log"

echo "== $trainers trainers, ResNet-50 layout (161 tensors, 25.6M elements), $steps steps"
pids=()
for rank in $(seq 0 $((trainers - 1))); do
  "$build/client/gradsync-example-trainer" --socket "$socket" \
    --layout layouts/resnet50.txt --rank "$rank" --steps "$steps" \
    > "$dir/trainer-$rank.log" 2>&1 &
  pids+=($!)
done
status=0
for rank in "${!pids[@]}"; do
  wait "${pids[$rank]}" || status=1
  sed "s/^/  trainer $rank: /" "$dir/trainer-$rank.log"
done

echo "== gradsyncctl status"
"$build/client/gradsyncctl" --socket "$socket" status
exit $status
