"""The Python binding's ctypes structs have the C compiler's layout (size
and every field's offset, from abi-dump), and every function of
libgradsync exports has a signature in the binding."""
import ctypes
import json
import os
import re
import subprocess

from gradsync import _lib
from pylib import check, check_eq, run


def test_struct_layouts_match_c():
    c = json.loads(subprocess.run([os.environ["GS_ABI_DUMP"]], capture_output=True,
                                  text=True, check=True).stdout)
    check_eq(sorted(c), sorted(_lib.STRUCTS), "structs mirrored")
    for name, cls in _lib.STRUCTS.items():
        check_eq(ctypes.sizeof(cls), c[name]["size"], f"sizeof(struct {name})")
        got = {f: getattr(cls, f).offset for f, _ in cls._fields_}
        check_eq(got, c[name]["fields"], f"fields of struct {name}")


def test_every_exported_function_is_bound():
    # What the library exports (its map exports gs_* by pattern), each at
    # its default version, which ctypes binds to: GRADSYNC_0, or the node
    # of the release that added it (or grew the struct it fills).
    out = subprocess.run(["nm", "-D", "--defined-only", os.environ["GRADSYNC_LIBRARY"]],
                         capture_output=True, text=True, check=True).stdout
    exported = set(re.findall(r" T (gs_\w+)@@GRADSYNC_[0-9.]+$", out, re.M))
    check_eq(exported, set(_lib._SIGNATURES), "functions with a Python signature")
    lib = _lib.lib()
    for name in exported:
        check(getattr(lib, name).argtypes is not None, f"{name} has no argtypes")


if __name__ == "__main__":
    run([test_struct_layouts_match_c, test_every_exported_function_is_bound])
