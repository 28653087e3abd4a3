"""The table of bench/cluster.sh, from its CSV of every step of every rank.

  python3 bench/cluster_table.py STEPS.csv SUMMARY.csv COMMAND

Per layout, rate, load and system: the slower node's time per step, its
median, p10 and p90; the bytes S one all-reduce carries (gradsync: its wire
bytes, fp16, as its trainers report them; gloo-fp32: 4 bytes an element;
gloo-fp16: 2); busbw = 2(N-1)/N * S / t, as a fraction of the shaped rate;
each baseline's median over gradsync's (the first gradsync build's, with
--gradsyncd) under the same load; and, under a
load, how much slower the system is than itself with none (bench/load.sh).
A CSV without a load column is one run with no load.
"""
import csv
import re
import statistics
import sys

from quantile import quantile

NODES = 2


def rate_bits(rate):
    """tc's units: 10gbit, 500mbit, 1.5gbit; 'bps' is bytes per second."""
    m = re.fullmatch(r"([0-9.]+)([kmgt]?)(bit|bps)", rate.lower())
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1)


def layout_elements(name):
    total = 0
    with open(f"layouts/{name}.txt") as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                total += int(line[1])
    return total


def main():
    steps_csv, summary_csv, command = sys.argv[1:4]
    worst = {}  # (layout, rate, load, system) -> {step: ms}
    wire = {}
    order = []
    with open(steps_csv) as f:
        for r in csv.DictReader(f):
            key = (r["layout"], r["rate"], r.get("load") or "none", r["system"])
            if key not in worst:
                worst[key] = {}
                order.append(key)
            step = int(r["step"])
            worst[key][step] = max(worst[key].get(step, 0.0), float(r["ms"]))
            if int(r["wire_bytes"]):
                wire[key] = int(r["wire_bytes"])
    print(f"command: {command}")
    print(f"{NODES} nodes x 1 trainer, each a network namespace pinned to its own core "
          "(scripts/netcluster.sh), links shaped with tbf, no added delay")
    print("per step the slower node; S = bytes one all-reduce carries (gradsync: its fp16 wire "
          "bytes;\ngloo-fp32: fp32; gloo-fp16: fp16); busbw = 2(N-1)/N * S / t; "
          "link = busbw / shaped rate")
    print("note: this 2-core machine carries at most ~9.5 Gbit/s between namespaces unshaped, "
          "so above\nthat the CPUs bind, not the shaping\n")
    head = (f"{'layout':<10} {'rate':<8} {'load':<7} {'system':<11} {'median ms':>10} "
            f"{'p10 ms':>9} {'p90 ms':>9} {'S MB':>8} {'busbw Gb/s':>10} {'link':>6} "
            f"{'slowed':>7}  baseline/gradsync")
    print(head)
    rows = []
    for key in order:
        layout, rate, load, system = key
        times = list(worst[key].values())
        med = statistics.median(times)
        p10, p90 = quantile(times, .1), quantile(times, .9)
        elements = layout_elements(layout)
        s_bytes = wire.get(key) or elements * (2 if system == "gloo-fp16" else 4)
        busbw = 2 * (NODES - 1) / NODES * s_bytes * 8 / (med / 1e3) / 1e9
        bits = rate_bits(rate)
        link = busbw * 1e9 / bits if bits else 0
        first = next((k[3] for k in order if k[:3] == key[:3] and k[3].startswith("gradsync")),
                     None)
        g = worst.get((layout, rate, load, first))
        ratio = med / statistics.median(g.values()) if g and system != first else None
        quiet = worst.get((layout, rate, "none", system))
        slowed = med / statistics.median(quiet.values()) if quiet and load != "none" else None
        print(f"{layout:<10} {rate:<8} {load:<7} {system:<11} {med:10.1f} {p10:9.1f} "
              f"{p90:9.1f} {s_bytes / 1e6:8.1f} {busbw:10.2f} {link:6.0%} "
              + (f"{slowed:6.2f}x" if slowed else f"{'':7}") + "  "
              + (f"{ratio:.2f}x" if ratio else ""))
        rows.append([layout, rate, system, len(times), f"{med:.3f}", f"{p10:.3f}",
                     f"{p90:.3f}", s_bytes, f"{busbw:.3f}", f"{link:.3f}",
                     f"{ratio:.3f}" if ratio else "", load,
                     f"{slowed:.3f}" if slowed else ""])
    with open(summary_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layout", "rate", "system", "steps", "median_ms", "p10_ms", "p90_ms",
                    "s_bytes", "busbw_gbit", "link_fraction", "ratio_to_gradsync", "load",
                    "slowed_vs_no_load"])
        w.writerows(rows)


if __name__ == "__main__":
    main()
