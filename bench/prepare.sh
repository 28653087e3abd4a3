# Sourced by the benchmark scripts, from the source tree's root: installs
# what is missing (scripts/setup.sh) and builds (scripts/build.sh, in
# build/ or $GRADSYNC_BUILD), showing the build's output only when it
# fails. Sets $build; gives read_daemon_list and daemon_system (below).
build=${GRADSYNC_BUILD:-build}
./scripts/setup.sh
log=$(mktemp /tmp/gradsync-bench-build-XXXXXX.log)
if ! ./scripts/build.sh >"$log" 2>&1; then
  cat "$log"
  rm -f "$log"
  exit 1
fi
rm -f "$log"

# --gradsyncd NAME=PATH,... of cluster.sh and small-buckets.sh ($1; empty:
# this tree's build, named plainly) into daemon_list, each pair checked.
read_daemon_list() {
  local d
  IFS=, read -ra daemon_list <<<"${1:-=$build/daemon/gradsyncd}"
  for d in "${daemon_list[@]}"; do
    [[ ${d%%=*} =~ ^[a-z0-9-]*$ && -x ${d#*=} ]] || {
      echo "$(basename "$0"): --gradsyncd wants NAME=PATH (a-z 0-9 -, an executable): '$d'" >&2
      exit 2
    }
  done
}

# The system a NAME=PATH pair ($1) is in the tables: gradsync-NAME, or
# gradsync for the plain build.
daemon_system() {
  local n=${1%%=*}
  echo "gradsync${n:+-$n}"
}
