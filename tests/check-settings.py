#!/usr/bin/env python3
"""The README's table of gradsyncd's settings against the daemon's own.

The table in README.md ("| `--name` | default | meaning |") is written by
hand; the settings live in daemon/support/settings.c. This reads them from
the built daemon (`--help` gives each one's default, `--print-config` the
list of names, a second reading of the same table) and fails naming every
setting the README lacks, every README row that names no setting, and
every default that differs.

A README default matches when it is the daemon's text, or:
- the same number written with KiB, MiB or GiB (`64 GiB`);
- a word in parentheses (`(host name)`, `(none)`) for an empty default;
- SYSCONFDIR for meson's prefix/sysconfdir (the --config default).

    tests/check-settings.py GRADSYNCD README SYSCONFDIR   exit 0: agree; 1: where
"""
import os
import re
import subprocess
import sys

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
HELP_ENTRY = re.compile(r"^  --([\w-]+)=VALUE\n      .*\n      .*; default (.*?); environment GRADSYNC_\w+\.$",
                        re.M)
TABLE_HEAD = "| setting | default | meaning |"
README_ROW = re.compile(r"\| `--([\w-]+)` \| ([^|]*) \|")


def daemon_output(gradsyncd, *args):
    # No GRADSYNC_* from the caller's shell: --print-config would show them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
    return subprocess.run([gradsyncd, "--config=", *args], capture_output=True, text=True,
                          check=True, env=env).stdout


def daemon_defaults(gradsyncd):
    """{name: default} from --help, its names checked against --print-config's."""
    defaults = dict(HELP_ENTRY.findall(daemon_output(gradsyncd, "--help")))
    listed = [line.split()[0] for line in daemon_output(gradsyncd, "--print-config").splitlines()
              if line.strip()]
    if sorted(defaults) != sorted(listed):
        sys.exit(f"check-settings: --help gives {sorted(defaults)} but --print-config "
                 f"{sorted(listed)}: this script no longer reads --help right")
    return defaults


def readme_defaults(path):
    """{name: default cell} of the settings table (the lines from its head to
    the first that is not a row); a name twice is an error."""
    with open(path) as f:
        lines = f.read().splitlines()
    if TABLE_HEAD not in lines:
        sys.exit(f"check-settings: no line '{TABLE_HEAD}' in {path}")
    seen = {}
    for line in lines[lines.index(TABLE_HEAD) + 2:]:
        if not line.startswith("|"):
            break
        m = README_ROW.match(line)
        if m is None:
            sys.exit(f"check-settings: a row of the settings table names no setting: {line}")
        name, cell = m.groups()
        if name in seen:
            sys.exit(f"check-settings: {path} has two rows for --{name}")
        seen[name] = cell.strip()
    return seen


def same_default(readme, daemon, sysconfdir):
    text = readme.replace("`", "").replace("SYSCONFDIR", sysconfdir)
    if text == daemon:
        return True
    if daemon == "":
        return re.fullmatch(r"\([^()]+\)", text) is not None
    m = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", text)
    return m is not None and daemon.isdigit() and int(m.group(1)) * UNITS[m.group(2)] == int(daemon)


def main():
    gradsyncd, readme, sysconfdir = sys.argv[1:4]
    daemon = daemon_defaults(gradsyncd)
    table = readme_defaults(readme)
    problems = []
    for name in daemon:
        if name not in table:
            problems.append(f"--{name} (default '{daemon[name]}') has no row in the README's table")
    for name in table:
        if name not in daemon:
            problems.append(f"the README's table has a row for --{name}, which gradsyncd does not know")
    for name in daemon.keys() & table.keys():
        if not same_default(table[name], daemon[name], sysconfdir):
            problems.append(f"--{name}: the README says default '{table[name]}', gradsyncd '{daemon[name]}'")
    for line in problems:
        print(line)
    print(f"check-settings: {len(daemon)} settings, {len(table)} README rows, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
