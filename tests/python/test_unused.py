"""Unused and frozen parameters: GradSync against DDP with
find_unused_parameters=True, the same model, data and optimiser (SGD with
momentum and weight decay) in two processes (unused_trainer.py).

- a parameter that no rank used in a step (aux on even steps; dead on
  every step) keeps grad = None on every rank, as with DDP, so the
  optimizer leaves it alone: dead ends equal to its initial weights, bit
  for bit;
- a parameter that one rank used (aux on odd steps, rank 0 only) gets the
  average on both, the other rank adding zeros;
- a layer frozen after wrapping (mid) is never given a gradient again and
  ends equal to its weights when it was frozen;
- the final weights are within fp16 rounding of DDP with its
  fp16_compress_hook on the default wire, and bit for bit DDP's on
  wire="fp32";
- one trainer on each of two gradsyncd (the nodes' vote carries which
  gradients any rank produced) ends bit for bit as two on one node.

The fp16 bound is test_torch.py's: one rounding of the wire (2^-11
relative) per step in each gradient element, turned by SGD with momentum m
into at most lr / (1 - m) of that in a weight per step, with a factor 4.
"""
import os
import tempfile

import numpy as np

from pylib import (Daemon, HAVE_GLOO, LOOPBACK, Skip, check, free_port, job_daemon, run, set_job,
                   train_ranks)
from unused_trainer import FREEZE_AT, LR, MOMENTUM, THRESHOLD, WORLD, Model

STEPS = 12


def train(mode, tmp, *extra, **ranks):
    """WORLD trainers of unused_trainer.py in `mode`: their results."""
    return train_ranks("unused_trainer.py", mode, STEPS, tmp, *extra, world=WORLD, **ranks)


def gradsync_run(wire):
    set_job(WORLD, threshold=THRESHOLD, wire=wire)
    d = Daemon([])
    try:
        return train("gradsync", d.dir, "--socket", d.socket, "--wire", wire)
    finally:
        d.cleanup()


def ddp_run(fp16_hook):
    tmp = tempfile.mkdtemp(prefix="gs-unused-")
    init = os.path.join(tmp, "ddp-init")
    return train("ddp", tmp, "--init", init, *(["--fp16-hook"] if fp16_hook else []))


def expected_none(names):
    """Which gradients are None before each step's update, by the model's
    definition: aux where no rank used it, dead always, mid once frozen."""
    want = np.zeros((STEPS, len(names)), dtype=np.int8)
    for s in range(1, STEPS + 1):
        for k, n in enumerate(names):
            layer = str(n).split(".")[0]
            want[s - 1, k] = (layer == "dead" or (layer == "aux" and s % 2 == 0)
                              or (layer == "mid" and s >= FREEZE_AT))
    return want


def weights(result, layer=None):
    return {k: v for k, v in result.items()
            if k.startswith("p.") and (layer is None or k.split(".")[1] == layer)}


def max_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def check_semantics(results, what):
    """What holds on every rank whatever the wire: None where DDP leaves
    None, dead untouched, mid as frozen, the ranks equal."""
    names = results[0]["names"]
    want = expected_none(names)
    initial = {f"p.{n}": p.detach().numpy() for n, p in Model().named_parameters()}
    for r, res in enumerate(results):
        bad = np.argwhere(res["none"] != want)
        if len(bad):
            s, k = bad[0]
            check(False, f"{what}, rank {r}: before step {s + 1}'s update {names[k]}.grad "
                  f"is {'None' if res['none'][s, k] else 'a tensor'}, expected "
                  f"{'None' if want[s, k] else 'a tensor'}")
        dead = max_diff(weights(res, "dead"), {k: initial[k] for k in weights(res, "dead")})
        check(dead == 0, f"{what}, rank {r}: the unused layer moved by {dead:.3g}")
        for n in ("weight", "bias"):
            moved = float(np.max(np.abs(res[f"p.mid.{n}"] - res[f"frozen.{n}"])))
            check(moved == 0, f"{what}, rank {r}: mid.{n}, frozen after wrapping, moved "
                  f"by {moved:.3g}")
    diff = max_diff(weights(results[0]), weights(results[1]))
    check(diff == 0, f"{what}: the ranks' weights differ by {diff:.3g}")


def test_fp16_wire_against_ddp_fp16_hook():
    ours, theirs = gradsync_run("fp16"), ddp_run(True)
    check_semantics(ours, "gradsync fp16")
    check_semantics(theirs, "DDP + fp16_compress_hook")
    gmax = max(float(r["gmax"]) for r in ours + theirs)
    tol = 4 * LR / (1 - MOMENTUM) * STEPS * 2.0 ** -11 * gmax
    for layer in ("aux", "head", "trunk", "mid", "dead"):
        diff = max_diff(weights(ours[0], layer), weights(theirs[0], layer))
        print(f"fp16: {layer} differs from DDP's by {diff:.3g} (bound {tol:.3g})", flush=True)
        check(diff <= tol, f"fp16: {layer} differs from DDP's by {diff:.3g} > {tol:.3g}")


def test_fp32_wire_equals_ddp():
    ours, theirs = gradsync_run("fp32"), ddp_run(False)
    check_semantics(ours, "gradsync fp32")
    check_semantics(theirs, "DDP")
    for layer in ("aux", "head", "trunk", "mid", "dead"):
        diff = max_diff(weights(ours[0], layer), weights(theirs[0], layer))
        print(f"fp32: {layer} differs from DDP's by {diff:.3g}", flush=True)
        check(diff == 0, f"fp32: {layer} differs from DDP's by {diff:.3g}, not bit for bit")


def test_two_nodes_equal_one_node():
    """One trainer on each of two gradsyncd joined on loopback: which
    gradients some rank produced rides on the nodes' vote, and the weights
    are bit for bit those of two trainers on one node."""
    if not HAVE_GLOO:
        raise Skip("gradsyncd is built without Gloo")
    port = free_port()
    settings = (("threshold", THRESHOLD), ("wire", "fp16"))
    nodes = [job_daemon(1, settings, 2, r, port) for r in range(2)]
    try:
        for n in nodes:
            n.wait_ready(60)
        two = train("gradsync", nodes[0].dir, "--wire", "fp16", "--local-rank", "0",
                    rank_args=lambda r: ["--socket", nodes[r].socket],
                    rank_env=lambda r: {"GRADSYNC_NODES": "2", "GRADSYNC_NODE_RANK": str(r),
                                        "GRADSYNC_LOCAL_SIZE": "1",
                                        "GRADSYNC_COORDINATOR": LOOPBACK})
    finally:
        for n in nodes:
            n.cleanup()
    check_semantics(two, "gradsync fp16 on two nodes")
    one = gradsync_run("fp16")
    diff = max_diff(weights(two[0]), weights(one[0]))
    check(diff == 0, f"two nodes differ from one node of two trainers by {diff:.3g}")


if __name__ == "__main__":
    run([test_fp32_wire_equals_ddp, test_fp16_wire_against_ddp_fp16_hook,
         test_two_nodes_equal_one_node])
