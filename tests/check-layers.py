#!/usr/bin/env python3
"""The daemon's layers, checked over its quoted includes.

A file may include headers of its own layer or of a layer below, never
above. The layers, lowest first, are the folders of daemon/ (README,
"The code"). Among the daemon's modules (a module is a .c and the .h of
the same name) the largest include circle may hold at most MAX_CIRCLE
modules, all of the engine.

    tests/check-layers.py [SOURCE_ROOT]    exit 0: layered; 1: why not
"""
import os
import re
import sys

# Lowest first. A path's layer is that of the longest prefix it starts with.
LAYERS = [
    ("proto/", 0), ("common/", 0), ("kernels/", 0),
    ("daemon/support/", 1),
    ("daemon/serve/", 2),
    ("daemon/backend/", 3),
    ("daemon/engine/", 4),
    ("daemon/cluster/", 5),
    ("daemon/jobs/", 6),
    ("daemon/control/", 7),
    ("daemon/", 8),  # main.c and daemon.c: the wiring, which sees every layer
]
LAYER_NAMES = {0: "proto/common/kernels", 1: "support", 2: "serve", 3: "backend",
               4: "engine", 5: "cluster", 6: "jobs", 7: "control", 8: "daemon (top)"}
# Layer-0 folders searched for a bare "name.h"; generated headers too.
BARE_DIRS = ["common", "proto", "kernels"]
GENERATED = {"gradsync.pb-c.h": "proto/gradsync.pb-c.h"}
# Headers outside the daemon the daemon may not include at all.
FORBIDDEN = {
    "gradsync.h": "the client library's public API header",
}
MAX_CIRCLE = 3
CIRCLE_LAYER = "daemon/engine/"
SOURCE_SUFFIXES = (".c", ".h", ".cc", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    best = None
    for prefix, rank in LAYERS:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    return best[1] if best else None


def resolve(root, src, name):
    """The repository path a quoted include of src names, or None."""
    here = os.path.dirname(src)
    candidates = [os.path.join(here, name), os.path.join("daemon", name)]
    candidates += [os.path.join(d, name) for d in BARE_DIRS]
    for c in candidates:
        if os.path.isfile(os.path.join(root, c)):
            return os.path.normpath(c)
    return GENERATED.get(name)


def daemon_sources(root):
    for dirpath, _, files in os.walk(os.path.join(root, "daemon")):
        for f in sorted(files):
            if f.endswith(SOURCE_SUFFIXES):
                yield os.path.relpath(os.path.join(dirpath, f), root)


def module_of(path):
    return os.path.splitext(path)[0]


def largest_circle(edges):
    """The largest strongly connected set of modules (Tarjan's algorithm)."""
    index, low, on_stack, stack, best = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > len(best):
                best[:] = component

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(best)


def check(root):
    problems = []
    edges = {}
    for src in daemon_sources(root):
        with open(os.path.join(root, src), encoding="utf-8") as f:
            text = f.read()
        own = layer_of(src)
        for name in INCLUDE.findall(text):
            if os.path.basename(name) in FORBIDDEN:
                problems.append(f'{src}: includes "{name}", {FORBIDDEN[os.path.basename(name)]}')
                continue
            target = resolve(root, src, name)
            if target is None:
                problems.append(f'{src}: includes "{name}", which is no file of the tree')
                continue
            theirs = layer_of(target)
            if theirs is None:
                problems.append(f'{src}: includes "{name}" ({target}), outside every layer')
                continue
            if theirs > own:
                problems.append(f'{src} ({LAYER_NAMES[own]}) includes "{name}" '
                                f'({LAYER_NAMES[theirs]}), a layer above its own')
            if target.startswith("daemon/") and module_of(target) != module_of(src):
                edges.setdefault(module_of(src), set()).add(module_of(target))
    circle = largest_circle(edges)
    if len(circle) > 1:
        where = ", ".join(m[len("daemon/"):] for m in circle)
        if len(circle) > MAX_CIRCLE:
            problems.append(f"the largest include circle holds {len(circle)} modules "
                            f"(at most {MAX_CIRCLE} allowed): {where}")
        elif not all(m.startswith(CIRCLE_LAYER) for m in circle):
            problems.append(f"an include circle leaves {CIRCLE_LAYER}: {where}")
    return problems, circle


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems, circle = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} problem(s)")
        return 1
    where = ", ".join(m[len("daemon/"):] for m in circle) if len(circle) > 1 else "none"
    print(f"check-layers: every include points down; largest circle: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
