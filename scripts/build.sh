#!/usr/bin/env bash
# Configures (once) and builds gradsync in build/ (or $GRADSYNC_BUILD).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GRADSYNC_BUILD:-build}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$@"
fi
meson compile -C "$build"
