#!/usr/bin/env python3
"""gradsyncd's settings from flags, GRADSYNC_* variables and the
configuration file: precedence, --print-config's sources, every invalid
value refused from each source with the setting's name and range, the
file's syntax errors, and the installed example and man pages documenting
every setting."""
import os
import re
import shutil
import subprocess
import tempfile

from opslib import (BUILD, DAEMON, Daemon, Skip, Trainer, check, check_eq, daemon_env, run)

# The allowed ranges as the documentation states them, written here rather
# than read from gradsyncd, with values outside them.
RANGES = {
    "config": ("a text of 0 to 255 bytes", ["/" + "c" * 300]),
    "socket": ("a text of 1 to 107 bytes", ["", "/tmp/" + "s" * 110]),
    "backend": ("one of auto host cuda", ["gpu"]),
    "log-level": ("one of error warning info debug", ["verbose", "7"]),
    "max-frame": ("an integer in [4096, 1073741824]", ["4095"]),
    "max-tensors": ("an integer in [1, 16777216]", ["0", "16777217"]),
    "max-bytes": ("an integer in [4, 70368744177664]", ["3", "70368744177665"]),
    "allow-hugetlb": ("one of no yes", ["true", "1", ""]),
    "cluster-secret-file": ("a text of 0 to 255 bytes", ["/" + "k" * 300]),
    "join-timeout": ("an integer in [1, 86400]", ["0", "86401"]),
    "peer-timeout": ("an integer in [1, 86400]", ["0", "86401"]),
    "auth-timeout": ("an integer in [1, 300]", ["0", "301"]),
    "step-timeout": ("an integer in [1, 86400]", ["0", "86401"]),
    "stall-warning": ("an integer in [1, 86400]", ["0", "86401"]),
    "group": ("a text of 0 to 63 bytes", ["g" * 64]),
    "allow-uids": ("a text of 0 to 255 bytes", ["1," * 128]),
    "max-clients": ("an integer in [1, 65536]", ["0", "65537"]),
    "register-timeout": ("an integer in [1, 86400]", ["0", "86401"]),
    "max-queued-bytes": ("an integer in [1048576, 1073741824]", ["1048575", "1073741825"]),
    "node-address": ("a text of 0 to 255 bytes", ["a" * 256]),
    "node-port": ("an integer in [0, 65535]", ["65536", "-1", "port"]),
    # Numbers are decimal digits only: no base prefix, leading zero, sign
    # or space (issue 23), and never wrap.
    "max-jobs": ("an integer in [1, 1024]",
                 ["0", "1025", "0x10", "010", "+5", " 5", "5 ", "18446744073709551617"]),
    "max-trainers": ("an integer in [1, 4096]", ["0", "4097"]),
    "max-jobs-per-user": ("an integer in [0, 1024]", ["1025", "-1"]),
    "max-trainers-per-user": ("an integer in [0, 4096]", ["4097", "two"]),
    "max-nodes": ("an integer in [1, 1024]", ["0", "1025"]),
    "max-fusion-buffer": ("an integer in [1024, 1073741824]", ["1023", "1073741825"]),
    "max-fusion-memory": ("an integer in [1048576, 70368744177664]", ["1048575", "70368744177665"]),
    "job-linger": ("an integer in [0, 86400]", ["86401", "-1"]),
    "gpus": ("a text of 0 to 255 bytes", ["0" * 256]),
}

def help_settings():
    """(name, range text, default) of every setting gradsyncd --help lists."""
    out = subprocess.run([DAEMON, "--help"], capture_output=True, text=True,
                         env=daemon_env({"GRADSYNC_CONFIG": ""}), check=True).stdout
    return re.findall(r"^  --([a-z0-9-]+)=VALUE\n      .*\n      (.*); default (.*); "
                      r"environment GRADSYNC_[A-Z0-9_]+\.$", out, re.M)


def derived_bad(rng):
    """Out-of-range values for a setting this test does not know yet."""
    m = re.match(r"an integer in \[(\d+), (\d+)\]", rng)
    if m:
        return [str(int(m.group(2)) + 1)] + ([str(int(m.group(1)) - 1)] if int(m.group(1)) else [])
    m = re.match(r"a text of (\d+) to (\d+) bytes", rng)
    if m:
        return ["x" * (int(m.group(2)) + 1)]
    if rng.startswith("one of"):
        return ["no-such-choice"]
    return []


def gsd(args=(), env=None, config=""):
    argv = [DAEMON] + ([f"--config={config}"] if config is not None else []) + list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env=daemon_env(env))


def print_config(args=(), env=None, config=""):
    r = gsd(list(args) + ["--print-config"], env, config)
    check_eq(r.returncode, 0, "--print-config exit status (stderr: %s)" % r.stderr)
    rows = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^(\S+)\s+(.*?)\s*# (.*)$", line)
        check(m, f"--print-config line '{line}' is 'name value # source'")
        rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def env_name(name):
    return "GRADSYNC_" + name.upper().replace("-", "_")


