#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every unit
# and integration test; runs them all again built with AddressSanitizer and
# UndefinedBehaviorSanitizer (LeakSanitizer on) in build-asan/; fuzzes the
# daemon's frame decoding and message handling for a minute
# (tests/fuzz/run.sh); and ends with one line "N passed, N failed, N
# skipped" over both runs of the suite and the fuzzing.
# The Python tests run in the virtual environment scripts/python-env.sh
# makes (PyTorch and NumPy from PyPI), once: the sanitizer run leaves them
# out, as an instrumented library cannot be loaded into a plain python.
# GRADSYNC_SANITIZE=0 skips the sanitizer run, GRADSYNC_FUZZ_SECONDS=0 the
# fuzzing.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${GRADSYNC_BUILD:-build}
asan_build=${GRADSYNC_ASAN_BUILD:-build-asan}
fuzz_seconds=${GRADSYNC_FUZZ_SECONDS:-60}

./scripts/setup.sh || exit 1
./scripts/build.sh || exit 1
./scripts/python-env.sh || exit 1
export GRADSYNC_REQUIRE_VENV=1

rm -f "$build/meson-logs/testlog.json"
meson test -C "$build" --print-errorlogs "$@"
rc=$?

logs=("$build/meson-logs/testlog.json")
if [ "${GRADSYNC_SANITIZE:-1}" != 0 ]; then
  # The daemons, trainers and tests it starts inherit the options: any
  # report aborts that process, which fails its test.
  start=$SECONDS
  mkdir -p "$asan_build"
  rm -f "$asan_build/meson-logs/testlog.json"
  if { [ -f "$asan_build/build.ninja" ] ||
       meson setup "$asan_build" -Db_sanitize=address,undefined -Db_lundef=false; } \
       >"$asan_build/compile.log" 2>&1 &&
     meson compile -C "$asan_build" >>"$asan_build/compile.log" 2>&1; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C "$asan_build" --print-errorlogs --timeout-multiplier 3 \
      --no-suite python "$@" || rc=1
  else
    tail -n 40 "$asan_build/compile.log"
    rc=1
  fi
  echo "sanitizer stage: $((SECONDS - start)) s"
  logs+=("$asan_build/meson-logs/testlog.json")
fi

fuzz=skipped
if [ "$fuzz_seconds" != 0 ]; then
  if ./tests/fuzz/run.sh "$fuzz_seconds"; then fuzz=passed; else fuzz=failed; rc=1; fi
fi

# One closing line over every test case: cmocka's own counts from each
# test program's output, or the program's result where it has none; a
# stage whose tests never ran (its build failed) counts as one failure.
python3 - "$fuzz" "${logs[@]}" <<'PY'
import json, os, re, sys
passed = failed = skipped = 0
for path in sys.argv[2:]:
    if not os.path.exists(path):
        failed += 1
        continue
    for line in open(path):
        t = json.loads(line)
        out = (t.get("stdout") or "") + (t.get("stderr") or "")
        ok = re.findall(r"\[  PASSED  \] (\d+) test", out)
        bad = re.findall(r"\[  FAILED  \] (\d+) test", out)
        if ok or bad:
            passed += sum(map(int, ok))
            failed += sum(map(int, bad))
            if t["result"] not in ("OK", "EXPECTEDFAIL") and not bad:
                failed += 1  # crashed or timed out after its passing cases
        elif t["result"] in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif t["result"] == "SKIP":
            skipped += 1
        else:
            failed += 1
fuzz = sys.argv[1]
passed += fuzz == "passed"
failed += fuzz == "failed"
skipped += fuzz == "skipped"
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $rc
