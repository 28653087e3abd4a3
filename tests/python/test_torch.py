"""gradsync.torch against PyTorch's own DDP on Gloo: the same model, data
and optimiser in two processes, for STEPS steps.

- GradSync with the fp16 wire ends within fp16 rounding of DDP with
  PyTorch's fp16_compress_hook; with the fp32 wire, within fp32 rounding
  of DDP without a hook;
- backward_and_update_half gives exactly what GradSync with the fp16 wire
  gives (the same reduction);
- each trainer alone (no synchronisation) ends far outside those bounds,
  so the comparisons can fail.

The bound: a gradient element differs by at most one rounding of its wire
dtype (relative 2^-11 for fp16, 2^-24 for fp32) per step; SGD with
momentum m turns that into at most lr / (1 - m) * that per step in a
weight, summed over the steps; a factor 4 leaves room for the small
differences the two trajectories then feed back.
"""
import copy
import os
import tempfile

import numpy as np

from pylib import (Daemon, HAVE_GLOO, LOOPBACK, Skip, check, free_port, job_daemon, run, set_job,
                   train_ranks)
from torch_trainer import LR, MOMENTUM, THRESHOLD

STEPS = 30
WORLD = 2


def train(mode, tmp, *extra, **ranks):
    """WORLD trainers of torch_trainer.py in `mode`: their results."""
    return train_ranks("torch_trainer.py", mode, STEPS, tmp, *extra, world=WORLD, **ranks)


def gradsync_run(mode, wire):
    set_job(WORLD, threshold=THRESHOLD, wire=wire)
    d = Daemon([])
    try:
        return train(mode, d.dir, "--socket", d.socket, "--wire", wire)
    finally:
        d.cleanup()


def ddp_run(tmp, fp16_hook):
    init = os.path.join(tmp, "ddp-init-fp16" if fp16_hook else "ddp-init-fp32")
    extra = ["--init", init, "--world", str(WORLD)] + (["--fp16-hook"] if fp16_hook else [])
    return train("ddp", tmp, *extra)


def params(result):
    return [result[k] for k in sorted(k for k in result if k.startswith("p"))]


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(params(a), params(b)))


def bound(results, rel):
    gmax = max(float(r["gmax"]) for r in results)
    return 4 * LR / (1 - MOMENTUM) * STEPS * rel * gmax


_tmp = None


def tmpdir():
    global _tmp
    if _tmp is None:
        _tmp = tempfile.mkdtemp(prefix="gs-torch-")
    return _tmp


def compare(ours, theirs, rel, what):
    for k in range(1, WORLD):
        check(max_diff(ours[0], ours[k]) == 0, f"{what}: trainers' weights differ")
    tol = bound(ours + theirs, rel)
    diff = max_diff(ours[0], theirs[0])
    alone = max_diff(ours[0], local_results()[0])
    print(f"{what}: largest weight difference {diff:.3g}, bound {tol:.3g}; "
          f"unsynchronised training differs by {alone:.3g}", flush=True)
    check(diff <= tol, f"{what}: weights differ by {diff:.3g} > {tol:.3g}")
    check(alone > 10 * tol, f"{what}: the bound {tol:.3g} does not tell synchronised "
          f"from unsynchronised training ({alone:.3g})")


_local = None


def local_results():
    global _local
    if _local is None:
        _local = train("local", tmpdir())
    return _local


def test_fp16_wire_matches_ddp_fp16_compress_hook():
    compare(gradsync_run("gradsync", "fp16"), ddp_run(tmpdir(), True), 2.0 ** -11,
            "fp16: gradsync vs DDP + fp16_compress_hook")


def test_fp32_wire_matches_ddp():
    compare(gradsync_run("gradsync", "fp32"), ddp_run(tmpdir(), False), 2.0 ** -24,
            "fp32: gradsync vs DDP")


def test_two_nodes_equal_one_node():
    """GradSync with one trainer on each of two gradsyncd joined on
    loopback (the Gloo path between nodes) gives bit for bit the weights
    of two trainers on one node: the same fp16 sum of the same values."""
    if not HAVE_GLOO:
        raise Skip("gradsyncd is built without Gloo")
    port = free_port()
    settings = (("threshold", THRESHOLD), ("wire", "fp16"))
    nodes = [job_daemon(1, settings, 2, r, port) for r in range(2)]
    try:
        for n in nodes:
            n.wait_ready(60)
        # Each node's only trainer is its local rank 0; the data is still
        # that of global rank r. The trainers say the job's shape, which
        # gradsyncd checks.
        two = train("gradsync", nodes[0].dir, "--wire", "fp16", "--local-rank", "0",
                    rank_args=lambda r: ["--socket", nodes[r].socket],
                    rank_env=lambda r: {"GRADSYNC_NODES": "2", "GRADSYNC_NODE_RANK": str(r),
                                        "GRADSYNC_LOCAL_SIZE": "1",
                                        "GRADSYNC_COORDINATOR": LOOPBACK})
    finally:
        for n in nodes:
            n.cleanup()
    one = gradsync_run("gradsync", "fp16")
    check(max_diff(two[0], two[1]) == 0, "the two nodes' weights differ")
    diff = max_diff(two[0], one[0])
    check(diff == 0, f"two nodes differ from one node of two trainers by {diff:.3g}")


