#!/usr/bin/env bash
# Runs one Python test file in the virtual environment that
# scripts/python-env.sh makes. Without one the test is skipped (exit 77),
# unless GRADSYNC_REQUIRE_VENV=1, when that is a failure.
venv=${GRADSYNC_VENV:-$GS_SOURCE_ROOT/.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "no Python environment at $venv: run scripts/python-env.sh"
  [ "${GRADSYNC_REQUIRE_VENV:-0}" = 1 ] && exit 1
  exit 77
fi
exec "$venv/bin/python" "$@"
