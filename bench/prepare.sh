# Sourced by the benchmark scripts, from the source tree's root: installs
# what is missing (scripts/setup.sh) and builds (scripts/build.sh, in
# build/ or $GRADSYNC_BUILD), showing the build's output only when it
# fails. Sets $build.
build=${GRADSYNC_BUILD:-build}
./scripts/setup.sh
log=$(mktemp /tmp/gradsync-bench-build-XXXXXX.log)
if ! ./scripts/build.sh >"$log" 2>&1; then
  cat "$log"
  rm -f "$log"
  exit 1
fi
rm -f "$log"
