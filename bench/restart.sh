#!/usr/bin/env bash
# A restarted trainer's time from its connect to its first step done, with
# the job's group of nodes kept (--job-linger), with a new group, and with
# PyTorch's init_process_group("gloo") + DDP, in the same run: installs what
# is missing, builds, makes the Python environment (scripts/python-env.sh),
# then runs bench/restart.py, which starts its own two gradsyncd.
#   bench/restart.sh [--layouts resnet50,bert-base] [--repeat R] [--linger S]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/prepare.sh
./scripts/python-env.sh
venv=${GRADSYNC_VENV:-.venv}
export GRADSYNC_LIBRARY=$PWD/$build/client/libgradsync.so.0
export PYTHONPATH=$PWD/python
exec "$venv/bin/python" bench/restart.py --daemon "$build/daemon/gradsyncd" \
  --out "$build/bench-results" "$@"
