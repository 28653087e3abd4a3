#!/usr/bin/env python3
"""Fills a man page template from gradsyncd's own settings table.

Usage: mkman.py GRADSYNCD TEMPLATE OUTPUT VERSION CONFIG SOCKET

The template's line "@SETTINGS@" becomes one entry per setting, read from
`gradsyncd --help` (which the table prints), as flags in gradsyncd(8) and
as file keys in gradsync.conf(5) (the template's first line says which:
".\\" settings: flags" or ".\\" settings: keys"). @VERSION@, @CONFIG@ and
@SOCKET@ are replaced everywhere. The pages so never miss or misstate a
setting.
"""
import re
import subprocess
import sys


def roff(text):
    """Escapes text for a roff line: backslashes and hyphens."""
    return text.replace("\\", "\\e").replace("-", "\\-")


def settings(gradsyncd):
    """[(name, help, allowed, default, env)] in table order."""
    out = subprocess.run([gradsyncd, "--help"], check=True, capture_output=True,
                         text=True, env={"GRADSYNC_CONFIG": ""}).stdout
    pat = re.compile(r"^  --([a-z0-9-]+)=VALUE\n      (.*)\.\n      (.*); default (.*); "
                     r"environment (GRADSYNC_[A-Z0-9_]+)\.$", re.M)
    found = pat.findall(out)
    if not found:
        sys.exit("mkman.py: no settings in gradsyncd --help")
    return found


def entries(found, style):
    lines = []
    for name, text, allowed, default, env in found:
        if style == "keys" and name == "config":
            continue
        head = f"\\fB\\-\\-{roff(name)}\\fR=\\fIVALUE\\fR" if style == "flags" \
            else f"\\fB{roff(name)}\\fR = \\fIVALUE\\fR"
        lines += [".TP", head, roff(text[:1].upper() + text[1:]) + ".",
                  f"Allowed: {roff(allowed)}.",
                  f"Default: \\fB{roff(default) if default else '(empty)'}\\fR.",
                  f"Environment: \\fB{roff(env)}\\fR." if style == "flags"
                  else f"Flag: \\fB\\-\\-{roff(name)}\\fR; environment: \\fB{roff(env)}\\fR."]
    return lines


def main():
    gradsyncd, template, output, version, config, socket = sys.argv[1:7]
    src = open(template).read().splitlines()
    style = "flags" if "settings: flags" in src[0] else "keys"
    found = settings(gradsyncd)
    out = []
    for line in src:
        if line == "@SETTINGS@":
            out += entries(found, style)
        else:
            out.append(line.replace("@VERSION@", version).replace("@CONFIG@", roff(config))
                       .replace("@SOCKET@", roff(socket)))
    open(output, "w").write("\n".join(out) + "\n")


main()
