"""What DDP users do between backward() and optimizer.step(), through
GradSync and through PyTorch's DDP on Gloo side by side (ddp_trainer.py:
two ranks, each training both on the same data from the same weights),
on the fp16 wire (against DDP with its fp16 compress hook) and on the fp32
wire (against plain DDP):

- clip_grad_norm_ with optimizer= sees the average: both ranks get the
  same global norm, DDP's, far from either rank's local norm;
- a GradScaler with an infinite loss on one rank skips that step on every
  rank, as DDP's does, and the next step runs;
- wait() after backward(), twice, and optimizer= as well: one all-reduce
  per iteration, by the step ids the daemon gave and its count of the
  job's steps;
- a DistributedSampler fed from GradSync's rank and world gives each rank
  the shard DDP's gives it; GradSync's rank and world are
  torch.distributed's;
- no_sync() accumulates locally and the next backward() averages the sum,
  as DDP's no_sync.

The bounds: on the fp32 wire bit for bit, since both sides sum the same
two fp32 values and halve them. On the fp16 wire a gradient element may
differ by one fp16 rounding of the largest gradient (relative 2^-11) for
each step taken, as the weights it is computed at drift apart too; the
weights by test_torch.py's bound over the steps taken; a norm computed
from the gradients by 2^-10 of the largest norm.

Also: a second job on the same id (torchrun's default run id, "none") is
refused with a message that names the id and says how to give another.
"""
import copy
import os
import sys
import tempfile

import numpy as np

from pylib import Daemon, check, check_eq, run, set_job, spawn
from ddp_trainer import INF_AT, MAX_NORM, SAMPLES, STEPS
from torch_trainer import LR, MOMENTUM, THRESHOLD

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
WIRES = ("fp16", "fp32")
_results = {}


def results(wire):
    """Each rank's saved arrays from one run of ddp_trainer.py on `wire`."""
    if wire in _results:
        return _results[wire]
    set_job(WORLD, threshold=THRESHOLD, wire=wire)
    d = Daemon([])
    try:
        init = os.path.join(tempfile.mkdtemp(prefix="gs-ddp-"), "init")
        procs = []
        for r in range(WORLD):
            out, log = (os.path.join(d.dir, f"{wire}-{r}.{ext}") for ext in ("npz", "log"))
            argv = [sys.executable, os.path.join(HERE, "ddp_trainer.py"), str(r), str(WORLD),
                    out, "--init", init, "--socket", d.socket, "--wire", wire]
            procs.append((spawn(argv, log), out, log))
        res = []
        for p, out, log in procs:
            rc = p.wait(300)
            check(rc == 0, f"ddp_trainer.py exited {rc}:\n" + open(log).read()
                  + "\ngradsyncd:\n" + d.log_text())
            res.append(dict(np.load(out)))
    finally:
        d.cleanup()
    _results[wire] = res
    return res


def weight_bound(wire, grads, steps):
    """test_torch.py's bound on the weights after `steps` steps."""
    if wire == "fp32":
        return 0.0
    gmax = max(float(np.max(np.abs(g[np.isfinite(g)]))) for g in grads)
    return 4 * LR / (1 - MOMENTUM) * steps * 2.0 ** -11 * gmax


def grad_bound(wire, grads):
    """One fp16 rounding of the largest gradient, per element."""
    if wire == "fp32":
        return 0.0
    return 2.0 ** -11 * max(float(np.max(np.abs(g[np.isfinite(g)]))) for g in grads)


def largest(a, b):
    """The largest difference of two arrays, infinities and NaNs equal
    only to themselves in the same places."""
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if not np.all(same | (np.isfinite(a) & np.isfinite(b))):
        return float("inf")
    return float(np.max(np.where(same, 0.0, np.abs(a - b)), initial=0.0))


def compare_pair(case, wire, res, steps=STEPS):
    """Both ranks' weights are equal, and DDP's within the bound; the
    gradients each side held once backward() returned as well."""
    what = f"{case}, {wire} wire"
    for k in range(1, WORLD):
        for side in ("ours", "theirs"):
            for kind in ("weights", "grads"):
                d = largest(res[0][f"{case}.{side}.{kind}"], res[k][f"{case}.{side}.{kind}"])
                check(d == 0, f"{what}: rank {k}'s {kind} ({side}) differ from rank 0's "
                      f"by {d:.3g}")
    for r in range(WORLD):
        ours, theirs = res[r][f"{case}.ours.grads"], res[r][f"{case}.theirs.grads"]
        gd, gtol = largest(ours, theirs), grad_bound(wire, [ours, theirs]) * steps
        w = [res[r][f"{case}.{s}.weights"] for s in ("ours", "theirs")]
        wd, wtol = largest(*w), weight_bound(wire, [ours, theirs], steps)
        if r == 0:
            print(f"{what}: gradients after backward() differ from DDP's by {gd:.3g} "
                  f"(bound {gtol:.3g}), weights by {wd:.3g} (bound {wtol:.3g})", flush=True)
        check(gd <= gtol, f"{what}: rank {r}'s gradients after backward() differ from "
              f"DDP's by {gd:.3g} > {gtol:.3g}")
        check(wd <= wtol, f"{what}: rank {r}'s weights differ from DDP's by {wd:.3g} > "
              f"{wtol:.3g}")


