"""An alpha-beta model of the all-reduce between nodes, fitted to
bench/scale.sh's measurements, and drawn out to 4,096 nodes.

    python3 bench/model.py [DIR]      (default bench/results/scale)

Reads DIR/gloo.csv and DIR/summary.csv; writes DIR/model.txt (the fit,
its residuals, the crossover and where the design stops scaling) and
DIR/model.svg (predicted time against nodes, log-log, the measured points
on it), and prints model.txt with an ASCII rendering of the chart.

Per algorithm, time = (messages each rank waits on, one after another)
x alpha + (bytes on that critical path) x beta, n the buffer's bytes:
  ring              2 (N - 1) messages of n / N bytes
  doubling          s(N) messages of n bytes, s(N) = log2 P, plus 2 when
                    N is not P, P the largest power of two <= N
  rabenseifner      2 log2 P messages, 2 n (P - 1) / P bytes, plus 2 of n
                    bytes when N is not P (ours: halving, then doubling)
  halving-doubling  2 log2 N messages, 2 n (N - 1) / N bytes (Gloo's
                    classic class; its time here includes a closing barrier)
alpha and beta are fitted by least squares on relative error (the times
span four decades), each point the median over calls of the slowest rank.
On the one-machine cluster N nodes share C cores, and a node's every hop
waits for the other nodes on its core: the fit divides that out, as
measured time = max(1, N / C) x the model's (C from summary.csv), and the
predictions (the chart, the crossover, 4,096 nodes) are for a node per
machine, share 1.
The vote is a doubling all-reduce of a few floats: s(N) alpha.
"""
import csv
import math
import os
import statistics
import sys

ALGOS = ("ring", "doubling", "rabenseifner", "halving-doubling")
MAX_NODES = 4096
# Bucket sizes drawn: a tiny bucket (256 fp16 elements), a medium one, the
# default threshold's bucket (2^21 fp16 elements) and a DDP-sized 25 MB.
DRAWN = (512, 65536, 4 << 20, 25 << 20)


def doubling_steps(n):
    p = 1 << int(math.floor(math.log2(n))) if n > 1 else 1
    return int(math.log2(p)) + (2 if p != n else 0)


def features(algo, n, nbytes):
    """(messages, bytes) on the critical path."""
    if n <= 1:
        return 0.0, 0.0
    if algo == "ring":
        return 2.0 * (n - 1), 2.0 * (n - 1) * nbytes / n
    if algo == "doubling":
        s = doubling_steps(n)
        return float(s), float(s * nbytes)
    if algo == "rabenseifner":
        p = 1 << int(math.floor(math.log2(n)))
        fold = 2.0 if p != n else 0.0
        return 2.0 * math.log2(p) + fold, 2.0 * nbytes * (p - 1) / p + fold * nbytes
    return 2.0 * math.log2(n), 2.0 * nbytes * (n - 1) / n


def predict(fit, algo, n, nbytes, share=1.0):
    a, b = features(algo, n, nbytes)
    alpha, beta = fit[algo]
    return share * (a * alpha + b * beta)


CORES = [0]  # the measuring machine's, from summary.csv (0: unknown, no sharing)


def share(n):
    return max(1.0, n / CORES[0]) if CORES[0] else 1.0


def points(path):
    """{(algo, nodes, bytes): median over calls of the slowest rank, us}."""
    calls = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            key = (row["algo"], int(row["nodes"]), int(row["bytes"]), int(row["call"]))
            calls.setdefault(key, []).append(float(row["us"]))
    per = {}
    for (algo, n, b, _), us in calls.items():
        per.setdefault((algo, n, b), []).append(max(us))
    return {k: statistics.median(v) for k, v in per.items()}


