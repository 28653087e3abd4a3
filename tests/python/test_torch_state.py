"""GradSync makes replicas start equal and keeps their buffers equal, as
DDP does, side by side with DDP on Gloo (state_trainer.py):

- replicas initialised apart (each rank its own seed) hold, right after
  wrapping, rank 0's parameters and buffers bit for bit, the same as DDP's
  and as rank 0's initial model built here;
- with broadcast_buffers (the default), every forward of every rank starts
  from the same BatchNorm statistics, bit for bit, as under DDP; without
  it they differ, so the comparison can fail;
- the final parameters match DDP's: bit for bit on the fp32 wire;
- a Client's state, registered without gradients, is registered again by
  reconnect() after gradsyncd restarts, its bytes where they were;
- one trainer on each of two gradsyncd (the broadcast between nodes over
  their Gloo group): the same as DDP's, bit for bit on the fp32 wire.
"""
import os
import signal

import numpy as np
import torch

import gradsync
from pylib import (Daemon, HAVE_GLOO, LOOPBACK, Skip, check, free_port, job_daemon, run, set_job,
                   train_ranks)
from state_trainer import make_model

STEPS = 5
WORLD = 2


def train(mode, tmp, *extra, **ranks):
    """WORLD trainers of state_trainer.py in `mode`: their results."""
    return train_ranks("state_trainer.py", mode, STEPS, tmp, *extra, world=WORLD, **ranks)


def gradsync_run(wire, *extra):
    set_job(WORLD, wire=wire)
    d = Daemon([])
    try:
        return train("gradsync", d.dir, "--socket", d.socket, "--wire", wire, *extra)
    finally:
        d.cleanup()


def ddp_run():
    d = Daemon([])  # only for its temporary directory
    try:
        return train("ddp", d.dir, "--init", os.path.join(d.dir, "ddp-init"), "--world",
                     str(WORLD))
    finally:
        d.cleanup()


def keys(result, prefix):
    return sorted((k for k in result if k.startswith(prefix)), key=lambda k: k)


def same(a, b, prefix):
    """The first key of prefix whose arrays differ in a bit, or None."""
    for k in keys(a, prefix):
        if a[k].tobytes() != b[k].tobytes():
            return k
    return None


def test_replicas_start_equal_as_ddp():
    check_against_ddp(gradsync_run("fp32"), ddp_run())


def test_two_nodes_start_equal_as_ddp():
    """One trainer on each of two gradsyncd joined on loopback: rank 0's
    state reaches node 1 through the nodes' Gloo group, bit for bit."""
    if not HAVE_GLOO:
        raise Skip("gradsyncd is built without Gloo")
    set_job(1, wire="fp32")
    port = free_port()
    nodes = [job_daemon(1, (("wire", "fp32"),), 2, r, port) for r in range(2)]
    try:
        for n in nodes:
            n.wait_ready(60)
        g = train("gradsync", nodes[0].dir, "--wire", "fp32", "--local-rank", "0",
                  rank_args=lambda r: ["--socket", nodes[r].socket],
                  rank_env=lambda r: {"GRADSYNC_NODES": "2", "GRADSYNC_NODE_RANK": str(r),
                                      "GRADSYNC_COORDINATOR": LOOPBACK})
        for n in nodes:
            check("state broadcast from global rank 0" in n.log_text(),
                  "each node's daemon logs the broadcast between nodes")
    finally:
        for n in nodes:
            n.cleanup()
    check_against_ddp(g, ddp_run())


def check_against_ddp(g, ddp):
    want = [t.detach().numpy() for t in list(make_model(0).parameters())
            + list(make_model(0).buffers())]
    check(len(keys(g[0], "init")) == len(want), "every parameter and buffer saved")
    apart = make_model(1)
    check(not torch.equal(next(apart.parameters()), next(make_model(0).parameters())),
          "the replicas are built apart")
    for r in range(WORLD):
        for i, w in enumerate(want):
            check(g[r][f"init{i}"].tobytes() == w.tobytes(),
                  f"gradsync rank {r}: state tensor {i} after wrap is rank 0's, bit for bit")
            check(ddp[r][f"init{i}"].tobytes() == w.tobytes(),
                  f"ddp rank {r}: state tensor {i} after wrap is rank 0's")
    # The buffers every forward starts from: the same on every rank.
    for r in range(WORLD):
        bad = same(g[r], g[0], "fwd")
        check(bad is None, f"gradsync rank {r}: the buffers of {bad} differ from rank 0's")
        bad = same(g[r], ddp[r], "fwd")
        check(bad is None, f"gradsync rank {r}: the buffers of {bad} differ from DDP's")
        bad = same(g[r], ddp[r], "p")
        check(bad is None, f"gradsync rank {r}: final parameter {bad} differs from DDP's "
              "on the fp32 wire")
    print(f"  {len(want)} state tensors equal after wrap; {STEPS} forwards' buffers and "
          "the final parameters equal DDP's bit for bit (fp32 wire)")


def test_without_broadcast_buffers_they_differ():
    g = gradsync_run("fp32", "--no-buffers")
    check(same(g[0], g[1], "init") is None, "the wrap's broadcast still makes them equal")
    bad = same(g[1], g[0], "fwd")
    check(bad is not None and bad != "fwd1_0",
          "without broadcast_buffers the ranks' BatchNorm statistics drift apart after "
          f"the first forward (first difference: {bad})")
    print(f"  without broadcast_buffers the buffers differ from {bad} on")


def test_fp16_wire_within_rounding_of_ddp():
    g = gradsync_run("fp16")
    ddp = ddp_run()
    for r in range(WORLD):
        check(same(g[r], g[0], "fwd") is None, f"rank {r}: buffers equal rank 0's")
        d = max(float(np.max(np.abs(g[r][k] - ddp[r][k]))) for k in keys(g[r], "p"))
        # Per step one fp16 rounding (2^-11) of gradients below 10, through
        # SGD with momentum 0.9: lr / (1 - m) * 2^-11 * 10 per step.
        bound = STEPS * 0.05 / 0.1 * 2 ** -11 * 10
        check(d <= bound, f"rank {r}: {d:.3g} from DDP's parameters, bound {bound:.3g}")
        print(f"  fp16 wire, rank {r}: {d:.3g} from DDP (bound {bound:.3g})")


def test_state_registered_again_on_reconnect():
    set_job(1)
    d = Daemon([])
    try:
        with gradsync.Client(d.socket) as c:
            a = c.register_state([("w", 4096, "float32"), ("n", 8, "int64")])
            a[0][:] = np.arange(4096) % 251
            a[1][:] = 7
            want = [x.copy() for x in a]
            check(c.broadcast_state(0).nbytes == 4104, "a broadcast of one trainer's state")
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait(10)
            os.unlink(d.socket)
            d2 = Daemon([], tmp=d.dir)
            c.reconnect(timeout=10)
            r = c.broadcast_state(0, tensors=[1])
            check(r.nbytes == 8 and r.tensors_done == 1, f"after reconnect: {r}")
            check(all(x.tobytes() == w.tobytes() for x, w in zip(a, want)),
                  "the state's bytes are where they were")
            d2.stop()
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_state_registered_again_on_reconnect, test_replicas_start_equal_as_ddp,
         test_two_nodes_start_equal_as_ddp, test_without_broadcast_buffers_they_differ,
         test_fp16_wire_within_rounding_of_ddp])