def test_clip_grad_norm_sees_the_average():
    for wire in WIRES:
        res = results(wire)
        norms = [r["clip.norms"] for r in res]  # per step: ours, DDP's
        local = [r["clip.local_norms"] for r in res]
        tol = 0.0 if wire == "fp32" else 2.0 ** -10 * float(np.max(norms[0]))
        print(f"{wire}: clip_grad_norm_ saw {norms[0][:, 0].tolist()} and "
              f"{norms[1][:, 0].tolist()}, DDP {norms[0][:, 1].tolist()}; local norms "
              f"{local[0].tolist()} and {local[1].tolist()}", flush=True)
        for step in range(STEPS):
            mine = [float(n[step, 0]) for n in norms]
            ddp = float(norms[0][step, 1])
            check(mine[0] == mine[1], f"{wire}: step {step + 1}: the ranks' norms differ "
                  f"({mine[0]!r}, {mine[1]!r}): clip_grad_norm_ saw unsynchronised gradients")
            check(abs(mine[0] - ddp) <= tol, f"{wire}: step {step + 1}: norm {mine[0]!r}, "
                  f"DDP's {ddp!r} (bound {tol:.3g})")
            check(ddp > MAX_NORM, f"{wire}: step {step + 1}: norm {ddp} leaves nothing to clip")
            for r in range(WORLD):
                off = abs(float(local[r][step]) - ddp)
                check(off > 10 * max(tol, 1e-6), f"{wire}: step {step + 1}: rank {r}'s local "
                      f"norm is within {off:.3g} of DDP's: the test cannot tell")
        compare_pair("clip", wire, res)


def test_grad_scaler_skips_a_planted_inf_on_every_rank():
    for wire in WIRES:
        res = results(wire)
        for r, out in enumerate(res):
            rows = out["scaler.rows"]  # scale, weights moved; ours, then DDP's
            check(np.array_equal(rows[:, 0], rows[:, 2]), f"{wire}: rank {r}'s scales "
                  f"{rows[:, 0].tolist()}, DDP's {rows[:, 2].tolist()}")
            for step, row in enumerate(rows, 1):
                for side, moved in (("ours", row[1]), ("DDP's", row[3])):
                    if step == INF_AT:
                        check(moved == 0, f"{wire}: rank {r}: {side} step {step} with an "
                              f"infinite loss on rank 0 moved the weights by {moved}")
                    else:
                        check(moved > 0, f"{wire}: rank {r}: {side} step {step} did not run")
            check(rows[INF_AT, 0] == rows[INF_AT - 1, 0] / 2,
                  f"{wire}: rank {r}: the scale did not back off after the skipped step: "
                  f"{rows[:, 0].tolist()}")
        compare_pair("scaler", wire, res)


def test_wait_is_idempotent_with_optimizer():
    for wire in WIRES:
        res = results(wire)
        for r, out in enumerate(res):
            ids = out["wait.ids"]  # after backward(), wait(), wait(), optimizer.step()
            first = int(ids[0, 0])
            for k, row in enumerate(ids):
                check_eq(row.tolist(), [first + k] * 4, f"{wire}: rank {r}: iteration {k + 1}'s "
                         "step ids (after backward(), wait(), wait() and step())")
            check_eq(int(out["wait.steps_completed"]), STEPS,
                     f"{wire}: rank {r}: steps gradsyncd finished for the job")
        compare_pair("wait", wire, res)


