#!/usr/bin/env bash
# Makes (once) and completes the Python environment of gradsync's Python
# tests, benchmark and example: a virtual environment at $GRADSYNC_VENV
# (default .venv in the source tree) with the versions in
# python/requirements-test.txt, from PyPI. PyTorch's wheel from PyPI is the
# CUDA build with its NVIDIA libraries (about 5 GiB installed; 80 s to
# download and install on the project's 2-core machine); a second run
# finds everything and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GRADSYNC_VENV:-.venv}
requirements=python/requirements-test.txt

if [ ! -x "$venv/bin/python" ]; then
  echo "python-env: creating $venv"
  python3 -m venv "$venv"
fi
# pip's own check is slow (it resolves the whole set): compare the pins
# with what is installed first.
if ! "$venv/bin/python" - "$requirements" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  start=$SECONDS
  echo "python-env: installing $(grep -v '^#' "$requirements" | tr '\n' ' ')"
  "$venv/bin/pip" install --quiet --progress-bar off -r "$requirements"
  echo "python-env: installed in $((SECONDS - start)) s"
fi
