#!/usr/bin/env bash
# The state broadcast (gs_state_broadcast) against torch.distributed's
# Gloo broadcast of the same tensors, ResNet-50's and BERT-base's
# parameters, in the same run (bench/state_broadcast.py): builds, makes
# the Python environment, starts its own gradsyncd.
#   bench/state-broadcast.sh [--procs N] [--repeat R]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/prepare.sh
./scripts/python-env.sh
venv=${GRADSYNC_VENV:-.venv}
export GRADSYNC_LIBRARY=$PWD/$build/client/libgradsync.so.0
export PYTHONPATH=$PWD/python
exec "$venv/bin/python" bench/state_broadcast.py --daemon "$build/daemon/gradsyncd" \
  --layout layouts/resnet50.txt --layout layouts/bert-base.txt "$@"
