"""GradSync.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_ on the
same reduced gradients, two trainers of one job, for the fp16 and fp32
wires (tests/python/norm_trainer.py does the comparing, step by step).

The bounds met:
- the step's grad_norm against an fp64 norm NumPy computes from the
  reduced gradients: relative 1e-12 (both sum the same squares in fp64, in
  different orders: at most n * 2^-53 apart, n = 22,538);
- GradSync.clip_grad_norm_'s total norm against torch's (torch sums in
  fp32): relative 1e-6;
- the clipped gradients against torch's: relative to their magnitude,
  within the relative difference of the two total norms (which the two
  coefficients inherit) plus 4 * 2^-24 (the roundings); not clipped
  (max_norm ten times the norm): the gradients unchanged, bit for bit;
- norm_type 1 falls back to torch's: the same norm, bit for bit;
- a step with an infinite loss on rank 0: grad_norm and both total norms
  non-finite, error_if_nonfinite raises the same error in both;
- the two trainers' grad_norm bits and final weights are equal.
"""
import os
import sys

import numpy as np

from norm_trainer import rel
from pylib import Daemon, check, run, set_job, spawn
from torch_trainer import THRESHOLD

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 7
INF_AT = 5
WORLD = 2


def run_wire(wire):
    set_job(WORLD, threshold=THRESHOLD, wire=wire)
    d = Daemon([])
    try:
        procs, outs, logs = [], [], []
        for r in range(WORLD):
            out = os.path.join(d.dir, f"norm-{r}.npz")
            log = os.path.join(d.dir, f"norm-{r}.log")
            argv = [sys.executable, os.path.join(HERE, "norm_trainer.py"), str(r), str(STEPS),
                    out, "--socket", d.socket, "--wire", wire, "--inf-at", str(INF_AT)]
            procs.append(spawn(argv, log))
            outs.append(out)
            logs.append(log)
        results = []
        for p, out, log in zip(procs, outs, logs):
            rc = p.wait(300)
            check(rc == 0, f"norm trainer exited {rc}:\n" + open(log).read())
            results.append(dict(np.load(out)))
        return results
    finally:
        d.cleanup()


def check_rows(wire, r, rows):
    clipped = 0
    for step, norm, ref, ours, theirs, ulps, same_error, unchanged, norm_type in rows:
        what = f"{wire}, rank {r}, step {int(step)}"
        if int(step) == INF_AT:
            check(not np.isfinite(norm) and not np.isfinite(ref),
                  f"{what}: grad_norm {norm}, the reference {ref}: not both non-finite")
            check(not np.isfinite(ours) and not np.isfinite(theirs),
                  f"{what}: total norms {ours} and torch's {theirs}: not both non-finite")
            check(same_error == 1, f"{what}: error_if_nonfinite did not raise torch's error")
            continue
        check(abs(norm - ref) <= 1e-12 * ref,
              f"{what}: grad_norm {norm!r}, the fp64 reference {ref!r}")
        if norm_type == 2:
            check(abs(ours - theirs) <= 1e-6 * theirs,
                  f"{what}: total norm {ours!r}, torch's {theirs!r}")
        else:
            check(ours == theirs, f"{what}: norm_type 1 gives {ours!r}, torch's {theirs!r}")
        # The coefficients differ as the norms do, and each product rounds.
        limit = rel(ours, theirs) / 2.0 ** -24 + 4
        check(ulps <= limit, f"{what}: clipped gradients {ulps} units of 2^-24 from torch's "
              f"(at most {limit:.3g}: the norms' difference, and rounding)")
        if norm_type != 2:  # max_norm is the L2 norm's: whether it clips is torch's affair
            continue
        if int(step) % 2 == 0:
            check(unchanged == 1, f"{what}: gradients changed below max_norm")
        else:
            check(unchanged == 0, f"{what}: nothing was clipped at a tenth of the norm")
            clipped += 1
    check(clipped >= 2, f"{wire}, rank {r}: only {clipped} steps clipped")


def compare(wire):
    res = run_wire(wire)
    for r, out in enumerate(res):
        check_rows(wire, r, out["rows"])
    a, b = res[0]["rows"][:, 1], res[1]["rows"][:, 1]
    check(a.tobytes() == b.tobytes(), f"{wire}: the trainers' grad_norm differ: {a} {b}")
    for k in res[0]:
        if k.startswith("p"):
            check(np.array_equal(res[0][k], res[1][k]), f"{wire}: the trainers' {k} differ")
    worst = max(abs(n - f) / f for n, f in zip(res[0]["rows"][:, 1], res[0]["rows"][:, 2])
                if np.isfinite(f))
    rows = [row for row in res[0]["rows"] if row[8] == 2 and np.isfinite(row[4])]
    norms = max(rel(row[3], row[4]) for row in rows)
    ulps = max(row[5] for row in rows)
    print(f"{wire}: grad_norm within {worst:.2g} of the fp64 reference; total norm within "
          f"{norms:.2g} of torch's; clipped gradients within {ulps:.3g} units of 2^-24",
          flush=True)


def test_clip_grad_norm_fp16():
    compare("fp16")


def test_clip_grad_norm_fp32():
    compare("fp32")


if __name__ == "__main__":
    run([test_clip_grad_norm_fp16, test_clip_grad_norm_fp32])
