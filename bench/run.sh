#!/usr/bin/env bash
# The benchmarks in one command: installs what is missing (scripts/setup.sh),
# builds (scripts/build.sh, in build/ or $GRADSYNC_BUILD), and runs
# gradsync-bench, which measures gradsync against Gloo in the same run.
# Results go to $build/bench-results unless --out says otherwise.
#   bench/run.sh [--nodes N] [--trainers M] [--steps K] [...]   (--help: all flags)
#   bench/run.sh --cluster [...]   between nodes on the cluster on one machine:
#                steps against Gloo, link use, small buckets, 8 nodes, scale
#                and its model, in one run (bench/cluster-report.sh --help)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --cluster ]; then
  shift
  exec bench/cluster-report.sh "$@"
fi
. bench/prepare.sh
exec "$build/bench/gradsync-bench" --out "$build/bench-results" "$@"