def lsq2(rows):
    """Least squares of t ~ x alpha + y beta on relative error, alpha and
    beta kept >= 0: returns (alpha, beta)."""
    def solve(cols):
        # Normal equations of the weighted problem, 1 or 2 unknowns.
        w = [(x / t, y / t) for x, y, t in rows]
        if cols == (0,):
            sxx = sum(x * x for x, _ in w)
            return (sum(x for x, _ in w) / sxx if sxx else 0.0, 0.0)
        if cols == (1,):
            syy = sum(y * y for _, y in w)
            return (0.0, sum(y for _, y in w) / syy if syy else 0.0)
        sxx = sum(x * x for x, _ in w)
        syy = sum(y * y for _, y in w)
        sxy = sum(x * y for x, y in w)
        sx = sum(x for x, _ in w)
        sy = sum(y for _, y in w)
        det = sxx * syy - sxy * sxy
        if abs(det) < 1e-30:
            return None
        return ((sx * syy - sy * sxy) / det, (sy * sxx - sx * sxy) / det)
    best = solve((0, 1))
    if best is None or best[0] < 0 or best[1] < 0:
        cands = [solve((0,)), solve((1,))]
        best = min(cands, key=lambda ab: sum((x * ab[0] + y * ab[1] - t) ** 2 / t ** 2
                                             for x, y, t in rows))
    return best


def fitted(algo, n, b):
    """Whether a point joins the fit: a ring or halving-doubling of fewer
    elements than ranks leaves most ranks' segments empty (a 4-byte ring
    sends nothing on most hops), which the model does not describe."""
    return algo in ("doubling", "rabenseifner") or b // 4 >= n


def fit_all(pts):
    fit, resid = {}, {}
    for algo in ALGOS:
        rows = [(*(share(n) * f for f in features(algo, n, b)), t)
                for (a, n, b), t in pts.items() if a == algo and fitted(a, n, b)]
        if not rows:
            continue
        fit[algo] = lsq2(rows)
        resid[algo] = [(n, b, t, predict(fit, algo, n, b, share(n)))
                       for (a, n, b), t in sorted(pts.items()) if a == algo]
    return fit, resid


def summary(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for row in csv.DictReader(f):
                out[(int(row["nodes"]), row["measure"])] = float(row["value"])
    return out


PICKED = ("ring", "rabenseifner", "doubling")  # the daemon's, ties to the earlier


def pick(fit, n, b):
    best = None
    for algo in PICKED:
        if algo in fit and (best is None or predict(fit, algo, n, b) < predict(fit, best, n, b)):
            best = algo
    return best


def band_end(fit, n, inside):
    """Largest bytes in [1, 2^40] for which inside(pick) holds, the picks
    being bands by size (0: not even 1 byte)."""
    lo, hi = 1, 1 << 40
    if not inside(pick(fit, n, lo)):
        return 0
    if inside(pick(fit, n, hi)):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if inside(pick(fit, n, mid)) else (lo, mid)
    return lo


def human(b):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b} B"


