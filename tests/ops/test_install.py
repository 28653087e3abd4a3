#!/usr/bin/env python3
"""meson install into a staging directory: the daemon, the tool, the
library with its header and pkg-config file, the units, the sysusers entry,
the example configuration and the man pages land where a distribution
expects them; the pieces agree with each other (ExecStart, the default
configuration path); a program builds against the installed library; and
systemd-analyze verify passes on the installed units, their man pages
included."""
import json
import os
import shutil
import subprocess
import tempfile

from opslib import BUILD, Skip, check, check_eq, run

STAGE = None


def options():
    out = subprocess.run(["meson", "introspect", BUILD, "--buildoptions"], capture_output=True,
                         text=True, check=True).stdout
    return {o["name"]: o["value"] for o in json.loads(out)}


def staged(path):
    return os.path.join(STAGE, path.lstrip("/"))


def install():
    global STAGE
    if STAGE:
        return
    if not shutil.which("meson"):
        raise Skip("meson is not on PATH")
    STAGE = tempfile.mkdtemp(prefix="gs-install-")
    r = subprocess.run(["meson", "install", "-C", BUILD, "--no-rebuild", "--quiet",
                        "--destdir", STAGE], capture_output=True, text=True, timeout=300)
    check_eq(r.returncode, 0, f"meson install: {r.stdout}{r.stderr}")


def expected():
    o = options()
    p = o["prefix"]

    def at(d, *rest):
        return os.path.join(d if os.path.isabs(d) else os.path.join(p, d), *rest)
    unitdir = o["systemdsystemunitdir"] or os.path.join(p, "lib/systemd/system")
    sysusersdir = o["sysusersdir"] or os.path.join(p, "lib/sysusers.d")
    return o, {
        "daemon": at(o["sbindir"], "gradsyncd"),
        "tool": at(o["bindir"], "gradsyncctl"),
        "library": at(o["libdir"], "libgradsync.so.0"),
        "dev link": at(o["libdir"], "libgradsync.so"),
        "header": at(o["includedir"], "gradsync.h"),
        "pkg-config": at(o["libdir"], "pkgconfig", "gradsync.pc"),
        "service": os.path.join(unitdir, "gradsyncd.service"),
        "socket": os.path.join(unitdir, "gradsyncd.socket"),
        "sysusers": os.path.join(sysusersdir, "gradsync.conf"),
        "config": at(o["sysconfdir"], "gradsync", "gradsyncd.conf"),
        "gradsyncd(8)": at(o["mandir"], "man8", "gradsyncd.8"),
        "gradsyncctl(1)": at(o["mandir"], "man1", "gradsyncctl.1"),
        "gradsync.conf(5)": at(o["mandir"], "man5", "gradsync.conf.5"),
    }


