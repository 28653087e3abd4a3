#!/usr/bin/env python3
"""No wait in gradsyncd or libgradsync that is fast only on an idle CPU.

A thread that waits for another must block on something that wakes it (a
condition variable, an eventfd, a socket, a timer) after a short spin at
most. Two habits break that on a core a busy neighbour shares, so neither
may appear in the code (comments aside):

- yielding (sched_yield, pthread_yield, std::this_thread::yield): the
  scheduler hands the CPU to whatever else is runnable, the neighbour too,
  for its whole slice;
- a batch or idle policy (SCHED_BATCH, SCHED_IDLE): a woken thread then
  waits for the running one's slice to end instead of preempting it.

    tests/check-waits.py [SOURCE_ROOT]    exit 0: none; 1: where
"""
import os
import re
import sys

FOLDERS = ("daemon", "client", "common", "kernels", "proto")
BANNED = re.compile(r"\b(sched_yield|pthread_yield|this_thread\s*::\s*yield|SCHED_BATCH|SCHED_IDLE)\b")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def code_of(text):
    """The text with comments and string literals blanked (lines kept)."""
    text = STRING.sub('""', text)
    return COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found, files = [], 0
    for folder in FOLDERS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith((".c", ".cc", ".h", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = code_of(f.read()).split("\n")
                for n, line in enumerate(lines, 1):
                    m = BANNED.search(line)
                    if m:
                        found.append(f"{os.path.relpath(path, root)}:{n}: {m.group(1)}")
    if files < 50:
        print(f"check-waits: only {files} source files under {root}: wrong root?")
        return 1
    for f in found:
        print(f"check-waits: {f}: a wait that is fast only on an idle CPU")
    if found:
        return 1
    print(f"check-waits: {files} files, no yield and no batch or idle policy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
