#!/usr/bin/env bash
# A training step of the example model (python/examples/train.py) with
# gradsync against DDP on Gloo, in the same run: installs what is missing,
# builds, makes the Python environment (scripts/python-env.sh), then runs
# bench/torch_step.py, which starts its own gradsyncd.
#   bench/torch-step.sh [--procs N] [--steps K] [--repeat R]
#                       [--model mlp|transformer] [--before DIR] [--systems LIST]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/prepare.sh
./scripts/python-env.sh
venv=${GRADSYNC_VENV:-.venv}
export GRADSYNC_LIBRARY=$PWD/$build/client/libgradsync.so.0
export PYTHONPATH=$PWD/python
exec "$venv/bin/python" bench/torch_step.py --daemon "$build/daemon/gradsyncd" \
  --out "$build/bench-results" "$@"