def test_everything_lands_where_expected():
    install()
    o, want = expected()
    for what, path in want.items():
        check(os.path.exists(staged(path)), f"{what} installed as {path}")
    for what in ["daemon", "tool"]:
        check(os.access(staged(want[what]), os.X_OK), f"{what} is executable")
    # Distributions' places, relative to the prefix.
    p = o["prefix"]
    check_eq(os.path.dirname(want["service"]), os.path.join(p, "lib/systemd/system")
             if not o["systemdsystemunitdir"] else o["systemdsystemunitdir"], "unit directory")
    check(want["gradsyncd(8)"].endswith("share/man/man8/gradsyncd.8"), "man8")
    # The unit starts the installed daemon, which reads the installed file.
    service = open(staged(want["service"])).read()
    check(f"ExecStart={want['daemon']}\n" in service, "ExecStart names the installed daemon")
    r = subprocess.run([staged(want["daemon"]), "--print-config"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin"})
    line = [l for l in r.stdout.splitlines() if l.startswith("config ")]
    check(line and line[0].split()[1] == want["config"],
          f"the daemon's default configuration file is the installed one: {line}")
    # The installed example, read as the configuration, changes nothing.
    r = subprocess.run([staged(want["daemon"]), f"--config={staged(want['config'])}",
                        "--print-config"], capture_output=True, text=True)
    check_eq(r.returncode, 0, f"the installed example is valid: {r.stderr}")


def test_program_builds_against_the_installed_library():
    install()
    o, want = expected()
    cc = shutil.which("cc")
    if not cc or not shutil.which("pkg-config"):
        raise Skip("no cc or pkg-config")
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(staged(want["pkg-config"])),
               PKG_CONFIG_SYSROOT_DIR=STAGE)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "gradsync"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    src = os.path.join(STAGE, "use.c")
    with open(src, "w") as f:
        f.write('#include <gradsync.h>\n#include <stdio.h>\nint main(void) {\n'
                '  gs_client *c;\n'
                '  int r = gs_control_connect("/nonexistent/gs.sock", 1000, &c);\n'
                '  char *text = NULL;\n'
                '  if (r == GS_OK) gs_metrics_get(c, 1000, &text);\n'
                '  printf("%s\\n", gs_err_name(r));\n  return r == GS_ECONNECT ? 0 : 1;\n}\n')
    exe = os.path.join(STAGE, "use")
    r = subprocess.run([cc, src, "-o", exe] + flags, capture_output=True, text=True)
    check_eq(r.returncode, 0, f"compile against the installed header: {r.stderr}")
    # A sanitized build's library needs the runtime first only in its own
    # programs; this plain one is built without it.
    r = subprocess.run([exe], capture_output=True, text=True,
                       env={"LD_LIBRARY_PATH": os.path.dirname(staged(want["library"])),
                            "ASAN_OPTIONS": "verify_asan_link_order=0"})
    check_eq((r.returncode, r.stdout.strip()), (0, "GS_ECONNECT"), "runs against the library")
    syms = subprocess.run(["nm", "-D", "--defined-only", staged(want["library"])],
                          capture_output=True, text=True).stdout
    for sym in ["gs_metrics_get", "gs_clients_get", "gs_trace_start", "gs_trace_stop",
                "gs_status_get"]:
        check(f" {sym}@@GRADSYNC_" in syms, f"{sym} is exported with a version")
    check(" gs_frame_" not in syms, "internal symbols stay hidden")


def test_installed_units_verify_with_their_man_pages():
    install()
    o, want = expected()
    if not shutil.which("systemd-analyze") or not shutil.which("man"):
        raise Skip("systemd-analyze or man is not installed")
    # verify checks ExecStart= and man: links; run it on the staged tree.
    mandir = os.path.dirname(os.path.dirname(staged(want["gradsyncd(8)"])))
    tmp = tempfile.mkdtemp(prefix="gs-units-")
    paths = []
    for name in ["service", "socket"]:
        text = open(staged(want[name])).read().replace(f"ExecStart={want['daemon']}",
                                                       f"ExecStart={staged(want['daemon'])}")
        paths.append(os.path.join(tmp, os.path.basename(want[name])))
        with open(paths[-1], "w") as f:
            f.write(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=yes"] + paths,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MANPATH=mandir))
    check_eq((r.returncode, r.stdout + r.stderr), (0, ""), "verify with man pages")
    shutil.rmtree(tmp)


def test_man_pages_render():
    install()
    o, want = expected()
    if not shutil.which("groff"):
        raise Skip("groff is not installed")
    for page in ["gradsyncd(8)", "gradsyncctl(1)", "gradsync.conf(5)"]:
        r = subprocess.run(["groff", "-man", "-ww", "-z", "-Tutf8", staged(want[page])],
                           capture_output=True, text=True)
        check_eq((r.returncode, r.stderr), (0, ""), f"groff on {page}")


def cleanup():
    if STAGE:
        shutil.rmtree(STAGE, ignore_errors=True)


if __name__ == "__main__":
    try:
        run([test_everything_lands_where_expected,
             test_program_builds_against_the_installed_library,
             test_installed_units_verify_with_their_man_pages, test_man_pages_render])
    finally:
        cleanup()
