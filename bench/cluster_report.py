"""The targets between nodes, from one run of bench/cluster-report.sh.

  python3 bench/cluster_report.py OUT COMMAND SECONDS

Reads what the parts wrote under OUT (steps/summary.csv of
bench/cluster.sh, small-buckets/summary.csv of bench/small-buckets.sh,
eight-nodes/test.log of the test netcluster-eight-nodes, scale/summary.csv
and scale/model.txt of bench/scale.sh) and prints the table of targets,
each measured figure beside its baseline of the same run; writes
targets.csv, targets.txt, steps.svg (the step times, a bar per system) and
README.md to OUT, and prints the model's chart (bench/model.py).
"""
import csv
import os
import re
import subprocess
import sys
import time

STEP_TARGET = 1.9      # x faster than Gloo fp32 buckets, at 10 Gbit/s
LINK_TARGET = 0.85     # busbw over the shaped rate
BUCKET_TARGET = 1.5    # x one small Gloo all-reduce, at most
SYSTEMS = ("gradsync", "gloo-fp32", "gloo-fp16")


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def step_targets(out):
    """Per layout and rate: gradsync's step beside Gloo's, and its busbw."""
    table, bars = [], []
    by = {(r["layout"], r["rate"], r["system"]): r for r in rows(f"{out}/steps/summary.csv")
          if r.get("load", "none") == "none"}
    for (layout, rate, system), r in by.items():
        if system != "gradsync":
            continue
        fp32, fp16 = by[(layout, rate, "gloo-fp32")], by[(layout, rate, "gloo-fp16")]
        ratio = float(fp32["median_ms"]) / float(r["median_ms"])
        table.append((f"{layout} 2x1 step at {rate}, vs Gloo fp32 buckets",
                      f">= {STEP_TARGET}x faster" if rate == "10gbit" else "(shown)",
                      f"{ratio:.2f}x faster", f"gradsync {float(r['median_ms']):.1f} ms, "
                      f"Gloo fp32 {float(fp32['median_ms']):.1f} ms, "
                      f"fp16 {float(fp16['median_ms']):.1f} ms",
                      verdict(ratio >= STEP_TARGET) if rate == "10gbit" else ""))
        link = float(r["link_fraction"])
        table.append((f"{layout} link use at {rate} (busbw / rate)",
                      f">= {LINK_TARGET}" if rate == "10gbit" else "(shown)", f"{link:.2f}",
                      f"busbw {float(r['busbw_gbit']):.2f} Gbit/s; Gloo fp32 "
                      f"{float(fp32['link_fraction']):.2f}",
                      verdict(link >= LINK_TARGET) if rate == "10gbit" else ""))
        on, off = by.get((layout, rate, "overlap-on")), by.get((layout, rate, "overlap-off"))
        if on and off:
            gain = float(off["median_ms"]) / float(on["median_ms"])
            table.append((f"{layout} at {rate}, buckets overlapped vs one at a time",
                          "(shown)", f"{gain:.2f}x faster",
                          f"overlapped {float(on['median_ms']):.1f} ms, not "
                          f"{float(off['median_ms']):.1f} ms", ""))
        bars.append((f"{layout} {rate}", [float(by[(layout, rate, s)]["median_ms"])
                                          for s in SYSTEMS]))
    return table, bars


def small_targets(out):
    """gradsync's bucket of a few elements against the fastest Gloo."""
    rs = rows(f"{out}/small-buckets/summary.csv")
    gloo = {r["what"]: float(r["median_us"]) for r in rs if r["what"].endswith("both passes")}
    best_name = min(gloo, key=gloo.get)
    best = gloo[best_name]
    table = []
    for r in rs:
        what = r["what"]
        if not what.startswith("gradsync"):
            continue
        us = float(r["median_us"])
        table.append((f"{what}, 2 nodes, vs one small Gloo all-reduce",
                      f"<= {BUCKET_TARGET}x", f"{us / best:.2f}x",
                      f"gradsync {us:.0f} us, Gloo {best:.0f} us ({best_name.split(',')[0]}, "
                      f"the fastest of {len(gloo)})", verdict(us / best <= BUCKET_TARGET)))
    return table