def linear_fit(xs, ys):
    """y ~ c0 + c1 x, least squares."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    c1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - c1 * mx, c1


# ---- the text --------------------------------------------------------------


def report(fit, resid, summ, nodes_measured):
    L = []
    L.append("Fitted parameters (alpha: us per message waited on; beta: ns per byte on the")
    L.append("critical path, and the bandwidth it implies):")
    for algo, (alpha, beta) in fit.items():
        bw = 8 / (beta * 1e3) if beta > 0 else float("inf")
        L.append(f"  {algo:<17} alpha {alpha:9.1f} us   beta {beta * 1e3:8.3f} ns/B"
                 f"   ({bw:.2f} Gbit/s)")
    L.append("")
    L.append(f"Residuals (measured and predicted us, the prediction x max(1, N / {CORES[0]}) "
             f"for the nodes sharing a core; ratio measured / predicted):")
    for algo, rows in resid.items():
        ratios = []
        for n, b, t, p in rows:
            if fitted(algo, n, b):
                ratios.append(t / p if p > 0 else float("inf"))
            L.append(f"  {algo:<17} {n:3d} nodes {human(b):>10}  {t:10.1f} {p:10.1f}"
                     f"  {t / p if p > 0 else float('inf'):6.2f}"
                     + ("" if fitted(algo, n, b) else "  (not fitted: fewer elements than ranks)"))
        logs = [abs(math.log(r)) for r in ratios if r > 0 and math.isfinite(r)]
        if logs:
            L.append(f"  {algo:<17} typical error x{math.exp(statistics.median(logs)):.2f}, "
                     f"worst x{math.exp(max(logs)):.2f}")
    L.append("")
    L.append("The daemon's pick (daemon/backend/gloo/gloo_choice.c), by bytes a bucket:")
    for n in (2, 4, 8, 16, 64, 256, 1024, 4096):
        d = band_end(fit, n, lambda a: a == "doubling")
        r = band_end(fit, n, lambda a: a != "ring")
        L.append(f"  {n:5d} nodes: doubling up to {human(d)}, Rabenseifner up to {human(r)}, "
                 f"ring above")
    L.append("  constants for gloo_choice.c:")
    for algo in PICKED:
        if algo in fit:
            name = algo.upper()
            L.append(f"    {name}_ALPHA_US = {fit[algo][0]:.1f}, "
                     f"{name}_BETA_NS = {fit[algo][1] * 1e3:.3f}")
    L.append("")
    L.append("The daemon, measured (bench/scale.sh; the slowest node per step, median):")
    for n in nodes_measured:
        parts = []
        for key, unit in (("join (last welcomed)", "s"), ("auto step step", "ms"),
                          ("auto tiny per bucket", "us"), ("tiny ring / auto", "x"),
                          ("auto medium per bucket", "us"), ("medium ring / auto", "x")):
            if (n, key) in summ:
                parts.append(f"{key} {summ[(n, key)]:.3g} {unit}")
        L.append(f"  {n:3d} nodes: " + "; ".join(parts))
    if "doubling" in fit:
        # The host backend's vote rides in the bucket's data: one
        # all-reduce a bucket (its 9 status elements on top).
        L.append("  a tiny bucket (512 B) against the model's one all-reduce of it (the vote"
                 " rides in its data), by doubling, x the nodes a core:")
        for n in nodes_measured:
            key = (n, "auto tiny per bucket")
            if key in summ:
                model = share(n) * predict(fit, "doubling", n, 512 + 18)
                L.append(f"  {n:3d} nodes: measured {summ[key]:.0f} us, the all-reduce "
                         f"{model:.0f} us ({100 * model / summ[key]:.0f}%); the rest is the "
                         f"node's own (trainers, pack, unpack, wake-ups)")
    L.extend(limits(fit, summ, nodes_measured))
    return L


def limits(fit, summ, nodes_measured):
    L = ["", "Where the model says the design stops scaling:"]
    if "ring" in fit:
        alpha, beta = fit["ring"]
        for b in DRAWN:
            # The ring's latency term passes its bandwidth term at N > n beta / alpha.
            n_star = b * beta / alpha if alpha > 0 else float("inf")
            L.append(f"  ring, {human(b):>8} bucket: latency (2 (N-1) alpha) outweighs bytes "
                     f"past N = {max(1.0, n_star):.0f}; at 4096 nodes "
                     f"{predict(fit, 'ring', 4096, b) / 1e3:.1f} ms a bucket")
    if all(a in fit for a in PICKED):
        for b in DRAWN:
            a = pick(fit, 4096, b)
            L.append(f"  at 4096 nodes a {human(b)} bucket goes by {a}: "
                     f"{predict(fit, a, 4096, b) / 1e3:.2f} ms (the ring: "
                     f"{predict(fit, 'ring', 4096, b) / 1e3:.1f} ms)")
    if "doubling" in fit:
        L.append(f"  vote (a doubling of a few floats): {predict(fit, 'doubling', 16, 4):.0f} us "
                 f"at 16 nodes, {predict(fit, 'doubling', 4096, 4):.0f} us at 4096 "
                 f"(log2 N messages: it scales; as an all-reduce of its own it would double "
                 f"the latency of small buckets, so the host backend carries it in the "
                 f"bucket's data and only the CUDA backend runs it apart)")
    joins = [(n, summ[(n, "join (last welcomed)")]) for n in nodes_measured
             if (n, "join (last welcomed)") in summ]
    if len(joins) >= 2:
        c0, c1 = linear_fit([n for n, _ in joins], [t for _, t in joins])
        L.append(f"  join: {c0:.2f} s + {c1 * 1e3:.1f} ms x N measured (the coordinator "
                 f"welcomes every node, then Gloo's full mesh connects N (N-1) / 2 pairs); "
                 f"linear, that is {c0 + c1 * 4096:.1f} s at 4096 nodes, and the mesh is "
                 f"{4096 * 4095 // 2:,} TCP connections, 4095 sockets a node")
    return L


# ---- the chart ----------------------------------------------------------------


def series(fit):
    out = []
    ns = sorted({int(round(2 ** (k / 8))) for k in range(0, 8 * 12 + 1)})
    for b in DRAWN:
        for algo in ("ring", "doubling", "rabenseifner"):
            if algo in fit:
                out.append((f"{algo} {human(b)}", algo, b,
                            [(n, predict(fit, algo, n, b)) for n in ns if n >= 2]))
    return out


COLOURS = {"ring": "#1f77b4", "doubling": "#d62728", "rabenseifner": "#9467bd",
           "halving-doubling": "#2ca02c"}
DASH = {512: "", 65536: "6,3", 4 << 20: "2,2", 25 << 20: "10,3,2,3"}


def svg(fit, pts, path):
    W, H, ml, mr, mt, mb = 900, 560, 70, 230, 30, 50
    ser = series(fit)
    ys = [t for _, _, _, s in ser for _, t in s] + [t / share(n) for (_, n, _), t in pts.items()]
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    X = lambda n: ml + (W - ml - mr) * math.log2(n) / math.log2(MAX_NODES)
    Y = lambda t: H - mb - (H - mt - mb) * (math.log10(t) - y0) / (y1 - y0)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{ml}" y="18" font-size="14">All-reduce between nodes: the fitted '
         f'alpha-beta model (lines) and bench/scale.sh\'s points</text>']
    for k in range(0, 13):
        n = 2 ** k
        o.append(f'<line x1="{X(n):.1f}" y1="{mt}" x2="{X(n):.1f}" y2="{H - mb}" '
                 f'stroke="#eee"/><text x="{X(n):.1f}" y="{H - mb + 16}" '
                 f'text-anchor="middle">{n}</text>')
    for e in range(y0, y1 + 1):
        label = f"{10 ** e:g} us" if e < 3 else f"{10 ** (e - 3):g} ms"
        o.append(f'<line x1="{ml}" y1="{Y(10 ** e):.1f}" x2="{W - mr}" y2="{Y(10 ** e):.1f}" '
                 f'stroke="#eee"/><text x="{ml - 6}" y="{Y(10 ** e) + 4:.1f}" '
                 f'text-anchor="end">{label}</text>')
    o.append(f'<text x="{(ml + W - mr) / 2}" y="{H - 12}" text-anchor="middle">nodes</text>')
    for i, (label, algo, b, s) in enumerate(ser):
        d = " ".join(f"{X(n):.1f},{Y(t):.1f}" for n, t in s)
        dash = f' stroke-dasharray="{DASH[b]}"' if DASH[b] else ""
        o.append(f'<polyline points="{d}" fill="none" stroke="{COLOURS[algo]}" '
                 f'stroke-width="1.6"{dash}/>')
        ly = mt + 16 * i
        o.append(f'<line x1="{W - mr + 12}" y1="{ly}" x2="{W - mr + 42}" y2="{ly}" '
                 f'stroke="{COLOURS[algo]}" stroke-width="1.6"{dash}/>'
                 f'<text x="{W - mr + 48}" y="{ly + 4}">{label}</text>')
    for (algo, n, b), t in pts.items():
        if algo in COLOURS:
            o.append(f'<circle cx="{X(n):.1f}" cy="{Y(t / share(n)):.1f}" r="3" fill="none" '
                     f'stroke="{COLOURS[algo]}"><title>{algo} {human(b)} at {n} nodes: '
                     f'{t:.0f} us measured, / {share(n):g} for the nodes sharing a core'
                     f'</title></circle>')
    ly = mt + 16 * len(ser) + 10
    o.append(f'<text x="{W - mr + 12}" y="{ly}">circles: measured, all sizes,</text>')
    o.append(f'<text x="{W - mr + 12}" y="{ly + 16}">divided by max(1, N / {CORES[0] or 1})</text>')
    o.append(f'<text x="{W - mr + 12}" y="{ly + 32}">(nodes sharing a core)</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def ascii_chart(fit, pts, width=72, height=22):
    ser = [s for s in series(fit) if s[2] in (512, 4 << 20)]
    marks = {("ring", 512): "r", ("doubling", 512): "d", ("rabenseifner", 512): "h",
             ("ring", 4 << 20): "R", ("doubling", 4 << 20): "D", ("rabenseifner", 4 << 20): "H"}
    ys = [t for _, _, _, s in ser for _, t in s]
    y0, y1 = math.log10(min(ys)), math.log10(max(ys))
    grid = [[" "] * width for _ in range(height)]
    col = lambda n: min(width - 1, int((width - 1) * math.log2(n) / math.log2(MAX_NODES)))
    row = lambda t: min(height - 1, max(0, int((height - 1) * (y1 - math.log10(t)) / (y1 - y0))))
    for _, algo, b, s in ser:
        for n, t in s:
            grid[row(t)][col(n)] = marks[(algo, b)]
    for (algo, n, b), t in pts.items():
        t /= share(n)
        if b in (1024, 4 << 20) and algo in PICKED and y0 <= math.log10(t) <= y1:
            grid[row(t)][col(n)] = "o"
    lines = ["predicted time (log) against nodes (log2, 1 to 4096): r/d/h ring/doubling/"
             "Rabenseifner of a 512 B bucket, R/D/H of 4 MiB; o measured (1 KiB and 4 MiB, "
             "divided by the nodes a core)"]
    for i, r in enumerate(grid):
        t = 10 ** (y1 - (y1 - y0) * i / (height - 1))
        label = f"{t / 1e3:8.2f} ms" if i % 4 == 0 else " " * 11
        lines.append(label + " |" + "".join(r))
    lines.append(" " * 11 + " +" + "-" * width)
    axis = [" "] * width
    for k in (1, 4, 16, 64, 256, 1024, 4096):
        s = str(k)
        c = min(col(k), width - len(s))
        axis[c:c + len(s)] = s
    lines.append(" " * 13 + "".join(axis))
    return lines


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return
    d = sys.argv[1] if len(sys.argv) > 1 else "bench/results/scale"
    pts = points(os.path.join(d, "gloo.csv"))
    if not pts:
        sys.exit(f"model: no points in {d}/gloo.csv (run bench/scale.sh)")
    summ = summary(os.path.join(d, "summary.csv"))
    CORES[0] = int(summ.get((0, "cores"), 0))
    fit, resid = fit_all(pts)
    nodes_measured = sorted({n for _, n, _ in pts})
    text = report(fit, resid, summ, nodes_measured)
    with open(os.path.join(d, "model.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    svg(fit, pts, os.path.join(d, "model.svg"))
    print("\n".join(text))
    print()
    print("\n".join(ascii_chart(fit, pts)))
    print(f"\nmodel: wrote {d}/model.txt and {d}/model.svg")


if __name__ == "__main__":
    main()