def test_distributed_sampler_from_rank_and_world():
    for wire in WIRES:
        res = results(wire)
        for r, out in enumerate(res):
            check_eq(out["sampler.place"].tolist(), [r, WORLD, r, WORLD, 0, 1],
                     f"{wire}: rank {r}'s (rank, world_size, local_rank, local_size, "
                     "node_rank, nodes)")
            check_eq(out["sampler.dist"].tolist(), [r, WORLD],
                     f"{wire}: torch.distributed's rank and world")
            check(np.array_equal(out["sampler.ours.indices"], out["sampler.theirs.indices"]),
                  f"{wire}: rank {r}'s shard differs from DDP's")
        for epoch in range(2):
            shards = [set(out["sampler.ours.indices"][epoch].tolist()) for out in res]
            check(not shards[0] & shards[1], f"{wire}: epoch {epoch}: the ranks' shards overlap")
            check_eq(shards[0] | shards[1], set(range(SAMPLES)),
                     f"{wire}: epoch {epoch}: the shards' union")
        compare_pair("sampler", wire, res, steps=2 * SAMPLES // (WORLD * 32))


def test_no_sync_accumulates_as_ddp():
    for wire in WIRES:
        compare_pair("no_sync", wire, results(wire))


def test_wait_in_backward_in_process():
    """One trainer in this process (a world of one: the result is the
    local gradient rounded through fp16, which torch computes on its own).
    backward() returns with the reduced gradient in .grad; wait() then
    returns that step without another; a backward under no_sync() adds
    local gradients to the reduced ones, so the next wait() synchronises
    the sum; the optimizer's step under no_sync() takes the local ones."""
    import torch
    import gradsync.torch as gst
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 8)
        x = [torch.randn(32, 16) for _ in range(2)]
        loss = lambda b: model(b).square().sum()  # noqa: E731

        def local(*batches):
            twin = copy.deepcopy(model)
            return torch.autograd.grad(sum(twin(b).square().sum() for b in batches),
                                       list(twin.parameters()))

        def expect(want, what):
            for p, w in zip(model.parameters(), want):
                check(torch.equal(p.grad, w.half().float()),
                      f"{what}: .grad is not the reduced gradient")

        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # its step only waits
        with gst.GradSync(model, socket_path=d.socket, optimizer=opt) as sync:
            want = local(x[0])
            loss(x[0]).backward()
            expect(want, "after backward()")
            first = sync.last_result.step
            check_eq([sync.wait().step, sync.wait().step], [first, first],
                     "wait() after backward(), twice")
            sync.zero_grad()
            reduced = [g.half().float() for g in local(x[0])]
            want = [r + g for r, g in zip(reduced, local(x[1]))]
            loss(x[0]).backward()
            with sync.no_sync():
                loss(x[1]).backward()
            check_eq(sync.wait().step, first + 2, "wait() after a backward under no_sync()")
            expect(want, "after wait()")
            with sync.no_sync():
                loss(x[0]).backward()
                opt.step()
            check_eq(sync.last_result.step, first + 2, "a step under no_sync() (local, as DDP's)")
    finally:
        d.cleanup()


def test_wait_after_reentrant_checkpoint():
    """With reentrant activation checkpointing, the checkpointed layers'
    gradients come from a backward pass run inside the outer one, which
    ends first: the wait is at the end of the outer pass, once every
    gradient is in, whether the first gradient came from inside the
    checkpoint (the last layers checkpointed), outside it, or none came
    outside. A world of one: the result is each local gradient rounded
    through fp16."""
    import torch
    from torch.utils.checkpoint import checkpoint
    import gradsync.torch as gst
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        torch.manual_seed(0)
        layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        x = torch.randn(8, 16, requires_grad=True)  # as reentrant checkpoints need

        def forward(net, checkpointed):
            h = x
            for i, layer in enumerate(net):
                h = checkpoint(layer, h, use_reentrant=True) if i in checkpointed else layer(h)
            return h.square().sum()

        with gst.GradSync(layers, socket_path=d.socket) as sync:
            for checkpointed in ({2, 3}, {1, 2}, {0, 1, 2, 3}):
                twin = copy.deepcopy(layers)
                want = torch.autograd.grad(forward(twin, ()), list(twin.parameters()))
                sync.zero_grad()
                before = sync.last_result.step if sync.last_result else 0
                forward(layers, checkpointed).backward()
                what = f"layers {sorted(checkpointed)} checkpointed"
                check_eq(sync.last_result.step, before + 1, f"{what}: the step after backward()")
                for k, (p, w) in enumerate(zip(layers.parameters(), want)):
                    check(torch.equal(p.grad, w.half().float()),
                          f"{what}: parameter {k}'s .grad is not its reduced gradient")
    finally:
        d.cleanup()


def test_second_job_on_one_id_is_told_to_take_another():
    import gradsync
    set_job(1)
    d = Daemon([])
    try:
        with gradsync.Client(d.socket, local_rank=0, job_id="none"):
            try:
                gradsync.Client(d.socket, local_rank=0, job_id="none", timeout=30)
                raise AssertionError("a second trainer as local rank 0 of job 'none' was "
                                     "accepted")
            except gradsync.RefusedError as e:
                for words in (f"job 'none': local rank 0 is already taken by pid {os.getpid()}",
                              "--rdzv-id", "GRADSYNC_JOB_ID"):
                    check(words in e.message, f"the refusal does not say '{words}': "
                          f"{e.message}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_wait_in_backward_in_process, test_wait_after_reentrant_checkpoint,
         test_second_job_on_one_id_is_told_to_take_another,
         test_clip_grad_norm_sees_the_average, test_grad_scaler_skips_a_planted_inf_on_every_rank,
         test_wait_is_idempotent_with_optimizer, test_distributed_sampler_from_rank_and_world,
         test_no_sync_accumulates_as_ddp])