def eight_targets(out):
    """The test's own lines: every element right, join and step time."""
    log = open(f"{out}/eight-nodes/test.log", errors="replace").read()
    table = []
    for m in re.finditer(r"^8 nodes .*threshold (\d+): (every element .*)\n"
                         r"join: all 8 trainers welcomed ([0-9.]+) s.*\n"
                         r"step: median per node ([0-9. ]+) ms", log, re.M):
        steps = [float(x) for x in m.group(4).split()]
        table.append((f"8-node step, small layout, threshold {m.group(1)}",
                      "every element right", m.group(2).replace("every element", "all"),
                      f"join {float(m.group(3)):.2f} s, step {min(steps):.1f}-{max(steps):.1f} "
                      f"ms (nodes share the cores)", "met"))
    if not table:
        table.append(("8-node step, small layout", "every element right", "no result",
                      "see eight-nodes/test.log", "NOT met"))
    return table


def scale_rows(out):
    """Join, step and per-bucket time by node count, beside all-ring."""
    s = {}
    for r in rows(f"{out}/scale/summary.csv"):
        s[(int(r["nodes"]), r["measure"])] = float(r["value"])
    table = []
    for n in sorted({k for k, _ in s if k}):
        def g(m):
            return s.get((n, m), float("nan"))
        table.append((f"{n} nodes (scale)", "(shown)",
                      f"join {g('join (last welcomed)'):.2f} s, step {g('auto step step'):.2f} ms",
                      f"tiny bucket {g('auto tiny per bucket'):.0f} us ({g('tiny ring / auto'):.1f}x "
                      f"faster than all-ring), medium {g('auto medium per bucket'):.0f} us "
                      f"({g('medium ring / auto'):.2f}x)", ""))
    return table


def verdict(ok):
    return "met" if ok else "NOT met"


def render(table):
    head = ("what", "target", "measured", "beside it, same run", "")
    widths = [max(len(r[i]) for r in table + [head]) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    return lines


def bar_svg(bars, path):
    """A group of bars per layout and rate: each system's median step."""
    colours = ("#1f77b4", "#d62728", "#ff7f0e")
    top = max(v for _, vs in bars for v in vs)
    w, h, left, base = 120 * len(bars) + 80, 320, 60, 260
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16" font-size="13">step time, 2 nodes x 1 trainer '
           '(median ms; lower is better)</text>']
    for i, (label, vs) in enumerate(bars):
        x0 = left + 120 * i
        for j, v in enumerate(vs):
            bh = 220 * v / top
            out.append(f'<rect x="{x0 + 30 * j}" y="{base - bh:.1f}" width="26" '
                       f'height="{bh:.1f}" fill="{colours[j]}"/>')
            out.append(f'<text x="{x0 + 30 * j + 13}" y="{base - bh - 3:.1f}" '
                       f'text-anchor="middle" font-size="9">{v:.0f}</text>')
        out.append(f'<text x="{x0 + 45}" y="{base + 14}" text-anchor="middle">{label}</text>')
    for j, s in enumerate(SYSTEMS):
        out.append(f'<rect x="{left + 110 * j}" y="{h - 24}" width="10" height="10" '
                   f'fill="{colours[j]}"/><text x="{left + 110 * j + 14}" y="{h - 15}">{s}</text>')
    out.append(f'<line x1="{left - 5}" y1="{base}" x2="{w - 10}" y2="{base}" stroke="black"/>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    out, command, seconds = sys.argv[1:4]
    steps, bars = step_targets(out)
    table = steps + small_targets(out) + eight_targets(out) + scale_rows(out)
    lines = render(table)
    with open(f"{out}/targets.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("what", "target", "measured", "baseline_same_run", "verdict"))
        w.writerows(table)
    with open(f"{out}/targets.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    bar_svg(bars, f"{out}/steps.svg")
    print("\n".join(lines))
    chart = subprocess.run([sys.executable, "bench/model.py", f"{out}/scale"],
                           capture_output=True, text=True, check=True).stdout
    print(chart)
    with open(f"{out}/README.md", "w") as f:
        f.write(f"# gradsync between nodes: the targets, one run\n\nWritten by `{command}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} "
                f"cores, {seconds} s in all). Each part's own results are in its folder: "
                "`steps/` (bench/cluster.sh), `small-buckets/`, `eight-nodes/` (the test's "
                "log), `scale/` (bench/scale.sh and bench/model.py: `model.svg`, "
                "`model.txt`). `steps.svg` draws the step times.\n\n```\n"
                + "\n".join(lines) + "\n```\n\nThe model's chart:\n\n```\n" + chart + "```\n")
    print(f"cluster-report: wrote {out}/targets.csv, targets.txt, steps.svg, README.md")


if __name__ == "__main__":
    main()
