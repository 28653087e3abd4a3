#!/usr/bin/env bash
# Runs test suites several times while every core is kept busy, to find the
# tests that depend on timing they do not control (a real node's cores run
# data loaders and other jobs, and CI's machine is loaded). Not run in CI:
# it takes a while.
#
#   stress-tests.sh [--runs N] [--suite S]... [--nice N] [--hogs N]
#                   [--limit SECONDS] [TEST...]
#       --runs N       runs of the chosen tests (default 3)
#       --suite S      a meson test suite, repeatable (default: integration
#                      and cluster); ignored when TESTs are named
#       --nice N       niceness of the CPU hogs (default 19; 0 competes on
#                      equal terms)
#       --hogs N       busy loops (default: one per core, nproc)
#       --limit S      the hogs end after S seconds whatever happens
#                      (default 14400); each also ends within a fraction
#                      of a second of this script, even one killed by
#                      SIGKILL
#       TEST...        meson test names instead of suites (e.g. failures)
#
# Builds build/ (or $GRADSYNC_BUILD) first. Prints, per test, how many runs
# passed, failed and were skipped, and the runs that failed, whose logs are
# left in build/meson-logs/stress-RUN.txt. Exit status: 0 when no run of
# any test failed, 1 otherwise, 2 for a usage error. The hogs are killed
# when it exits, however it exits.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${GRADSYNC_BUILD:-build}

usage() {
  sed -n '/^#   stress-tests.sh/,/^set /s/^# \{0,1\}//p' "$0"
  exit "${1:-2}"
}
fail() { echo "stress-tests: $*" >&2; exit 2; }
count() { [[ $2 =~ ^[0-9]+$ ]] || fail "$1 takes a number, not '$2'"; }

runs=3 nice=19 hogs=$(nproc) limit=14400
suites=() tests=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage 0 ;;
    --runs) count "$1" "${2-}"; runs=$2; shift 2 ;;
    --suite) [ -n "${2-}" ] || fail "--suite takes a suite"; suites+=("$2"); shift 2 ;;
    --nice) count "$1" "${2-}"; nice=$2; shift 2 ;;
    --hogs) count "$1" "${2-}"; hogs=$2; shift 2 ;;
    --limit) count "$1" "${2-}"; limit=$2; shift 2 ;;
    -*) echo "stress-tests: unknown option $1" >&2; usage ;;
    *) tests+=("$1"); shift ;;
  esac
done
[ "$runs" -gt 0 ] || fail "--runs must be at least 1"
[ ${#suites[@]} -gt 0 ] || suites=(integration cluster)

./scripts/build.sh >/dev/null || fail "the build failed (run ./scripts/build.sh)"

# The hogs: one busy loop per core, killed by the trap when the script
# exits; each also stops once this script is gone (it looks every 100,000
# turns) and, whatever happens, at the timeout. meson test runs in the
# background, so that a signal reaches the trap at once and stops it too.
hog_pids=() meson_pid=
stop_all() {
  local pid
  [ -z "$meson_pid" ] || kill "$meson_pid" 2>/dev/null
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${hog_pids[@]}" $meson_pid; do wait "$pid" 2>/dev/null; done
  hog_pids=() meson_pid=
}
trap stop_all EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < hogs; i++)); do
  timeout "$limit" nice -n "$nice" bash -c \
    'while kill -0 "$1" 2>/dev/null; do for ((i = 0; i < 100000; i++)); do :; done; done' \
    hog $$ &
  hog_pids+=($!)
done
echo "stress-tests: $hogs busy loops at nice $nice, $runs runs of" \
  "${tests[*]:-the suites ${suites[*]}}"

select=()
if [ ${#tests[@]} -gt 0 ]; then
  select=("${tests[@]}")
else
  for s in "${suites[@]}"; do select+=(--suite "$s"); done
fi
logs=()
for ((run = 1; run <= runs; run++)); do
  start=$SECONDS
  meson test -C "$build" --no-rebuild --logbase "stress-$run" "${select[@]}" \
    >"$build/meson-logs/stress-$run.out" 2>&1 &
  meson_pid=$!
  wait "$meson_pid"
  meson_pid=
  echo "run $run of $runs: $((SECONDS - start)) s, $(grep -cE '^ *[0-9]+/[0-9]+ .* (OK|EXPECTEDFAIL) ' \
    "$build/meson-logs/stress-$run.out") passed; load now $(cut -d' ' -f1-3 /proc/loadavg)"
  logs+=("$build/meson-logs/stress-$run.json")
done
stop_all

# The table, from meson's own record of each run.
python3 - "${logs[@]}" <<'PY'
import json, os, sys
rows = {}
for run, path in enumerate(sys.argv[1:], 1):
    if not os.path.exists(path):
        print(f"run {run}: no test log ({path})")
        continue
    for line in open(path):
        t = json.loads(line)
        row = rows.setdefault(t["name"], {"pass": 0, "fail": 0, "skip": 0, "runs": []})
        if t["result"] in ("OK", "EXPECTEDFAIL"):
            row["pass"] += 1
        elif t["result"] == "SKIP":
            row["skip"] += 1
        else:
            row["fail"] += 1
            row["runs"].append(f"{run} ({t['result'].lower()}, {t['duration']:.0f} s)")
width = max([len(n) for n in rows] + [4])
print(f"{'test':<{width}}  pass  fail  skip  failed runs")
for name, r in rows.items():
    print(f"{name:<{width}}  {r['pass']:>4}  {r['fail']:>4}  {r['skip']:>4}  {', '.join(r['runs'])}")
bad = sum(r["fail"] for r in rows.values())
missing = len(sys.argv) - 1 - sum(os.path.exists(p) for p in sys.argv[1:])
sys.exit(1 if bad or missing or not rows else 0)
PY
