#!/usr/bin/env python3
"""The table of bench/small-buckets.sh from its CSV of every call and step.

  small_buckets_table.py ALL_CSV SUMMARY_CSV BUCKETS WIRE

Per call (Gloo) or step (gradsync) the slower node's time, then the median
(and p10, p90, mean) over calls or steps. gradsync's per-bucket cost is its
step time over BUCKETS, itself a mean over the step's buckets: the mean of
Gloo's calls is the figure to set beside it when calls have a long tail.
gradsync's ratios are to the Gloo baseline of WIRE, both passes pooled,
median to median: plain, and under SCHED_BATCH as gradsyncd's worker ran
until issue 25.
Prints the table; writes SUMMARY_CSV.
"""
import csv
import statistics
import sys
from collections import defaultdict

from quantile import quantile


def slower_node(rows):
    """{(system, layout, pass): [max over ranks per iteration]}"""
    per = defaultdict(dict)
    for r in rows:
        key = (r["system"], r["layout"], r["pass"])
        it = int(r["iteration"])
        per[key][it] = max(per[key].get(it, 0.0), float(r["us"]))
    return {k: [v[i] for i in sorted(v)] for k, v in per.items()}


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    all_csv, summary_csv, buckets, wire = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with open(all_csv) as f:
        times = slower_node(list(csv.DictReader(f)))
    lines = []  # what, n, median, p10, p90 (us)
    for (system, layout, pass_), xs in sorted(times.items()):
        scale = buckets if layout == "many" else 1
        what = {
            "many": f"{system}, per bucket ({buckets} a step)",
            "one": f"{system}, one bucket a step",
        }.get(layout, f"{system}, pass {pass_}")
        lines.append((what, len(xs), *(quantile(xs, q) / scale for q in (0.5, 0.1, 0.9)),
                      statistics.mean(xs) / scale))
    pooled = {}
    for system in ("gloo-fp32", "gloo-fp16", "gloo-fp32-batch", "gloo-fp16-batch"):
        xs = [x for (s, _, _), v in times.items() if s == system for x in v]
        if xs:
            pooled[system] = statistics.median(xs)
            lines.append((f"{system}, both passes", len(xs), pooled[system],
                          quantile(xs, 0.1), quantile(xs, 0.9), statistics.mean(xs)))
    bases = [pooled.get(f"gloo-{wire}"), pooled.get(f"gloo-{wire}-batch")]
    print(f"{'':44} {'n':>6} {'median us':>10} {'p10':>9} {'p90':>9} {'mean':>9}"
          f"  ratio to gloo-{wire}, -batch")
    with open(summary_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["what", "n", "median_us", "p10_us", "p90_us", "mean_us",
                    f"ratio_to_gloo_{wire}", f"ratio_to_gloo_{wire}_batch"])
        for what, n, med, p10, p90, mean in lines:
            ratios = [med / b if b and what.startswith("gradsync") else None for b in bases]
            shown = "  ".join(f"{r:5.2f}x" for r in ratios if r)
            print(f"{what:44} {n:6d} {med:10.1f} {p10:9.1f} {p90:9.1f} {mean:9.1f}  {shown}")
            w.writerow([what, n, f"{med:.3f}", f"{p10:.3f}", f"{p90:.3f}", f"{mean:.3f}"] +
                       [f"{r:.3f}" if r else "" for r in ratios])
    print("per-bucket p10/p90 are of step time / buckets; Gloo's are per call")


if __name__ == "__main__":
    main()