def test_backward_and_update_half_equals_gradsync_fp16():
    half = gradsync_run("half", "fp16")
    ours = gradsync_run("gradsync", "fp16")
    diff = max_diff(half[0], ours[0])
    check(diff == 0, f"backward_and_update_half differs from GradSync fp16 by {diff:.3g}")
    losses = half[0]["losses"]
    check(losses[-1] < losses[0], f"the loss did not fall: {losses[0]} -> {losses[-1]}")


def test_loss_scaler_figures():
    """Clipped counts equal the local gradients'; an infinite loss on one
    rank shows as non-finite values on every rank, which all skip it."""
    inf_at = 3
    set_job(WORLD, threshold=THRESHOLD)
    d = Daemon([])
    try:
        res = train("figures", d.dir, "--socket", d.socket, "--clip", "0.01",
                    "--inf-at", str(inf_at))
    finally:
        d.cleanup()
    for r, out in enumerate(res):
        for step, clipped, want, nonfinite, skipped in out["rows"]:
            check(clipped == want, f"rank {r} step {step}: clipped {clipped}, "
                  f"its local gradient has {want} beyond the clip value")
            if step != inf_at or r != 0:  # rank 0's gradient is then mostly NaN
                check(clipped > 0, f"rank {r} step {step}: nothing clipped at 0.01")
            check((nonfinite > 0) == (step == inf_at),
                  f"rank {r} step {step}: {nonfinite} non-finite values")
            check(skipped == (step == inf_at), f"rank {r} step {step}: skipped {skipped}")
    check(max_diff(res[0], res[1]) == 0, "the ranks' weights differ after the skip")


def test_in_process_semantics():
    """One trainer in this process (a world of one, so the result is the
    local gradient rounded through fp16, which torch computes on its own):
    the reduced gradients, an unused parameter, no_sync accumulation, and
    the refusal of a threshold that is not the job's, and the error for a
    dtype the daemon cannot take."""
    import torch
    import gradsync
    import gradsync.torch as gst
    torch.manual_seed(0)
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        model = torch.nn.ModuleDict({"used": torch.nn.Linear(16, 8),
                                     "unused": torch.nn.Linear(4, 4)})
        x = [torch.randn(32, 16) for _ in range(2)]

        def local_grads(*batches):
            twin = copy.deepcopy(model)
            loss = sum(twin["used"](b).square().sum() for b in batches)
            return torch.autograd.grad(loss, list(twin["used"].parameters()))

        # The job's first trainer defines it; another that says otherwise
        # is refused while it runs.
        sync = gst.GradSync(model, threshold=THRESHOLD, socket_path=d.socket)
        try:
            gst.GradSync(copy.deepcopy(model), threshold=THRESHOLD + 1, socket_path=d.socket)
            raise AssertionError("a threshold other than the job's was accepted")
        except gradsync.RefusedError as e:
            check(f"threshold {THRESHOLD + 1}, the job has {THRESHOLD}" in e.message,
                  f"the message does not name both thresholds: {e.message}")
        want = [g.half().float() for g in local_grads(x[0])]
        model["used"](x[0]).square().sum().backward()
        r = sync.wait()
        check(not r.aborted and r.nonfinite == 0, f"result {r}")
        for p, w in zip(model["used"].parameters(), want):
            check(torch.equal(p.grad, w), "reduced gradient != its fp16 rounding")
        for p in model["unused"].parameters():
            check(p.grad is None, "an unused parameter was given a gradient")

        sync.zero_grad()
        want = [g.half().float() for g in local_grads(x[0], x[1])]
        with sync.no_sync():
            model["used"](x[0]).square().sum().backward()
        model["used"](x[1]).square().sum().backward()
        sync.wait()
        for p, w in zip(model["used"].parameters(), want):
            check(torch.allclose(p.grad, w, rtol=2 ** -10, atol=0),
                  "no_sync did not accumulate both backward passes")
        sync.close()
        # The job of one node went with its trainer: a trainer of the same
        # job (the threshold from the environment) begins it anew, and its
        # dtype is refused.
        try:
            gst.GradSync(copy.deepcopy(model).double(), threshold=None, socket_path=d.socket)
            raise AssertionError("float64 parameters were accepted")
        except gradsync.DtypeError as e:
            check("float64" in e.message, f"the message does not name the dtype: {e.message}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_in_process_semantics, test_fp16_wire_matches_ddp_fp16_compress_hook, test_fp32_wire_matches_ddp,
         test_backward_and_update_half_equals_gradsync_fp16, test_loss_scaler_figures,
         test_two_nodes_equal_one_node])
