"""The package's type hints hold: mypy finds nothing in python/gradsync
(with PyTorch's and NumPy's own annotations)."""
import os
import subprocess
import sys
import tempfile

from pylib import check, run


def test_mypy_finds_nothing():
    package = os.path.join(os.environ["GS_SOURCE_ROOT"], "python", "gradsync")
    with tempfile.TemporaryDirectory(prefix="gs-mypy-") as cache:
        r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache,
                            "--check-untyped-defs", "--disallow-incomplete-defs",
                            "--ignore-missing-imports", package],
                           capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"mypy:\n{r.stdout}{r.stderr}")


if __name__ == "__main__":
    run([test_mypy_finds_nothing])
