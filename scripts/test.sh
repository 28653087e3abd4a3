#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every unit
# and integration test, and ends with one line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
build=${GRADSYNC_BUILD:-build}

./scripts/setup.sh || exit 1
./scripts/build.sh || exit 1

meson test -C "$build" --print-errorlogs "$@"
rc=$?

# One closing line over every test case: cmocka's own counts from each
# test program's output, or the program's result where it has none.
python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, re, sys
passed = failed = skipped = 0
for line in open(sys.argv[1]):
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
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $rc
