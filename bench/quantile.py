"""The one quantile the benchmark tables report, so that their p10 and p90
agree with each other and with bench_stats in bench/common.c: linear
interpolation between order statistics."""


def quantile(xs, q):
    """The q-quantile (0 <= q <= 1) of the numbers xs, which need not be sorted."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
