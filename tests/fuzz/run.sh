#!/usr/bin/env bash
# Builds the fuzz targets with clang (AddressSanitizer, UndefinedBehavior-
# Sanitizer, libFuzzer's coverage over the whole daemon) in a build
# directory of its own, writes their seed corpora, and fuzzes for SECONDS
# (default 60) in all: half for fuzz-session (a local client's frames),
# half for fuzz-node (the node port's: the lobby, the authentication and
# an authenticated node's). Ends with one line per target, "fuzz-X: N
# executions in S s, corpus of N inputs"; a crash, leak or hang leaves its
# input in the build directory and fails.
#
# Usage: tests/fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
# Reproduce: BUILD/tests/fuzz/fuzz-session BUILD/tests/fuzz/crash-...
#            (fuzz-node for an input named node-crash-...)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${GRADSYNC_FUZZ_BUILD:-build-fuzz}
seconds=${1:-60}
shift || true

# CUDA is off: the targets run the host backend, and nvcc need not agree
# with clang's sanitizers.
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ meson setup "$build" -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fsanitize=fuzzer-no-link -Dcpp_args=-fsanitize=fuzzer-no-link \
    -Dcuda=disabled \
    >/tmp/gradsync-fuzz-setup.$$.log 2>&1 ||
    { cat /tmp/gradsync-fuzz-setup.$$.log; rm -f /tmp/gradsync-fuzz-setup.$$.log; exit 1; }
  rm -f /tmp/gradsync-fuzz-setup.$$.log
fi
meson compile -C "$build" fuzz-session fuzz-node fuzz-corpus >"$build/compile.log" 2>&1 ||
  { tail -n 40 "$build/compile.log"; exit 1; }

dir=$build/tests/fuzz
rm -rf "$dir/seeds" "$dir/node-seeds" && mkdir -p "$dir/seeds" "$dir/node-seeds" || exit 1
"$dir/fuzz-corpus" "$dir/seeds" "$dir/node-seeds" || exit 1

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# Fuzzes target for secs; its new inputs go to corpus (kept between runs
# in the same build directory). Prints its line; returns 1 on a failure.
fuzz() {
  local target=$1 secs=$2 corpus=$3 seeds=$4 prefix=$5
  shift 5
  mkdir -p "$corpus" || return 1
  "$dir/$target" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 \
    -max_len=8192 -print_final_stats=1 -artifact_prefix="$dir/$prefix" "$@" \
    "$corpus" "$seeds" >"$dir/$target.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 60 "$dir/$target.log"
    echo "$target: FAILED (exit $rc); the input is in $dir/, the log in $dir/$target.log"
    return 1
  fi
  local execs inputs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/$target.log")
  inputs=$(ls "$corpus" | wc -l)
  echo "$target: ${execs:-?} executions in $secs s, corpus of $inputs inputs"
}

node_seconds=$((seconds / 2))
session_seconds=$((seconds - node_seconds))
rc=0
fuzz fuzz-session "$session_seconds" "$dir/corpus" "$dir/seeds" "" "$@" || rc=1
if [ "$node_seconds" -gt 0 ]; then
  fuzz fuzz-node "$node_seconds" "$dir/node-corpus" "$dir/node-seeds" node- "$@" || rc=1
fi
exit $rc