# ---- tests -----------------------------------------------------------------------

def test_precedence_and_sources():
    d = tempfile.mkdtemp(prefix="gs-conf-")
    conf = write(os.path.join(d, "gradsyncd.conf"),
                 "# a comment\n; another\n\nmax-tensors = 300\nstep-timeout=100\n"
                 "   log-level   =   warning   \ngroup = \"gs ops: quoted\"\n")
    rows = print_config(["--log-level=error"], {"GRADSYNC_STEP_TIMEOUT": "200"}, config=conf)
    check_eq(rows["max-tensors"], ("300", f"file {conf}:4"), "max-tensors from the file")
    check_eq(rows["step-timeout"], ("200", "environment"), "the environment beats the file")
    check_eq(rows["log-level"], ("error", "command line"), "a flag beats the file")
    check_eq(rows["group"], ("gs ops: quoted", f"file {conf}:7"), "a quoted value")
    check_eq(rows["max-clients"], ("256", "default"), "max-clients untouched")
    check_eq(rows["config"], (conf, "command line"), "the file's own source")
    # GRADSYNC_CONFIG names the file; --config beats it.
    other = write(os.path.join(d, "other.conf"), "max-tensors = 500\n")
    rows = print_config(env={"GRADSYNC_CONFIG": other}, config=None)
    check_eq(rows["max-tensors"], ("500", f"file {other}:1"), "GRADSYNC_CONFIG's file")
    check_eq(rows["config"], (other, "environment"), "GRADSYNC_CONFIG's source")
    rows = print_config(env={"GRADSYNC_CONFIG": other}, config=conf)
    check_eq(rows["max-tensors"], ("300", f"file {conf}:4"), "--config beats GRADSYNC_CONFIG")
    # Every setting --help lists is shown, from its default without a file.
    rows = print_config()
    for name, _, default in help_settings():
        check(name in rows, f"--print-config shows {name}")
        if name != "config":
            check_eq(rows[name][1], "default", f"{name}'s source without a file")
    shutil.rmtree(d)


def test_default_file_may_be_absent():
    rows = print_config(config=None)
    path, source = rows["config"]
    check(path.endswith("/gradsync/gradsyncd.conf"), f"default config path {path}")
    check_eq(source, "default" if os.path.exists(path) else "default, absent",
             "the default file's source")


def test_daemon_runs_with_the_file():
    d = tempfile.mkdtemp(prefix="gs-conf-")
    conf = write(os.path.join(d, "gradsyncd.conf"), "max-tensors = 2\nlog-level = debug\n")
    g = Daemon(config=conf, tmp=d)
    try:
        # A trainer of three tensors meets the file's limit of two...
        t = Trainer(g.socket, 0, [10, 20, 30], log_dir=d)
        check(t.proc.wait(30) != 0, "a trainer of 3 tensors is refused")
        check("more than 2 tensors (--max-tensors)" in t.text(),
              f"max-tensors from the file: {t.text()}")
        # ...and its leaving is logged at the file's level.
        g.stop()
        check(" debug: " in g.log_text(), "log-level from the file: debug lines in the log")
    finally:
        g.cleanup()


def test_every_invalid_value_refused_from_every_source():
    d = tempfile.mkdtemp(prefix="gs-conf-")
    listed = help_settings()
    known = dict(RANGES)
    check(len(listed) >= len(known) - 1, "gradsyncd --help lists the settings")
    cases = 0
    for name, rng, _ in listed:
        if name in known:
            want, bad = known[name]
            check_eq(rng, want, f"--help's range of {name}")
        else:
            want, bad = rng, derived_bad(rng)
            print(f"note: {name} is not in this test's table; checking {bad} against '{rng}'")
        for value in bad:
            sources = [("command line", [f"--{name}={value}"], None, ""),
                       ("environment", [], {env_name(name): value}, "")]
            if name != "config":
                conf = write(os.path.join(d, "bad.conf"), f"# line 1\n{name} = \"{value}\"\n")
                sources.append((f"file {conf}:2", [], None, conf))
            for source, args, env, config in sources:
                r = gsd(args, env, config=config if name != "config" else None)
                what = f"{name}={value!r} from {source}"
                check_eq(r.returncode, 2, f"exit status for {what} (stderr: {r.stderr})")
                check(f"--{name}" in r.stderr, f"the message names --{name} for {what}: {r.stderr}")
                check(want in r.stderr, f"the message gives the range '{want}' for {what}: {r.stderr}")
                check(source in r.stderr, f"the message says '{source}' for {what}: {r.stderr}")
                cases += 1
    check(cases >= 100, f"{cases} invalid values tried")
    shutil.rmtree(d)


