"""Facts written down once in C and copied elsewhere, checked against their
one source, so that a copy that drifts fails the suite:

- the error codes: GS_ERRNO_MAP in proto/client_protocol.h, against
  python/gradsync/errors.py and the names and texts the library gives;
- the version: meson's project version, against gradsync.__version__ (which
  pyproject.toml reads) and the loaded library's gs_version();
- the default socket: GS_DEFAULT_SOCKET in proto/client_protocol.h (which
  meson passes to the systemd units and man pages), against every socket
  path under /run that the README, python/ and the man pages' templates
  write out.

Needs no NumPy: runs on the system's python3 (GS_SOURCE_ROOT, GRADSYNC_LIBRARY
and GS_PROJECT_VERSION come from meson)."""
import glob
import os
import re
import sys

ROOT = os.environ["GS_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "tests", "ops"))
sys.path.insert(0, os.path.join(ROOT, "python"))
from opslib import check, check_eq, run  # noqa: E402

import gradsync  # noqa: E402
from gradsync import _lib, errors  # noqa: E402


def client_protocol():
    with open(os.path.join(ROOT, "proto", "client_protocol.h")) as f:
        return f.read()


def c_error_map():
    """{name: (value, description)} of GS_ERRNO_MAP."""
    found = re.findall(r'X\((\w+), (-?\d+), "([^"]*)"\)', client_protocol())
    check(len(found) > 10, "GS_ERRNO_MAP found in client_protocol.h")
    return {name: (int(value), desc) for name, value, desc in found}


def test_python_error_codes_are_the_c_map():
    c = {name: value for name, (value, _) in c_error_map().items()}
    py = {name: value for name, value in vars(errors).items()
          if re.fullmatch(r"OK|E[A-Z]+", name) and isinstance(value, int)}
    check_eq(py, c, "errors.py's codes against GS_ERRNO_MAP")
    for code in errors._BY_CODE:
        check(code in c.values(), f"errors.py maps code {code}, which C does not have")


def test_library_names_and_texts_are_the_c_map():
    lib = _lib.lib()
    for name, (value, desc) in c_error_map().items():
        check_eq(_lib.text(lib.gs_err_name(value)), "GS_" + name, f"gs_err_name({value})")
        check_eq(_lib.text(lib.gs_strerror(value)), desc, f"gs_strerror({value})")
        check_eq(errors.strerror(value), desc, f"gradsync.errors.strerror({value})")


def test_versions_are_meson_s():
    version = os.environ["GS_PROJECT_VERSION"]
    check_eq(gradsync.__version__, version, "gradsync.__version__")
    major, minor, patch = (int(p) for p in version.split("."))
    check_eq(_lib.lib().gs_version(), (major << 16) | (minor << 8) | patch, "gs_version()")
    with open(os.path.join(ROOT, "python", "pyproject.toml")) as f:
        toml = f.read()
    check('dynamic = ["version"]' in toml and 'attr = "gradsync.__version__"' in toml,
          "pyproject.toml takes its version from gradsync.__version__")


def test_default_socket_is_named_alike():
    m = re.search(r'#define GS_DEFAULT_SOCKET "([^"]+)"', client_protocol())
    check(m is not None, "GS_DEFAULT_SOCKET in client_protocol.h")
    files = [os.path.join(ROOT, "README.md")]
    files += glob.glob(os.path.join(ROOT, "man", "*.in"))
    files += glob.glob(os.path.join(ROOT, "python", "**", "*.py"), recursive=True)
    seen = 0
    for path in files:
        with open(path) as f:
            # roff escapes hyphens; a path may end a sentence.
            text = f.read().replace("\\-", "-")
        for path_named in re.findall(r"/run/[\w/.-]+\.sock", text):
            check_eq(path_named, m.group(1), f"the default socket in {path}")
            seen += 1
    check(seen > 0, "the default socket is named somewhere outside C")


if __name__ == "__main__":
    run([test_python_error_codes_are_the_c_map, test_library_names_and_texts_are_the_c_map,
         test_versions_are_meson_s, test_default_socket_is_named_alike])
