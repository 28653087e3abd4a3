"""The Python binding's ctypes structs have the C compiler's layout (size
and every field's offset, from abi-dump), the enum values and numeric
macros it copies are the C compiler's (abi-dump constants), and every
function of libgradsync exports has a signature in the binding."""
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


def header_enumerators(enum):
    """The names of enum ENUM's members, from gradsync.h's text."""
    with open(os.environ["GS_GRADSYNC_H"]) as f:
        m = re.search(r"enum %s \{([^}]*)\}" % enum, f.read())
    check(m is not None, f"enum {enum} in gradsync.h")
    return set(re.findall(r"\b(GS_\w+)\s*=", m.group(1)))


def python_constants():
    """{C name: value} of every number _lib.py copies from gradsync.h."""
    copied = {"GS_" + name.upper(): value for name, value in _lib.DTYPES.items()}
    copied.update({"GS_WIRE_DTYPE_" + name.upper(): value
                   for value, name in _lib.WIRE_DTYPES.items()})
    copied.update({"GS_OP_" + name.upper(): value for value, name in _lib.REDUCE_OPS.items()})
    return copied


def test_constants_match_c():
    c = json.loads(subprocess.run([os.environ["GS_ABI_DUMP"], "constants"],
                                  capture_output=True, text=True, check=True).stdout)
    copied = python_constants()
    # Every member of the three enums, as the header has them, is copied
    # and dumped: one added in C cannot go unnoticed here.
    members = set()
    for enum in ["gs_dtype", "gs_wire_dtype", "gs_reduce_op"]:
        members |= header_enumerators(enum)
    check_eq(sorted(copied), sorted(members), "enum members in _lib.py")
    check(members <= set(c), f"abi-dump constants lacks {sorted(members - set(c))}")
    singles = {"GS_FLOAT32": _lib.FLOAT32, "GS_FROM_ENV": _lib.FROM_ENV,
               "GS_FROM_ENV_U64": _lib.FROM_ENV_U64,
               "GS_LAUNCH_SOURCE_MAX": _lib._SOURCE._length_}
    for name, value in list(copied.items()) + list(singles.items()):
        check_eq(value, c[name], f"_lib.py's copy of {name}")


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
    run([test_struct_layouts_match_c, test_constants_match_c,
         test_every_exported_function_is_bound])
