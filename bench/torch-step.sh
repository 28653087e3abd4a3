#!/usr/bin/env bash
# A training step of the example model (python/examples/train.py) with
# gradsync against DDP on Gloo, in the same run: installs what is missing,
# builds, makes the Python environment (scripts/python-env.sh), then runs
# bench/torch_step.py, which starts its own gradsyncd.
#   bench/torch-step.sh [--procs N] [--steps K] [--repeat R]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GRADSYNC_BUILD:-build}
./scripts/setup.sh
log=$(mktemp /tmp/gradsync-bench-build-XXXXXX.log)
if ! ./scripts/build.sh >"$log" 2>&1; then
  cat "$log"
  rm -f "$log"
  exit 1
fi
rm -f "$log"
./scripts/python-env.sh
venv=${GRADSYNC_VENV:-.venv}
export GRADSYNC_LIBRARY=$PWD/$build/client/libgradsync.so.0
export PYTHONPATH=$PWD/python
exec "$venv/bin/python" bench/torch_step.py --daemon "$build/daemon/gradsyncd" \
  --out "$build/bench-results" "$@"
