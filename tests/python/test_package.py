"""The package installs with pip from the repository without a compiler
(pure Python), and the installed copy loads the library and works."""
import os
import shutil
import subprocess
import sys
import tempfile

from pylib import Daemon, check, check_eq, run


def test_pip_installs_the_package():
    with tempfile.TemporaryDirectory(prefix="gs-pip-") as tmp:
        # pip builds in the source folder: a copy keeps the tree clean. No
        # build isolation: the venv's setuptools builds the wheel, so the
        # test needs no network.
        source = shutil.copytree(os.path.join(os.environ["GS_SOURCE_ROOT"], "python"),
                                 os.path.join(tmp, "src"))
        target = os.path.join(tmp, "site")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                            "--no-build-isolation", "--no-index", "--target", target,
                            source], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "CC": "/bin/false", "CXX": "/bin/false"})
        check(r.returncode == 0, f"pip install failed:\n{r.stdout}\n{r.stderr}")
        for f in ("__init__.py", "torch.py", "py.typed"):
            check(os.path.exists(os.path.join(target, "gradsync", f)), f"{f} not installed")
        d = Daemon([])
        try:
            code = ("import gradsync, sys; "
                    "c = gradsync.Client(sys.argv[1]); print(gradsync.__file__); "
                    "print(c.info.world_size)")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = target
            r = subprocess.run([sys.executable, "-c", code, d.socket], capture_output=True,
                               text=True, timeout=60, env=env)
            check(r.returncode == 0, f"installed package failed:\n{r.stderr}")
            lines = r.stdout.split()
            check(lines[0].startswith(target), f"imported from {lines[0]}, not the install")
            check_eq(lines[1], "1", "world size through the installed package")
        finally:
            d.cleanup()


if __name__ == "__main__":
    run([test_pip_installs_the_package])
