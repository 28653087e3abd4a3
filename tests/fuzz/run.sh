#!/usr/bin/env bash
# Builds fuzz-session with clang (AddressSanitizer, UndefinedBehaviorSanitizer,
# libFuzzer's coverage over the whole daemon) in a build directory of its
# own, writes the seed corpus, and fuzzes for SECONDS (default 60). Ends with
# the line "fuzz: N executions in S s, corpus of N inputs"; a crash, leak or
# hang leaves its input in the build directory and fails.
#
# Usage: tests/fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
# Reproduce: BUILD/tests/fuzz/fuzz-session BUILD/tests/fuzz/crash-...
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${GRADSYNC_FUZZ_BUILD:-build-fuzz}
seconds=${1:-60}
shift || true

# CUDA is off: the target runs the host backend, and nvcc need not agree
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
meson compile -C "$build" fuzz-session fuzz-corpus >"$build/compile.log" 2>&1 ||
  { tail -n 40 "$build/compile.log"; exit 1; }

dir=$build/tests/fuzz
rm -rf "$dir/seeds" && mkdir -p "$dir/seeds" "$dir/corpus" || exit 1
"$dir/fuzz-corpus" "$dir/seeds" || exit 1

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# New inputs go to corpus/, kept between runs in the same build directory.
"$dir/fuzz-session" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
  -max_len=8192 -print_final_stats=1 -artifact_prefix="$dir/" "$@" \
  "$dir/corpus" "$dir/seeds" >"$dir/fuzz.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  tail -n 60 "$dir/fuzz.log"
  echo "fuzz: FAILED (exit $rc); the input is in $dir/, the log in $dir/fuzz.log"
  exit 1
fi
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz.log")
inputs=$(ls "$dir/corpus" | wc -l)
echo "fuzz: ${execs:-?} executions in $seconds s, corpus of $inputs inputs"