def test_node_address_is_a_host():
    """--node-address is a host alone, as a trainer's coordinator must be:
    what the other nodes are told to reach this one by."""
    for value, why in [("node0:29500", "it has a port (':29500')"),
                       ("http://node0/", "it is a URL"),
                       ("[::1]:5", "it has a port (':5')")]:
        r = gsd([f"--node-address={value}"])
        check_eq(r.returncode, 2, f"exit status for --node-address={value}")
        want = f"invalid value '{value}' for --node-address (GRADSYNC_NODE_ADDRESS): {why}"
        check(want in r.stderr, f"'{want}' in: {r.stderr}")
    for value in ["10.0.0.1", "node-0.cluster", "[::1]", "::1", "eth0"]:
        rows = print_config([f"--node-address={value}"])
        check_eq(rows["node-address"][0], value, f"--node-address={value} is taken")


def test_file_errors_name_file_and_line():
    d = tempfile.mkdtemp(prefix="gs-conf-")
    cases = [
        ("max-tensors = 2\nno-such-setting = 1\n", ":2: unknown setting 'no-such-setting'"),
        ("max-tensors 2\n", ":1: 'max-tensors 2' is not 'key = value'"),
        ("log-level = info\n\nlog-level = debug\n", ":3: 'log-level' is already set on line 1"),
        ("group = \"gradsync\n", ":1: the value of 'group' has an opening quote"),
        ("config = /etc/other.conf\n", ":1: 'config' names the file to read"),
        ("Max-Tensors = 2\n", ":1: 'Max-Tensors' is not a setting's name"),
        ("log-level = info # quieter\n", "invalid value 'info # quieter' for --log-level"),
    ]
    for text, want in cases:
        conf = write(os.path.join(d, "g.conf"), text)
        r = gsd(config=conf)
        check_eq(r.returncode, 2, f"exit status for {text!r}")
        check(want in r.stderr and conf in r.stderr, f"'{want}' with the path for {text!r}: {r.stderr}")
    missing = os.path.join(d, "missing.conf")
    for args, env, config in [([], None, missing), ([], {"GRADSYNC_CONFIG": missing}, None)]:
        r = gsd(args, env, config=config)
        check_eq(r.returncode, 2, "a named file that is missing")
        check(missing in r.stderr and "No such file" in r.stderr, r.stderr)
    # Printing options work whatever the file holds.
    bad = write(os.path.join(d, "bad.conf"), "garbage\n")
    for opt in ["--help", "--version", "--print-example-config"]:
        check_eq(gsd([opt], config=bad).returncode, 0, f"{opt} with a broken file")
    shutil.rmtree(d)


def example_path():
    return os.path.join(BUILD, "systemd", "gradsyncd.conf")


def test_example_documents_every_setting():
    text = open(example_path()).read()
    for name, rng, default in help_settings():
        if name == "config":
            check(not re.search(r"^#?config\s*=", text, re.M), "config is not a file key")
            continue
        m = re.search(rf"((?:^# .*\n)+)^#{re.escape(name)} = (.*)$", text, re.M)
        check(m, f"the example has '#{name} = ...' after a comment")
        check_eq(m.group(2), default, f"the example's default of {name}")
        comment = " ".join(l[2:] for l in m.group(1).splitlines())
        check(rng in comment and env_name(name) in comment,
              f"the comment of {name} gives its range and variable: {comment}")
    # As installed it changes nothing...
    rows = print_config(config=example_path())
    check(all(src == "default" for key, (_, src) in rows.items() if key != "config"),
          "the example (all commented) leaves every default")
    # ...and uncommented, every line is valid and read.
    d = tempfile.mkdtemp(prefix="gs-conf-")
    on = write(os.path.join(d, "on.conf"), re.sub(r"^#([a-z])", r"\1", text, flags=re.M))
    rows = print_config(config=on)
    check(all(src.startswith(f"file {on}:") for key, (_, src) in rows.items() if key != "config"),
          "every uncommented example line is read")
    shutil.rmtree(d)


def test_man_pages_document_every_setting():
    pages = {p: open(os.path.join(BUILD, "man", p)).read()
             for p in ["gradsyncd.8", "gradsync.conf.5", "gradsyncctl.1"]}
    for name, rng, default in help_settings():
        roff = name.replace("-", "\\-")
        check(f"\\fB\\-\\-{roff}\\fR" in pages["gradsyncd.8"], f"gradsyncd(8) lists --{name}")
        if name != "config":
            check(f"\\fB{roff}\\fR = " in pages["gradsync.conf.5"], f"gradsync.conf(5) lists {name}")
    if not shutil.which("groff"):
        raise Skip("groff is not installed: the pages were not rendered")
    for page, text in pages.items():
        r = subprocess.run(["groff", "-man", "-ww", "-z", "-Tutf8"], input=text,
                           capture_output=True, text=True)
        check_eq((r.returncode, r.stderr), (0, ""), f"groff warnings for {page}")


if __name__ == "__main__":
    run([test_precedence_and_sources, test_default_file_may_be_absent,
         test_daemon_runs_with_the_file, test_every_invalid_value_refused_from_every_source,
         test_node_address_is_a_host, test_file_errors_name_file_and_line,
         test_example_documents_every_setting,
         test_man_pages_document_every_setting])
